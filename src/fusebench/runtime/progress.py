"""Progress bars (tqdm) that stay quiet in logs: on a terminal they refresh ten times a second; written to a
file or a pipe (a sweep's job log, a cluster's stdout), at most every ``LOG_INTERVAL`` seconds, because each
refresh is a line's worth of text that a log keeps (a 2 s job wrote hundreds of them)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm.auto import tqdm

Progress = Callable[[str, int], Callable[[int], None]]  # (description, total) -> update(n): a bar's factory
LOG_INTERVAL = 30.0  # seconds between refreshes when the bar does not go to a terminal


def _to_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def bar(*args, **kwargs) -> tqdm:
    """``tqdm(*args, **kwargs)``, refreshed at most every ``LOG_INTERVAL`` seconds unless it writes to a terminal."""
    from tqdm.auto import tqdm  # tqdm.auto brings asyncio: loaded with the first bar, not at a command's start

    if not _to_terminal(kwargs.get("file") or sys.stderr):
        kwargs.setdefault("mininterval", LOG_INTERVAL)
    return tqdm(*args, **kwargs)


def enabled() -> bool:
    """Whether progress is shown: tqdm's own switch, ``TQDM_DISABLE`` (any value but empty turns every bar off, as
    tqdm reads it), also turns off the sweep's per-job lines."""
    return not os.environ.get("TQDM_DISABLE")


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a wait: 42s, 3m05s, 1h02m."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def sweep_line(job: int, total: int, overrides: list[str], elapsed: float, finished: list[float]) -> str:
    """The line a sweep prints as its job ``job`` (1-based) of ``total`` starts: the job's ``overrides``, the
    sweep's ``elapsed`` seconds, and the time left for the sweep estimated from the ``finished`` jobs' seconds
    (their mean times the jobs not yet finished, this one included; unknown until one has finished)."""
    left = (f"about {duration(sum(finished) / len(finished) * (total - job + 1))} left for the sweep" if finished
            else "time left for the sweep unknown until a job finishes")
    return f"job {job}/{total} ({' '.join(overrides) or 'no overrides'}), {duration(elapsed)} elapsed, {left}"
