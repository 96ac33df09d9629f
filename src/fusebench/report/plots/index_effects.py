"""The index-effects study's differences per run (``experiment=index_effects``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench.evaluation.comparisons import level_label
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import TITLE_Y, save, subplots
from fusebench.report.plots._index import SERIES, backend_label, error_bars


def index_effects_plot(effects, path: Path) -> Path | None:
    """Per run at the study's first k, the fused retriever through its backend minus three baselines (points with
    their intervals over images, side by side): the best single model searched exactly (the verdict's), the same
    fusion on exact lists, and the best single model through the same backend."""
    k = effects.ks[0]
    rows = [r for r in effects.rows if r["k"] == k and (r.get("vs_exact_best") is not None or r.get("gain") is not None)]
    if not rows:
        return None
    several = len({r["dataset"] for r in rows}) > 1
    x = np.arange(len(rows))
    fig, ax = subplots(figsize=(max(7.0, 1.3 * len(rows) + 2), 5.2))
    for j, (prefix, label, color, marker) in enumerate(SERIES):
        shown = [(i, r) for i, r in enumerate(rows) if r.get(prefix) is not None]
        if not shown:
            continue
        xs = np.array([i for i, _ in shown]) + (j - 1) * 0.22
        mine = [r for _, r in shown]
        ax.errorbar(xs, [r[prefix] for r in mine], yerr=error_bars(mine, prefix), fmt=marker, color=color, capsize=3,
                    ms=5, label=f"fused {label}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [backend_label(r, several) for r in rows], fontsize=7)
    ax.set_ylabel(f"t2i R@{k} difference (points, {level_label(effects.level)} interval over images)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_title(f"the fused retriever through each search backend, t2i R@{k}" + (" [SIMULATED]" if effects.simulated
                                                                               else "")
                 + "\n(ranks past an index's list count as missed)", fontsize=9, y=TITLE_Y)
    return save(fig, path)


def draw(inputs, path: Path, params=None) -> Path | None:
    effects = getattr(inputs.report, "index_effects", None)
    return None if effects is None else index_effects_plot(effects, path)


PLOT = register(Plot("index_effects.png", ("sweep",), draw, "with an approximate backend: per run, the fused "
                     "retriever through it minus three baselines, with intervals over images", order=130))
