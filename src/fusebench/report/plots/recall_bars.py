"""Each retriever's recall@k (every k of the run, both directions) with its Wilson interval."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench import DIRECTIONS
from fusebench.evaluation.comparisons import level_label
from fusebench.evaluation.record import RunRecord
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import NUMERIC_MARGINS, TITLE_Y, run_title, save, subplots, wilson


def recall_bars(record: RunRecord, path: Path) -> Path:
    ks, level = record.ks, record.level
    names = list(record.retrievers)
    fig, axes = subplots(1, 2, figsize=(5 + 1.6 * len(names), 4.2), sharey=True)
    width = 0.8 / len(names)
    for ax, direction in zip(axes, DIRECTIONS):
        for i, name in enumerate(names):
            entry = record.retrievers[name].direction(direction)
            values = [entry.at(k) for k in ks]
            lows, highs = zip(*(wilson(v, entry.n_queries, level) for v in values))
            x = np.arange(len(ks)) + i * width
            ax.bar(x, values, width, label=name, yerr=[np.subtract(values, lows), np.subtract(highs, values)], capsize=3)
            for xi, v, hi in zip(x, values, highs):
                ax.text(xi, hi + 1, f"{v:.1f}", ha="center", fontsize=7)
        ax.set_xticks(np.arange(len(ks)) + width * (len(names) - 1) / 2, [f"R@{k}" for k in ks])
        ax.set_title(f"{direction} recall ({level_label(level)} Wilson interval)", y=TITLE_Y)
        ax.set_ylim(0, 108)
    axes[0].set_ylabel("recall (%)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(run_title(record))
    return save(fig, path, NUMERIC_MARGINS)


def draw(inputs, path: Path, params=None) -> Path:
    return recall_bars(inputs.record, path)


PLOT = register(Plot("recall_bars.png", ("run",), draw, "recall@k of each retriever, both directions, with 95% Wilson "
                     "intervals", order=10))
