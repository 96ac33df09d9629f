"""The forest plot of paired gains: per comparison at the smallest k, the gain with its interval over queries
(and over images, when the rows have it). A run's: the fusion against each model; a sweep's: every paired gain."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench.evaluation.comparisons import level_label
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import finish_pairs, pair_title, smallest_k, subplots


def forest(rows: list[dict], path: Path, title: str) -> Path | None:
    shown = smallest_k(rows)
    if not shown:
        return None
    title, rows = pair_title(title, rows, shown), shown
    y = np.arange(len(rows))[::-1]
    fig, ax = subplots(figsize=(12, 0.45 * len(rows) + 1.5))
    gains = np.array([r["gain"] for r in rows])
    level = level_label(rows[0].get("level", 0.95))
    ax.errorbar(gains, y, xerr=[gains - [r["ci_low"] for r in rows], np.array([r["ci_high"] for r in rows]) - gains],
                fmt="o", capsize=3, label=f"{level} CI over queries")
    if all("cluster_ci_low" in r for r in rows):
        ax.errorbar(gains, y - 0.2, xerr=[gains - [r["cluster_ci_low"] for r in rows],
                                          np.array([r["cluster_ci_high"] for r in rows]) - gains],
                    fmt="none", ecolor="gray", capsize=2, label=f"{level} CI over images")
    return finish_pairs(fig, ax, y, rows, path, title, f"gain in R@{rows[0]['k']} (points)")


def draw(inputs, path: Path, params=None) -> Path | None:
    if inputs.scope == "run":
        return forest(inputs.comparisons, path, "paired gains of the fusion")
    return forest(inputs.report.gains, path, "paired gains across the sweep")


PLOT = register(Plot("paired_gains.png", ("run", "sweep"), draw, "forest plot of the paired gains at the smallest k, "
                     "with their intervals over queries (and over images)", order=40))
