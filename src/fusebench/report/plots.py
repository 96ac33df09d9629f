"""Plots (matplotlib, PNG) for one run and for a sweep. Every function reads what is on disk and returns paths."""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fusebench import DIRECTIONS, FUSED
from fusebench.evaluation.comparisons import level_label
from fusebench.evaluation.record import RunRecord
from fusebench.fusion.config import flat_settings
from fusebench.runtime import state
from fusebench.stores.files import array_digest, atomic_save, atomic_write_text, file_identity, file_sha256

log = logging.getLogger(__name__)
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
    fig.suptitle(_title(record))
    return _save(fig, path, NUMERIC_MARGINS)


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
    fig.suptitle(_title(record))
    return _save(fig, path, NUMERIC_MARGINS)


MAX_PAIR_ROWS = 60  # a pair plot taller than this is unreadable (and slow); every row stays in gains.csv


def _smallest_k(rows: list[dict]) -> list[dict]:
    """The comparison rows at the smallest k (R@1 in the default setup), at most ``MAX_PAIR_ROWS`` of them
    (the largest gains in absolute value, in their original order): what the pair plots show."""
    rows = [r for r in rows if r["k"] == min(x["k"] for x in rows)] if rows else []
    if len(rows) > MAX_PAIR_ROWS:
        keep = set(sorted(range(len(rows)), key=lambda i: -abs(rows[i]["gain"]))[:MAX_PAIR_ROWS])
        rows = [r for i, r in enumerate(rows) if i in keep]
    return rows


def _pair_title(title: str, rows: list[dict], shown: list[dict]) -> str:
    at_k = [r for r in rows if r["k"] == shown[0]["k"]]
    return title if len(shown) == len(at_k) else f"{title} (the {len(shown)} largest |gain| of {len(at_k)}; all in gains.csv)"


def wins_losses(rows: list[dict], path: Path, title: str) -> Path | None:
    shown = _smallest_k(rows)
    if not shown:
        return None
    title, rows = _pair_title(title, rows, shown), shown
    y = np.arange(len(rows))
    fig, ax = subplots(figsize=(12, 0.5 * len(rows) + 1.5))
    ax.barh(y, [r["wins"] for r in rows], color="tab:green", label="won (candidate right, baseline wrong)")
    ax.barh(y, [-r["losses"] for r in rows], color="tab:red", label="lost (baseline right, candidate wrong)")
    labels = [_pair_label(r) for r in rows]
    ax.set_yticks(y, labels, fontsize=7)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"queries at R@{rows[0]['k']}")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, y=TITLE_Y)
    return _save(fig, path, _pair_margins(fig, labels))


def forest(rows: list[dict], path: Path, title: str) -> Path | None:
    shown = _smallest_k(rows)
    if not shown:
        return None
    title, rows = _pair_title(title, rows, shown), shown
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
    ax.axvline(0, color="black", lw=0.8)
    labels = [_pair_label(r) for r in rows]
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel(f"gain in R@{rows[0]['k']} (points)")
    ax.legend(fontsize=7)
    ax.set_title(title, y=TITLE_Y)
    return _save(fig, path, _pair_margins(fig, labels))


def score_distributions(run_dir: Path, record: RunRecord, path: Path) -> Path | None:
    """Each single model's top-list scores, raw and DBSF-rescaled per query (what fusion adds up). The same
    for every job of a sweep over fusion settings: drawn once per process, copied for the jobs after."""
    singles = record.singles
    files = [run_dir / "topk" / f"{n}.t2i.npz" for n in singles]
    if not singles or not all(f.is_file() for f in files):
        return None
    ddof = flat_settings(record.fusion)["ddof"]  # the run's own (dbsf, zscore), else the default
    scores = {}
    for name, file in zip(singles, files):
        with np.load(file) as data:
            scores[name] = data["scores"]
    inputs = [_title(record), ddof, *((name, array_digest(array)) for name, array in scores.items())]
    return drawn_once(inputs, path, lambda: _draw_score_distributions(scores, ddof, record, path))


