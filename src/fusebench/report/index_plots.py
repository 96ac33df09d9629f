"""The index-effects plots of a sweep (:mod:`fusebench.report.index_effects`): the study's paired differences
with their intervals over images (fused through each backend minus the best single model searched exactly, minus
the same fusion on exact lists, minus the best single model through the same backend), the first also against
gallery size, and the fused recall against query time."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from fusebench.evaluation.comparisons import level_label
from fusebench.report.plots import TITLE_Y, _save, subplots

LABEL_WIDTH = 24  # a backend's label wraps at this many characters under its point


def _label(row: dict, several: bool) -> str:
    text = f"{row['dataset']}: {row['backend']}" if several else row["backend"]
    return "\n".join(textwrap.wrap(text, LABEL_WIDTH)) + f"\n({row['fusion']})"


SERIES = (("vs_exact_best", "minus the best single model searched exactly", "tab:blue", "o"),
          ("vs_exact_fusion", "minus the same fusion on exact lists", "tab:red", "s"),
          ("gain", "minus the best single model through the same backend", "gray", "^"))


def _error(rows: list[dict], prefix: str) -> np.ndarray:
    """The interval over images as error bars (a percentile interval need not hold its point: draw what it spans)."""
    values = np.array([r[prefix] for r in rows], dtype=float)
    low = np.array([r[f"{prefix}_cluster_ci_low"] for r in rows], dtype=float)
    high = np.array([r[f"{prefix}_cluster_ci_high"] for r in rows], dtype=float)
    return np.maximum(0, [values - low, high - values])


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
        ax.errorbar(xs, [r[prefix] for r in mine], yerr=_error(mine, prefix), fmt=marker, color=color, capsize=3,
                    ms=5, label=f"fused {label}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [_label(r, several) for r in rows], fontsize=7)
    ax.set_ylabel(f"t2i R@{k} difference (points, {level_label(effects.level)} interval over images)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_title(f"the fused retriever through each search backend, t2i R@{k}" + (" [SIMULATED]" if effects.simulated
                                                                               else "")
                 + "\n(ranks past an index's list count as missed)", fontsize=9, y=TITLE_Y)
    return _save(fig, path)


def _by_backend(effects) -> dict[str, list[dict]]:
    """The rows at the study's first k in the report's series (one per backend, fusion and models of a test split:
    ``index_effects.series``), under the labels its sentences use."""
    from fusebench.report.index_effects import series

    k = effects.ks[0]
    return series([r for r in effects.rows if r["k"] == k])


def _finish(fig, ax, path: Path, effects, xlabel: str, ylabel: str, title: str) -> Path:
    """The two gallery-size plots' common frame: log x, labels, grid, legend, the title (flagged when simulated)."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title + (" [SIMULATED]" if effects.simulated else ""), fontsize=9, y=TITLE_Y)
    return _save(fig, path)


def recall_time_plot(effects, path: Path) -> Path | None:
    """ann-benchmarks' picture with fusion on it: the fused retriever's t2i R@k (first k) against its query time
    per backend (log x), one marker per gallery size, labelled; exact search's time is its streamed gallery
    search's (absent when its lists came from the store)."""
    k = effects.ks[0]
    series, exact = {}, set()
    for backend, rows in _by_backend(effects).items():
        if rows[0]["backend"] == "exact":
            exact.add(backend)
        points = [(r["exact_query_ms"] if r["backend"] == "exact" else r["query_ms"], r["fused_recall"],
                   r["distractors"]) for r in rows]
        points = [p for p in points if p[0] is not None and p[1] is not None and p[0] > 0]
        if points:
            series[backend] = points
    if not series:
        return None
    fig, ax = subplots(figsize=(7.5, 5.2))
    for i, (backend, points) in enumerate(series.items()):
        ms, recall, _ = zip(*points)
        ax.plot(ms, recall, marker="o", lw=1, label="\n".join(textwrap.wrap(backend, 40)),
                color="black" if backend in exact else f"C{i}")
        for x, y, n in points:
            ax.annotate(f"{n:,}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    return _finish(fig, ax, path, effects, "query time per t2i query, summed over the fused models (ms, log)",
                   f"fused t2i R@{k} (percent)", "fused recall against query time per backend (points: distractors)")


def verdict_plot(effects, path: Path) -> Path | None:
    """Per backend, fused through it minus the best single model searched exactly (the verdict's difference, with
    its interval over images) against the gallery's distractors (log x; the test split alone drawn at the axis'
    left end), and 0: above it, fusing through the backend beats not fusing."""
    series = {b: [r for r in rows if r.get("vs_exact_best") is not None] for b, rows in _by_backend(effects).items()}
    series = {b: rows for b, rows in series.items() if rows}
    if not series:
        return None
    sizes = sorted({r["distractors"] for rows in series.values() for r in rows})
    floor = min([n for n in sizes if n > 0], default=1) / 10
    fig, ax = subplots(figsize=(7.5, 5.2))
    for i, (backend, rows) in enumerate(series.items()):
        shift = 1.0 + 0.04 * (i - (len(series) - 1) / 2)  # backends side by side at one size (log x)
        x = [max(r["distractors"], floor) * shift for r in rows]
        ax.errorbar(x, [r["vs_exact_best"] for r in rows], yerr=_error(rows, "vs_exact_best"), marker="o", lw=1,
                    capsize=3, color="black" if rows[0]["backend"] == "exact" else f"C{i}",
                    label="\n".join(textwrap.wrap(backend, 40)))
    ax.axhline(0, color="black", linestyle="--", lw=1, label="the best single model searched exactly")
    return _finish(fig, ax, path, effects, "distractors in the gallery (log; the test split alone drawn at the left)",
                   f"fused t2i R@{effects.ks[0]} minus the best single model searched exactly (points)",
                   "does fusing through each backend beat the best single model searched exactly?\n"
                   f"({level_label(effects.level)} interval over images)")
