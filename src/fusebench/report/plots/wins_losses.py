"""The pair plot of wins and losses: per comparison at the smallest k, the queries the candidate got right and
the baseline wrong, and the reverse. A run's: the fusion against each model; a sweep's: every paired gain."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import finish_pairs, pair_title, smallest_k, subplots


def wins_losses(rows: list[dict], path: Path, title: str) -> Path | None:
    shown = smallest_k(rows)
    if not shown:
        return None
    title, rows = pair_title(title, rows, shown), shown
    y = np.arange(len(rows))
    fig, ax = subplots(figsize=(12, 0.5 * len(rows) + 1.5))
    ax.barh(y, [r["wins"] for r in rows], color="tab:green", label="won (candidate right, baseline wrong)")
    ax.barh(y, [-r["losses"] for r in rows], color="tab:red", label="lost (baseline right, candidate wrong)")
    return finish_pairs(fig, ax, y, rows, path, title, f"queries at R@{rows[0]['k']}", "lower right")


def draw(inputs, path: Path, params=None) -> Path | None:
    if inputs.scope == "run":
        return wins_losses(inputs.comparisons, path, "the fusion vs each model: wins and losses")
    return wins_losses(inputs.report.gains, path, "wins and losses across the sweep")


PLOT = register(Plot("wins_losses.png", ("run", "sweep"), draw, "queries won and lost by each candidate against its "
                     "baseline at the smallest k (at most the 60 rows with the largest absolute gain; the title says "
                     "when rows were left out: every row is in `gains.csv`)", order=30))
