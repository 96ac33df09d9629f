"""The index-effects plot of a sweep (:mod:`fusebench.report.index_effects`): each search backend's fused t2i gain
over its best single model, with its interval, exact first, against the exact run's gain."""

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


def index_effects_plot(effects, path: Path) -> Path | None:
    """The gain at the study's first k per backend (point and its interval over queries), the gain of the same
    fusion over exact lists beside it (x), and a dashed line per dataset at the exact run's gain."""
    k = effects.ks[0]
    rows = [r for r in effects.rows if r["k"] == k and r["gain"] is not None]
    if not rows:
        return None
    several = len({r["dataset"] for r in rows}) > 1
    x = np.arange(len(rows))
    gains = np.array([r["gain"] for r in rows])
    # a percentile interval need not hold its point estimate (a few discordant queries): draw what it spans
    err = np.maximum(0, [gains - [r["ci_low"] for r in rows], np.array([r["ci_high"] for r in rows]) - gains])
    fig, ax = subplots(figsize=(max(7.0, 1.15 * len(rows) + 2), 5.2))
    exact = [r["backend"] == "exact" for r in rows]
    ax.errorbar(x, gains, yerr=err, fmt="none", ecolor="gray", capsize=4)
    ax.scatter(x, gains, c=["black" if e else "tab:blue" for e in exact], zorder=3,
               label=f"the backend's gain ({level_label(effects.level)} CI over queries)")
    same = [(i, r["exact_gain"]) for i, r in enumerate(rows) if r["exact_gain"] is not None and r["backend"] != "exact"]
    if same:
        ax.scatter([i for i, _ in same], [g for _, g in same], marker="x", color="tab:red", zorder=3,
                   label="the same fusion on exact lists")
    for i, (dataset, gain) in enumerate(effects.exact_gains.items()):
        ax.axhline(gain, color="black", linestyle="--", lw=1,
                   label=f"exact ({dataset})" if several else "exact gain", alpha=0.8 - 0.2 * (i % 3))
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(x, [_label(r, several) for r in rows], fontsize=7)
    ax.set_ylabel(f"t2i R@{k} minus the best single model's (points)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_title(f"fusion gain under each search backend, t2i R@{k}" + (" [SIMULATED]" if effects.simulated else "")
                 + "\n(ranks past an index's list count as missed)", fontsize=9, y=TITLE_Y)
    return _save(fig, path)


def _by_backend(effects) -> dict[str, list[dict]]:
    k = effects.ks[0]
    rows = [r for r in effects.rows if r["k"] == k]
    return {b: sorted((r for r in rows if r["backend"] == b), key=lambda r: r["distractors"])
            for b in dict.fromkeys(r["backend"] for r in rows)}


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
    series = {}
    for backend, rows in _by_backend(effects).items():
        points = [(r["exact_query_ms"] if backend == "exact" else r["query_ms"], r["fused_recall"], r["distractors"])
                  for r in rows]
        points = [p for p in points if p[0] is not None and p[1] is not None and p[0] > 0]
        if points:
            series[backend] = points
    if not series:
        return None
    fig, ax = subplots(figsize=(7.5, 5.2))
    for i, (backend, points) in enumerate(series.items()):
        ms, recall, _ = zip(*points)
        ax.plot(ms, recall, marker="o", lw=1, label="\n".join(textwrap.wrap(backend, 40)),
                color="black" if backend == "exact" else f"C{i}")
        for x, y, n in points:
            ax.annotate(f"{n:,}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    return _finish(fig, ax, path, effects, "query time per t2i query, summed over the fused models (ms, log)",
                   f"fused t2i R@{k} (percent)", "fused recall against query time per backend (points: distractors)")


def gain_kept_plot(effects, path: Path) -> Path | None:
    """The share of the exact fusion gain each backend keeps, against the gallery's distractors (log x; 0 drawn
    at the axis' left end)."""
    series = {b: [(r["distractors"], 100 * r["gain_kept"]) for r in rows if r["gain_kept"] is not None]
              for b, rows in _by_backend(effects).items() if b != "exact"}
    series = {b: pts for b, pts in series.items() if pts}
    if not series:
        return None
    sizes = sorted({n for pts in series.values() for n, _ in pts})
    floor = min([n for n in sizes if n > 0], default=1) / 10
    fig, ax = subplots(figsize=(7.5, 5.2))
    for i, (backend, points) in enumerate(series.items()):
        x, y = zip(*[(max(n, floor), kept) for n, kept in points])
        ax.plot(x, y, marker="o", lw=1, color=f"C{i}", label="\n".join(textwrap.wrap(backend, 40)))
    ax.axhline(100, color="black", linestyle="--", lw=1, label="the exact gain")
    return _finish(fig, ax, path, effects, "distractors in the gallery (log; the test split alone drawn at the left)",
                   f"gain kept, t2i R@{effects.ks[0]} (percent of exact)",
                   "how much of the fusion gain each backend keeps as the gallery grows")
