"""What the plots share: figures without pyplot (``subplots``), the one way a PNG is written (``save``), a plot
drawn once per process and copied after (``drawn_once``), Wilson intervals, the pair plots' rows and labels, a
run's title. matplotlib is imported on first draw (``load_matplotlib``), never at import: the CLI scans the plot
modules (``runtime.plugins``) before any job."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fusebench.evaluation.record import RunRecord
from fusebench.runtime import state
from fusebench.stores.files import atomic_save, file_identity

DPI = 100
# Axes titles sit at the top of their axes (1.0, as matplotlib's automatic placement leaves them when nothing is
# drawn above the axes: true of every plot here). Set explicitly, matplotlib skips the automatic placement,
# which measures every y tick label's box at each draw (~15% of a run's plot time, most of a pair plot's).
TITLE_Y = 1.0
NUMERIC_MARGINS = {"left": 0.07, "right": 0.98, "bottom": 0.13, "top": 0.84, "wspace": 0.12}  # two panels


def load_matplotlib():
    """matplotlib's Figure and its Agg canvas (files only, no display), imported on first use. Figures are made
    without pyplot (no global figure list), so plots may be drawn on any thread."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return Figure, FigureCanvasAgg


def subplots(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] | None = None, **kwargs):
    """``plt.subplots`` without pyplot: a figure on its own Agg canvas, and its axes."""
    figure_type, canvas_type = load_matplotlib()
    fig = figure_type(figsize=figsize)
    canvas_type(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def drawn_once(inputs: list, path: Path, draw: Callable[[], Path]) -> Path:
    """``draw()``, which writes ``path``; or, when this process already drew a plot from the same ``inputs``
    (everything the figure shows, digested) and that PNG is still as it was written, a copy of it: the same
    bytes without matplotlib (~0.2 s a plot, on the thread that draws a sweep's plots). What was drawn is the
    process state's (``runtime.state``)."""
    drawn, key = state.current().drawn, hashlib.sha256(repr(inputs).encode()).hexdigest()
    earlier = drawn.get(key)
    if earlier is not None:
        source, identity = earlier
        try:
            if file_identity(source) == identity:
                atomic_save(path, lambda tmp: shutil.copyfile(source, tmp))
                return path
        except OSError:  # gone or changed since: draw it
            pass
    draw()
    drawn[key] = (path, file_identity(path))
    return path


def wilson(p_percent: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson interval (coverage ``level``) of a recall (percent) over n queries, in percent."""
    if not n:
        return 0.0, 0.0
    from scipy.special import ndtri

    z = float(ndtri(0.5 + level / 2))
    p = p_percent / 100
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # the interval holds p (and lies in [0, 100]); rounding put its end a hair inside p at p = 1 (R@k = 100%),
    # which made the recall plot's error bar negative and lost every plot of the run
    return float(min(100 * (centre - half), p_percent)), float(max(100 * (centre + half), p_percent))


MAX_PAIR_ROWS = 60  # a pair plot taller than this is unreadable (and slow); every row stays in gains.csv


def smallest_k(rows: list[dict]) -> list[dict]:
    """The comparison rows at the smallest k (R@1 in the default setup), at most ``MAX_PAIR_ROWS`` of them
    (the largest gains in absolute value, in their original order): what the pair plots show."""
    rows = [r for r in rows if r["k"] == min(x["k"] for x in rows)] if rows else []
    if len(rows) > MAX_PAIR_ROWS:
        keep = set(sorted(range(len(rows)), key=lambda i: -abs(rows[i]["gain"]))[:MAX_PAIR_ROWS])
        rows = [r for i, r in enumerate(rows) if i in keep]
    return rows


def pair_title(title: str, rows: list[dict], shown: list[dict]) -> str:
    at_k = [r for r in rows if r["k"] == shown[0]["k"]]
    return title if len(shown) == len(at_k) else f"{title} (the {len(shown)} largest |gain| of {len(at_k)}; all in gains.csv)"


def against_size(rows: list[dict], key: str, value: str, low: str, high: str, ylabel: str, title: str,
                  simulated: bool, path: Path) -> Path | None:
    """One line per ``key`` (its rows' ``value`` with the interval ``low``..``high``) against gallery images, on
    a log x axis ticked at the sizes measured (the distractor-scaling plots)."""
    rows = [r for r in rows if r[value] is not None]
    if not rows:
        return None
    fig, ax = subplots(figsize=(9, 5.2))
    for label in dict.fromkeys(r[key] for r in rows):
        mine = [r for r in rows if r[key] == label]
        y = np.array([r[value] for r in mine])
        # a percentile interval need not hold its point estimate (a few discordant queries): draw what it spans
        err = np.maximum(0, [y - [r[low] for r in mine], np.array([r[high] for r in mine]) - y])
        ax.errorbar([r["gallery images"] for r in mine], y, yerr=err, marker="o", capsize=3, label=clip(label, 70))
    sizes = sorted({r["gallery images"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k" if n >= 1e3 else str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("gallery images (test split + distractors; log scale)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title + (" [SIMULATED]" if simulated else ""), y=TITLE_Y)
    return save(fig, path)


def run_title(record: RunRecord) -> str:
    d = record.dataset
    flag = " [SIMULATED]" if d.simulated else (" [NON-STANDARD]" if d.nonstandard else "")
    return f"{d.name}: {d.n_images} images, {d.n_captions} captions{flag}"


def pair_margins(fig, labels: list[str]) -> dict:
    """Fixed margins for a figure whose y labels are pair labels (7 pt), from their longest line at a generous
    0.6 em per character (lines are clipped by ``pair_label`` to about 70), so no text needs measuring:
    tight_layout draws the whole figure once more just to measure it (half the time of a sweep's pair plots)."""
    width, height = fig.get_size_inches()
    longest = max(len(line) for label in labels for line in label.split("\n"))
    left = 0.3 + longest * 7 * 0.6 / 72
    return {"left": left / width, "right": 1 - 0.2 / width, "bottom": 0.55 / height, "top": 1 - 0.45 / height}


def finish_pairs(fig, ax, y, rows: list[dict], path: Path, title: str, xlabel: str, legend_loc: str | None = None
                 ) -> Path:
    """A pair plot's frame, drawn alike for each: the zero line, one row label per pair, the axis, legend and title,
    saved with margins that fit the labels."""
    ax.axvline(0, color="black", lw=0.8)
    labels = [pair_label(r) for r in rows]
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, **({"loc": legend_loc} if legend_loc else {}))
    ax.set_title(title, y=TITLE_Y)
    return save(fig, path, pair_margins(fig, labels))


def pair_label(row: dict) -> str:
    factor = f"{clip(row['factor'], 20)}: " if row.get("factor") else ""
    return f"{factor}{clip(row['candidate'], 48)}\n  vs {clip(row['baseline'], 48)} ({row['direction']})"


def clip(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def save(fig, path: Path, margins: dict | None = None) -> Path:
    """Write ``fig``; ``margins`` (subplots_adjust) for figures whose label sizes are known in advance (numbers,
    clipped pair labels), which need no text measuring; the others (cost, corrected metrics, tuning curve:
    free-form annotations and tick labels) are laid out tight."""
    if margins:
        fig.subplots_adjust(**margins)
    else:
        fig.tight_layout()
    # written beside and renamed: a plot is whole or absent (a sweep's plots are drawn on a second thread)
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI, pil_kwargs={"compress_level": 1}))
    return path  # fast zlib level above: a sweep draws 5 per job
