"""The index-effects study's recall against query time per backend (``experiment=index_effects``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import subplots
from fusebench.report.plots._index import by_backend, finish


def recall_time_plot(effects, path: Path) -> Path | None:
    """ann-benchmarks' picture with fusion on it: the fused retriever's t2i R@k (first k) against its query time
    per backend (log x), one marker per gallery size, labelled; exact search's time is its streamed gallery
    search's (absent when its lists came from the store)."""
    k = effects.ks[0]
    series, exact = {}, set()
    for backend, rows in by_backend(effects).items():
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
    return finish(fig, ax, path, effects, "query time per t2i query, summed over the fused models (ms, log)",
                   f"fused t2i R@{k} (percent)", "fused recall against query time per backend (points: distractors)")


def draw(inputs, path: Path, params=None) -> Path | None:
    effects = getattr(inputs.report, "index_effects", None)
    return None if effects is None else recall_time_plot(effects, path)


PLOT = register(Plot("index_recall_time.png", ("sweep",), draw, "with an approximate backend: the fused "
                     "recall against query time per backend, one point per gallery size", order=140))
