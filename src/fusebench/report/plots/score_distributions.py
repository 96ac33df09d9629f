"""Each single model's top-list scores, raw and DBSF-rescaled per query."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench.evaluation.record import RunRecord
from fusebench.fusion.config import flat_settings
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import NUMERIC_MARGINS, TITLE_Y, drawn_once, run_title, save, subplots
from fusebench.stores.files import array_digest


def score_distributions(run_dir: Path, record: RunRecord, path: Path) -> Path | None:
    """Each single model's top-list scores, raw and DBSF-rescaled per query (what fusion adds up). The same
    for every job of a sweep over fusion settings: drawn once per process, copied for the jobs after."""
    singles = record.singles
    files = [run_dir / "topk" / f"{n}.t2i.npz" for n in singles]
    if not singles or not all(f.is_file() for f in files):
        return None
    ddof = flat_settings(record.fusion)["ddof"]  # the run's own (dbsf, zscore), else the default
    scores = {}
    for name, file in zip(singles, files):
        with np.load(file) as data:
            scores[name] = data["scores"]
    inputs = [run_title(record), ddof, *((name, array_digest(array)) for name, array in scores.items())]
    return drawn_once(inputs, path, lambda: _draw_scores(scores, ddof, record, path))


def _draw_scores(scores: dict[str, np.ndarray], ddof: int, record: RunRecord, path: Path) -> Path:
    fig, axes = subplots(1, 2, figsize=(10, 3.8))
    for name, stored in scores.items():
        values = stored.astype(np.float64)
        axes[0].hist(values.ravel(), bins=60, alpha=0.5, label=name, density=True, histtype="stepfilled")
        mean, sd = values.mean(axis=1, keepdims=True), values.std(axis=1, ddof=ddof, keepdims=True)
        rescaled = np.where(sd > 0, (values - (mean - 3 * sd)) / (6 * np.where(sd > 0, sd, 1)), 0.5)
        axes[1].hist(rescaled.ravel(), bins=60, alpha=0.5, label=name, density=True, histtype="stepfilled")
    axes[0].set_title("t2i top-list scores, raw cosine", y=TITLE_Y)
    axes[1].set_title("the same, DBSF-rescaled per query list", y=TITLE_Y)
    axes[1].legend(fontsize=8)
    fig.suptitle(run_title(record))
    return save(fig, path, NUMERIC_MARGINS)


def draw(inputs, path: Path, params=None) -> Path | None:
    return score_distributions(inputs.run_dir, inputs.record, path)


PLOT = register(Plot("score_distributions.png", ("run",), draw, "each model's t2i top-list scores, raw and "
                     "DBSF-rescaled per query", order=50))
