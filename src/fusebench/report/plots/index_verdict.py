"""The index verdict against gallery size (``experiment=index_effects``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fusebench.evaluation.comparisons import level_label
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import subplots
from fusebench.report.plots._index import by_backend, error_bars, finish


def verdict_plot(effects, path: Path) -> Path | None:
    """Per backend, fused through it minus the best single model searched exactly (the verdict's difference, with
    its interval over images) against the gallery's distractors (log x; the test split alone drawn at the axis'
    left end), and 0: above it, fusing through the backend beats not fusing."""
    series = {b: [r for r in rows if r.get("vs_exact_best") is not None] for b, rows in by_backend(effects).items()}
    series = {b: rows for b, rows in series.items() if rows}
    if not series:
        return None
    sizes = sorted({r["distractors"] for rows in series.values() for r in rows})
    floor = min([n for n in sizes if n > 0], default=1) / 10
    fig, ax = subplots(figsize=(7.5, 5.2))
    for i, (backend, rows) in enumerate(series.items()):
        shift = 1.0 + 0.04 * (i - (len(series) - 1) / 2)  # backends side by side at one size (log x)
        x = [max(r["distractors"], floor) * shift for r in rows]
        ax.errorbar(x, [r["vs_exact_best"] for r in rows], yerr=error_bars(rows, "vs_exact_best"), marker="o", lw=1,
                    capsize=3, color="black" if rows[0]["backend"] == "exact" else f"C{i}",
                    label="\n".join(textwrap.wrap(backend, 40)))
    ax.axhline(0, color="black", linestyle="--", lw=1, label="the best single model searched exactly")
    return finish(fig, ax, path, effects, "distractors in the gallery (log; the test split alone drawn at the left)",
                   f"fused t2i R@{effects.ks[0]} minus the best single model searched exactly (points)",
                   "does fusing through each backend beat the best single model searched exactly?\n"
                   f"({level_label(effects.level)} interval over images)")


def draw(inputs, path: Path, params=None) -> Path | None:
    effects = getattr(inputs.report, "index_effects", None)
    return None if effects is None else verdict_plot(effects, path)


PLOT = register(Plot("index_verdict.png", ("sweep",), draw, "with an approximate backend: fused through "
                     "it minus the best single model searched exactly, against distractors", order=150))
