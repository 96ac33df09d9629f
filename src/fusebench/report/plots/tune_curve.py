"""Tune mode's grid: each setting's criterion on the tuning split."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench import FUSED
from fusebench.evaluation.record import RunRecord
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import TITLE_Y, run_title, save, subplots


def tune_curve(record: RunRecord, path: Path) -> Path | None:
    """Tune mode: each grid setting's criterion on the tuning split, the single models' as lines, the chosen one
    marked (what the test evaluation then used)."""
    t = record.tune
    if not t or not t.curve:
        return None
    curve = t.curve
    fig, ax = subplots(figsize=(max(7, 0.45 * len(curve) + 3), 4.4))
    x = np.arange(len(curve))
    ax.plot(x, [point.value for point in curve], marker="o", label=FUSED)
    chosen = t.chosen_index
    ax.scatter([chosen], [curve[chosen].value], s=120, facecolors="none", edgecolors="red", label="chosen", zorder=3)
    for i, (name, value) in enumerate(t.singles.items(), start=1):
        ax.axhline(value, linestyle="--", linewidth=1, color=f"C{i}", label=name)
    ax.set_xticks(x, [point.describe() or "as configured" for point in curve], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"{t.criterion} on the tuning split (%)")
    ax.set_title(f"tuning split: {t.split}, {t.n_images} images (the chosen setting then runs once on test)",
                 fontsize=9, y=TITLE_Y)
    ax.legend(fontsize=8)
    fig.suptitle(run_title(record))
    return save(fig, path)


def draw(inputs, path: Path, params=None) -> Path | None:
    return tune_curve(inputs.record, path)


PLOT = register(Plot("tune_curve.png", ("run",), draw, "with `tune`: each grid setting's criterion on the tuning "
                     "split, the single models' as lines, the chosen setting marked", order=70))
