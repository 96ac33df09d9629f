"""Recall against k = 1..max_k from the saved ranks, per retriever and direction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusebench import DIRECTIONS
from fusebench.evaluation.record import RunRecord
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import NUMERIC_MARGINS, TITLE_Y, run_title, save, subplots
from fusebench.runtime import checks


@dataclass
class RecallAtKParams:
    max_k: int = 50  # the curve's last k

    def __post_init__(self):
        self.max_k = checks.integer(self.max_k, "plots.recall_at_k.max_k", 1)


def recall_curves(run_dir: Path, record: RunRecord, path: Path, max_k: int = 50) -> Path:
    fig, axes = subplots(1, 2, figsize=(10, 4), sharey=True)
    ks = np.arange(1, max_k + 1)
    for ax, direction in zip(axes, DIRECTIONS):
        for name in record.retrievers:
            ranks = np.load(run_dir / "ranks" / f"{name}.{direction}.npy")
            found = np.where(ranks >= 1, ranks, np.inf)
            ax.plot(ks, [100 * np.mean(found <= k) for k in ks], label=name)
        ax.set_xlabel("k")
        ax.set_title(f"{direction}: recall@k, k = 1..{max_k}", y=TITLE_Y)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("recall (%)")
    axes[1].legend(fontsize=8)
    fig.suptitle(run_title(record))
    return save(fig, path, NUMERIC_MARGINS)


def draw(inputs, path: Path, params: RecallAtKParams) -> Path:
    return recall_curves(inputs.run_dir, inputs.record, path, params.max_k)


PLOT = register(Plot("recall_at_k.png", ("run",), draw, "recall against k = 1..50 from the saved ranks",
                     params=RecallAtKParams, order=20))
