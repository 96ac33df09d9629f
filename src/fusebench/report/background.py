"""A sweep job's run plots, drawn on a second thread while the next job of the sweep runs.

With Hydra's basic launcher the jobs of a sweep run one after another in one process, and each job's five
plots (~0.7 s of matplotlib on 2 cores) used to hold up the next job. A job whose logger needs no image files
(``logger=none``; W&B logs the PNGs with the run, so its jobs draw them first) hands them to one background
thread instead: matplotlib's text and PNG work overlaps the next job's matmuls, file reads and numba passes,
and its Python parts take turns with that job's. The figures use no pyplot state and matplotlib keeps one
font object per thread, so the two threads share nothing. Every plot is drawn before the sweep report is
written (``finish``) and before the process exits; Ctrl-C drops the plots not yet started (``cancel``).
"""

from __future__ import annotations

import atexit
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from fusebench.evaluation.record import RunRecord

log = logging.getLogger(__name__)
_POOL: ThreadPoolExecutor | None = None
_PENDING: list[tuple[Path, Future]] = []


def draw_later(run_dir: str | Path, record: RunRecord) -> None:
    """Queue ``run_plots(run_dir, record)`` on the plot thread (started on first use)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(1, thread_name_prefix="fusebench-plots")
        atexit.register(finish)  # after the thread has drained its queue: report what failed
    _PENDING.append((Path(run_dir), _POOL.submit(_draw, Path(run_dir), record)))


def _draw(run_dir: Path, record: RunRecord) -> list[Path]:
    from fusebench.report.plots import run_plots

    return run_plots(run_dir, record)


def finish() -> list[Path]:
    """Wait for every queued plot; the paths drawn. A run whose plots failed gets a warning naming its dir
    (plots are a view of the outputs, never a reason to fail)."""
    drawn = []
    while _PENDING:
        run_dir, future = _PENDING.pop(0)
        try:
            drawn += future.result()
        except Exception as err:  # noqa: BLE001 - see above
            log.warning("could not draw plots for %s: %s", run_dir, err)
    return drawn


def cancel() -> None:
    """Drop the queued plots that have not started (the one being drawn finishes)."""
    for _, future in _PENDING:
        future.cancel()
    _PENDING.clear()