def _draw_score_distributions(scores: dict[str, np.ndarray], ddof: int, record: RunRecord, path: Path) -> Path:
    fig, axes = subplots(1, 2, figsize=(10, 3.8))
    for name, stored in scores.items():
        values = stored.astype(np.float64)
        axes[0].hist(values.ravel(), bins=60, alpha=0.5, label=name, density=True, histtype="stepfilled")
        mean, sd = values.mean(axis=1, keepdims=True), values.std(axis=1, ddof=ddof, keepdims=True)
        rescaled = np.where(sd > 0, (values - (mean - 3 * sd)) / (6 * np.where(sd > 0, sd, 1)), 0.5)
        axes[1].hist(rescaled.ravel(), bins=60, alpha=0.5, label=name, density=True, histtype="stepfilled")
    axes[0].set_title("t2i top-list scores, raw cosine", y=TITLE_Y)
    axes[1].set_title("the same, DBSF-rescaled per query list", y=TITLE_Y)
    axes[1].legend(fontsize=8)
    fig.suptitle(_title(record))
    return _save(fig, path, NUMERIC_MARGINS)


def cost_vs_gain(cost: list[dict], article: list[dict], path: Path) -> Path | None:
    """Index bytes per image against the t2i R@1 gain over the best single model on the same dataset."""
    if not cost:
        return None
    recall: dict = {}
    for r in article:
        for column, value in r.items():
            if column.endswith(" t2i R@1") and value is not None:
                recall[(column.rsplit(" ", 2)[0], r["retriever"])] = value  # the corpus label, as cost rows have it
    fusion = {(row["dataset"], row["retriever"]): row.get("fusion", False) for row in cost}
    best: dict = {}  # the best single model per dataset at t2i R@1 (fusions are flagged in the cost rows)
    for (dataset, retriever), value in recall.items():
        if not fusion.get((dataset, retriever), False):
            best[dataset] = max(best.get(dataset, value), value)
    points = [(row, recall[(row["dataset"], row["retriever"])] - best[row["dataset"]]) for row in cost
              if (row["dataset"], row["retriever"]) in recall and row["dataset"] in best]
    if not points:
        return None
    fig, ax = subplots(figsize=(9, 5.5))
    for row, gain in points:
        ax.scatter(row["bytes_per_image_fp32"], gain, color="tab:orange" if row.get("fusion") else "tab:blue")
        ax.annotate(_clip(f"{row['dataset']}: {row['retriever']}", 50), (row["bytes_per_image_fp32"], gain), fontsize=7)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("index bytes per image (fp32)")
    ax.set_ylabel("t2i R@1 minus the best single model's (points)")
    ax.set_title("cost vs gain (blue: single models, orange: fusions)", y=TITLE_Y)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def corrected_metrics(record: RunRecord, path: Path) -> Path | None:
    """A panel per extra-positive set and direction (ECCV Caption, CxC): each retriever's metrics, with the
    fused-vs-single gain on each (eval.positives)."""
    if not record.positives:
        return None
    names = list(record.retrievers)
    panels = [(s, d) for s in record.positives for d in DIRECTIONS]
    fig, axes = subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    width = 0.8 / len(names)
    for ax, (positive_set, direction) in zip(axes[0], panels):
        metrics = [m for m in record.retrievers[names[0]].positives.get(positive_set, {}).get(direction, {})
                   if m != "n_queries"]
        for i, name in enumerate(names):
            values = [record.retrievers[name].positives.get(positive_set, {}).get(direction, {}).get(m) or 0.0
                      for m in metrics]
            x = np.arange(len(metrics)) + i * width
            ax.bar(x, values, width, label=name)
            for xi, v in zip(x, values):
                ax.text(xi, v + 1, f"{v:.1f}", ha="center", fontsize=7)
        ax.set_xticks(np.arange(len(metrics)) + width * (len(names) - 1) / 2, metrics)
        n = getattr(record.positives[positive_set], f"{direction}_queries")
        ax.set_title(f"{positive_set} {direction} ({n} queries)", y=TITLE_Y)
        ax.set_ylim(0, 108)
    axes[0][0].set_ylabel("percent (false negatives corrected)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(_title(record))
    return _save(fig, path)


def tune_curve(record: RunRecord, path: Path) -> Path | None:
    """Tune mode: each grid setting's criterion on the tuning split, the single models' as lines, the chosen one
    marked (what the test evaluation then used)."""
    t = record.tune
    if not t or not t.curve:
        return None
    curve = t.curve
    fig, ax = subplots(figsize=(max(7, 0.45 * len(curve) + 3), 4.4))
    x = np.arange(len(curve))
    ax.plot(x, [point.value for point in curve], marker="o", label=FUSED)
    chosen = t.chosen_index
    ax.scatter([chosen], [curve[chosen].value], s=120, facecolors="none", edgecolors="red", label="chosen", zorder=3)
    for i, (name, value) in enumerate(t.singles.items(), start=1):
        ax.axhline(value, linestyle="--", linewidth=1, color=f"C{i}", label=name)
    ax.set_xticks(x, [point.describe() or "as configured" for point in curve], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"{t.criterion} on the tuning split (%)")
    ax.set_title(f"tuning split: {t.split}, {t.n_images} images (the chosen setting then runs once on test)",
                 fontsize=9, y=TITLE_Y)
    ax.legend(fontsize=8)
    fig.suptitle(_title(record))
    return _save(fig, path)


def _against_size(rows: list[dict], key: str, value: str, low: str, high: str, ylabel: str, title: str,
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
        ax.errorbar([r["gallery images"] for r in mine], y, yerr=err, marker="o", capsize=3, label=_clip(label, 70))
    sizes = sorted({r["gallery images"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k" if n >= 1e3 else str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("gallery images (test split + distractors; log scale)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title + (" [SIMULATED]" if simulated else ""), y=TITLE_Y)
    return _save(fig, path)


def scaling_plots(scaling, out: Path) -> list[Path | None]:
    """The distractor-scaling study (a :class:`fusebench.report.scaling.ScalingReport`): t2i R@k (its first k)
    against gallery size per retriever with Wilson intervals, and each fusion's gain over its best single model
    with its interval over queries."""
    k, level = scaling.ks[0], level_label(scaling.level)
    several = len({r["study"] for r in scaling.recall}) > 1
    recall = [{**r, "line": f"{r['study']}: {r['retriever']}" if several else r["retriever"]} for r in scaling.recall]
    gains = [{**g, "line": f"{g['study']}: {g['fusion']}" if several else g["fusion"]} for g in scaling.gains
             if g["k"] == k]
    return [_against_size(recall, "line", f"t2i R@{k}", f"R@{k} low", f"R@{k} high",
                          f"t2i R@{k} (%), {level} Wilson interval", f"t2i R@{k} against gallery size",
                          scaling.simulated, out / "scaling_recall.png"),
            _against_size(gains, "line", "gain", "ci_low", "ci_high", f"t2i R@{k} minus the best single model's (points)",
                          f"fusion gain against gallery size ({level} CI over queries)", scaling.simulated,
                          out / "scaling_gain.png")]


def run_plots(run_dir: str | Path, record: RunRecord) -> list[Path]:
    """The run's plots in ``run_dir/plots``, with a manifest of what was drawn (``runtime.layout.PLOTS_MANIFEST``:
    written before the first plot, each as being drawn, then with every plot's sha256), so that a later run in
    this dir tells its own plots from a user's file of the same name (refused, never overwritten)."""
    from fusebench.runtime.layout import PLOTS, PLOTS_MANIFEST, plots_manifest_text

    run_dir = Path(run_dir)
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    atomic_write_text(out / PLOTS_MANIFEST, plots_manifest_text({name: None for name in sorted(PLOTS)}))
    made = _draw_run_plots(run_dir, record, out)
    atomic_write_text(out / PLOTS_MANIFEST, plots_manifest_text({p.name: file_sha256(p) for p in made}))
    return made


def _draw_run_plots(run_dir: Path, record: RunRecord, out: Path) -> list[Path]:
    comparisons = [c.to_json() for c in record.comparisons]  # the rows the run and sweep plots share
    made = [recall_bars(record, out / "recall_bars.png"), recall_curves(run_dir, record, out / "recall_at_k.png"),
            wins_losses(comparisons, out / "wins_losses.png", "the fusion vs each model: wins and losses"),
            forest(comparisons, out / "paired_gains.png", "paired gains of the fusion"),
            score_distributions(run_dir, record, out / "score_distributions.png"),
            corrected_metrics(record, out / "corrected_metrics.png"), tune_curve(record, out / "tune_curve.png")]
    return [p for p in made if p is not None]


def sweep_plots(folder: str | Path, report, subdir: str | None = None) -> list[Path]:
    """The sweep's plots from its report (a :class:`fusebench.report.sweep.SweepSummary`), drawn in ``folder``'s
    ``subdir``: by default where a report into ``folder`` draws them (``report_files.plots_dir``: ``plots/``, or
    ``report_plots/`` when ``folder`` is a run dir, whose ``plots/`` is the run's). Their names:
    ``report_files.PLOTS``."""
    from fusebench.report.report_files import plots_dir

    out = Path(folder) / (subdir or plots_dir(folder))
    out.mkdir(parents=True, exist_ok=True)
    made = [forest(report.gains, out / "paired_gains.png", "paired gains across the sweep"),
            wins_losses(report.gains, out / "wins_losses.png", "wins and losses across the sweep"),
            cost_vs_gain(report.cost, report.article, out / "cost_vs_gain.png")]
    if getattr(report, "scaling", None) is not None:
        made += scaling_plots(report.scaling, out)
    if getattr(report, "index_effects", None) is not None:
        from fusebench.report.index_plots import index_effects_plot, recall_time_plot, verdict_plot

        made += [index_effects_plot(report.index_effects, out / "index_effects.png"),
                 recall_time_plot(report.index_effects, out / "index_recall_time.png"),
                 verdict_plot(report.index_effects, out / "index_verdict.png")]
    return [p for p in made if p is not None]


def _title(record: RunRecord) -> str:
    d = record.dataset
    flag = " [SIMULATED]" if d.simulated else (" [NON-STANDARD]" if d.nonstandard else "")
    return f"{d.name}: {d.n_images} images, {d.n_captions} captions{flag}"


def _pair_margins(fig, labels: list[str]) -> dict:
    """Fixed margins for a figure whose y labels are pair labels (7 pt), from their longest line at a generous
    0.6 em per character (lines are clipped by ``_pair_label`` to about 70), so no text needs measuring:
    tight_layout draws the whole figure once more just to measure it (half the time of a sweep's pair plots)."""
    width, height = fig.get_size_inches()
    longest = max(len(line) for label in labels for line in label.split("\n"))
    left = 0.3 + longest * 7 * 0.6 / 72
    return {"left": left / width, "right": 1 - 0.2 / width, "bottom": 0.55 / height, "top": 1 - 0.45 / height}


def _pair_label(row: dict) -> str:
    factor = f"{_clip(row['factor'], 20)}: " if row.get("factor") else ""
    return f"{factor}{_clip(row['candidate'], 48)}\n  vs {_clip(row['baseline'], 48)} ({row['direction']})"


def _clip(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _save(fig, path: Path, margins: dict | None = None) -> Path:
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
