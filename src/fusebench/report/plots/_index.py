"""What the index-effects plots of a sweep share (:mod:`fusebench.report.index_effects`; the plots:
``index_effects.py``, ``index_recall_time.py``, ``index_verdict.py``): a backend's label, the three differences'
series and their error bars, the rows per backend, the gallery-size plots' frame."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from fusebench.report.index_effects import series
from fusebench.report.plots._common import TITLE_Y, save

LABEL_WIDTH = 24  # a backend's label wraps at this many characters under its point


def backend_label(row: dict, several: bool) -> str:
    text = f"{row['dataset']}: {row['backend']}" if several else row["backend"]
    return "\n".join(textwrap.wrap(text, LABEL_WIDTH)) + f"\n({row['fusion']})"


SERIES = (("vs_exact_best", "minus the best single model searched exactly", "tab:blue", "o"),
          ("vs_exact_fusion", "minus the same fusion on exact lists", "tab:red", "s"),
          ("gain", "minus the best single model through the same backend", "gray", "^"))


def error_bars(rows: list[dict], prefix: str) -> np.ndarray:
    """The interval over images as error bars (a percentile interval need not hold its point: draw what it spans)."""
    values = np.array([r[prefix] for r in rows], dtype=float)
    low = np.array([r[f"{prefix}_cluster_ci_low"] for r in rows], dtype=float)
    high = np.array([r[f"{prefix}_cluster_ci_high"] for r in rows], dtype=float)
    return np.maximum(0, [values - low, high - values])


def by_backend(effects) -> dict[str, list[dict]]:
    """The rows at the study's first k in the report's series (one per backend, fusion and models of a test split:
    ``index_effects.series``), under the labels its sentences use."""
    k = effects.ks[0]
    return series([r for r in effects.rows if r["k"] == k])


def finish(fig, ax, path: Path, effects, xlabel: str, ylabel: str, title: str) -> Path:
    """The two gallery-size plots' common frame: log x, labels, grid, legend, the title (flagged when simulated)."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title + (" [SIMULATED]" if effects.simulated else ""), fontsize=9, y=TITLE_Y)
    return save(fig, path)


