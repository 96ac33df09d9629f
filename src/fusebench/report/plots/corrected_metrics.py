"""The metrics with false negatives corrected (ECCV Caption, CxC: ``eval.positives``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench import DIRECTIONS
from fusebench.evaluation.record import RunRecord
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import TITLE_Y, run_title, save, subplots


def corrected_metrics(record: RunRecord, path: Path) -> Path | None:
    """A panel per extra-positive set and direction (ECCV Caption, CxC): each retriever's metrics, with the
    fused-vs-single gain on each (eval.positives)."""
    if not record.positives:
        return None
    names = list(record.retrievers)
    panels = [(s, d) for s in record.positives for d in DIRECTIONS]
    fig, axes = subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    width = 0.8 / len(names)
    for ax, (positive_set, direction) in zip(axes[0], panels):
        metrics = [m for m in record.retrievers[names[0]].positives.get(positive_set, {}).get(direction, {})
                   if m != "n_queries"]
        for i, name in enumerate(names):
            values = [record.retrievers[name].positives.get(positive_set, {}).get(direction, {}).get(m) or 0.0
                      for m in metrics]
            x = np.arange(len(metrics)) + i * width
            ax.bar(x, values, width, label=name)
            for xi, v in zip(x, values):
                ax.text(xi, v + 1, f"{v:.1f}", ha="center", fontsize=7)
        ax.set_xticks(np.arange(len(metrics)) + width * (len(names) - 1) / 2, metrics)
        n = getattr(record.positives[positive_set], f"{direction}_queries")
        ax.set_title(f"{positive_set} {direction} ({n} queries)", y=TITLE_Y)
        ax.set_ylim(0, 108)
    axes[0][0].set_ylabel("percent (false negatives corrected)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(run_title(record))
    return save(fig, path)


def draw(inputs, path: Path, params=None) -> Path | None:
    return corrected_metrics(inputs.record, path)


PLOT = register(Plot("corrected_metrics.png", ("run",), draw, "with `eval.positives`: each retriever's metrics "
                     "with false negatives corrected, per extra-positive set and direction", order=60))
