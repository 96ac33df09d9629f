"""What a run writes into its dir, by name: the one list the run dir's checks (``app.rundir``), its outputs
(``report.outputs``) and the sweep report's scan (``report.runs``) share; and how an error.txt fusebench wrote is
told from anyone else's file."""

from __future__ import annotations

from pathlib import Path

OUTPUTS = ("metrics.json", "ranks", "topk", "plots", "error.txt")  # what a run writes into its dir
# the PNGs a run's plots/ holds (fusebench.report.plots.run_plots)
PLOTS = frozenset({"recall_bars.png", "recall_at_k.png", "wins_losses.png", "paired_gains.png",
                   "score_distributions.png", "corrected_metrics.png", "tune_curve.png"})
# the first bytes of an error.txt fusebench writes: a bug's traceback, or a user's mistake in one line
ERROR_FILE_STARTS = (b"Traceback (most recent call last):", b"fusebench: error: ")


def is_error_file(path: Path) -> bool:
    """Whether ``path`` is an error.txt fusebench wrote (a failed sweep job's traceback, or the one line
    ``fusebench: error: ...`` of a user's mistake)."""
    with Path(path).open("rb") as fh:
        start = fh.read(max(len(s) for s in ERROR_FILE_STARTS))
    return start.startswith(ERROR_FILE_STARTS)


def error_text(message: str | None, trace: str) -> str:
    """What a failed sweep job's error.txt holds: the one-line ``message`` of a user's mistake, else the
    traceback ``trace`` (a bug)."""
    return f"fusebench: error: {message}\n" if message else trace
