"""Sweep reports: the article-style table, paired gains across runs, a cost table, and, when the runs differ by
gallery size, the distractor-scaling study (:mod:`fusebench.report.scaling`), and, when they differ by search
backend, the index-effects study (:mod:`fusebench.report.index_effects`), from run dirs on disk. A retriever's
backend is one of its factors: a model's lists from an HNSW index are another retriever than its exact lists.

Works on any folder holding run dirs (a Hydra multirun dir, or several run dirs): every intact run dir with a
``metrics.json`` is reported; one without is listed as failed, one with damaged files as damaged, each with the
reason (``fusebench.report.runs``). Paired statistics use the saved per-query
ranks (``ranks/*.npy``), so retrievers from different jobs are compared query by query.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fusebench import DIRECTIONS
from fusebench.config.specs import TEXT_CASES
from fusebench.evaluation.comparisons import compare
from fusebench.evaluation.search_record import EXACT_FUSED
from fusebench.evaluation.stats import holm_adjust
from fusebench.fusion.config import FUSE_ON, METHODS
from fusebench.report import report_files
from fusebench.report.article import beside_article
from fusebench.report.index_effects import EXACT, IndexEffects, index_effects_report, search_cost
from fusebench.report.labels import dataset_labels
from fusebench.report.plots import sweep_plots
from fusebench.report.retrievers import (  # noqa: F401 - describe, retriever_factors: the report's names
    describe,
    retriever_factors,
    retriever_key,
    retriever_labels,
    unique_retrievers,
)
from fusebench.report.runs import Run, Scan, load_runs, scan_runs
from fusebench.report.scaling import gallery_cost, scaling_report
from fusebench.report.sweep_markdown import csv_text, markdown
from fusebench.stores.files import atomic_write_text

if TYPE_CHECKING:
    from fusebench.report.scaling import ScalingReport

log = logging.getLogger(__name__)
FACTOR_ORDER = {  # (factor, value): how candidates are oriented against baselines, each from the value's owner
    "method": list(METHODS),  # from the methods' registry: its order attribute (fusebench.fusion.methods)
    "fuse_on": list(FUSE_ON),  # fusion.config's values
    "text": list(TEXT_CASES),  # config.specs' query text cases
}
SCALING_TABLES = ("recall", "gains", "changes", "extrapolation")  # scaling_*.csv beside summary.md
__all__ = ["Run", "Scan", "SweepSummary", "build_report", "load_runs", "scan_runs", "write_report", "write_report_plots"]


def article_rows(runs: list[Run], ks: list[int]) -> list[dict]:
    """The article's table: one row per retriever (models, preprocessing, fusion), columns corpus x direction x
    R@k (one column group per corpus: two corpora of one name are labelled apart)."""
    rows: dict[str, dict] = {}
    labels, names = dataset_labels(runs), retriever_labels(runs)
    order = {retriever_key(run, name): i for i, (run, name) in enumerate(unique_retrievers(runs))}
    held = sorted(((run, name) for run in runs for name in run.record.retrievers),
                  key=lambda rn: order[retriever_key(*rn)])
    for run, name in held:  # every run holding the retriever: one may have measured a k another did not
        result = run.record.retrievers[name]
        label = names[(run.path, name)]
        row = rows.setdefault(label, {"retriever": label})
        dataset = labels[run.dataset_key]
        for direction in DIRECTIONS:
            for k in ks:
                cell = f"{dataset} {direction} R@{k}"
                if row.get(cell) is None:
                    row[cell] = result.recall(direction, k)
    columns = sorted({c for r in rows.values() for c in r if c != "retriever"},
                     key=lambda c: (c.rsplit(" ", 2)[0], c.rsplit(" ", 2)[1] != "t2i", int(c.rsplit("@", 1)[1])))
    return [{"retriever": r["retriever"], **{c: r.get(c) for c in columns}} for r in rows.values()]


def _orient(factor: str, a_value, b_value) -> bool:
    """True when retriever a is the candidate (the 'treatment') against b."""
    if factor == "text":
        a_case = json.loads(a_value)
        b_case = json.loads(b_value)
        a_case = a_case[0] if isinstance(a_case, list) else a_case
        b_case = b_case[0] if isinstance(b_case, list) else b_case
        order = FACTOR_ORDER["text"]
        return order.index(a_case.get("case", "as_typed")) > order.index(b_case.get("case", "as_typed"))
    if factor == "search" and EXACT in (a_value, b_value):  # as each run compares them: exact minus the index
        return a_value == EXACT
    if factor in FACTOR_ORDER and a_value in FACTOR_ORDER[factor] and b_value in FACTOR_ORDER[factor]:
        order = FACTOR_ORDER[factor]
        return order.index(a_value) > order.index(b_value)  # engine presets: by name, below
    return str(a_value) > str(b_value)


def comparable_pairs(runs: list[Run]) -> list[tuple[str, tuple[Run, str], tuple[Run, str]]]:
    """(factor, candidate, baseline): retrievers on one dataset differing in exactly one factor (two backends:
    only a backend against exact lists)."""
    items = unique_retrievers(runs)
    pairs = []
    for i, (run_a, a) in enumerate(items):
        fa = retriever_factors(run_a, a)
        for run_b, b in items[i + 1:]:
            if run_a.dataset_key != run_b.dataset_key or not run_a.same_queries(run_b):
                continue
            fb = retriever_factors(run_b, b)
            if fa["kind"] != fb["kind"]:
                continue
            differing = [key for key in fa if fa[key] != fb[key]]
            if len(differing) == 1 and (differing != ["search"] or EXACT in (fa["search"], fb["search"])):
                factor = differing[0]
                first = _orient(factor, fa[factor], fb[factor])
                pairs.append((factor, (run_a, a), (run_b, b)) if first else (factor, (run_b, b), (run_a, a)))
    return pairs


def _run_ranks(run: Run, name: str) -> dict[str, np.ndarray]:
    return {d: run.ranks(name, d) for d in DIRECTIONS}


def paired_gain_rows(runs: list[Run], ks: list[int], draws: int = 2000, level: float = 0.95,
                     seed: int = 0) -> list[dict]:
    """Every comparable pair (one factor apart), and each fusion against its best single member at each
    direction and k (:meth:`RunRecord.best_single`), through the run's own comparison function
    (:func:`fusebench.evaluation.comparisons.compare`); p-values Holm-adjusted over the whole sweep."""
    rows = []
    labels, names = dataset_labels(runs), retriever_labels(runs)

    def add(factor: str, run_c: Run, cand: str, run_b: Run, base: str, **options) -> None:
        clusters = {d: run_c.clusters(d) for d in DIRECTIONS}
        found = compare(names[(run_c.path, cand)], names[(run_b.path, base)], _run_ranks(run_c, cand), _run_ranks(run_b, base),
                        clusters, options.pop("ks", ks), draws, level, seed, **options)
        for row in found:
            values = {k: v for k, v in row.to_json().items() if k not in ("baseline_recall", "candidate_recall")}
            rows.append({"dataset": labels[run_c.dataset_key], "factor": factor,
                         "candidate": row.candidate,
                         "baseline": row.baseline, **values})

    for factor, (run_c, cand), (run_b, base) in comparable_pairs(runs):
        add(factor, run_c, cand, run_b, base)
    for run, name in unique_retrievers(runs):  # each distinct fusion once, however many jobs hold it
        if run.record.retrievers[name].is_fusion and name != EXACT_FUSED:  # its members: the backend's lists
            members = run.record.retrievers[name].members
            for direction in DIRECTIONS:
                for k in ks:
                    best = run.record.best_single(direction, k, among=members)
                    if best is not None:  # None: the run did not measure k, so its best single there is unknown
                        add("fused vs best single", run, name, run, best, ks=[k], directions=(direction,))
    adjusted = holm_adjust([r["p_value"] for r in rows])
    for row, p in zip(rows, adjusted):
        row["p_holm"] = p
    return rows


def cost_rows(runs: list[Run]) -> list[dict]:
    rows = []
    labels, names = dataset_labels(runs), retriever_labels(runs)
    for run, name in unique_retrievers(runs):
        result = run.record.retrievers[name]
        members = result.members or [name]
        dims = sum(run.record.retrievers[m].spec.dim for m in members)
        seconds_per_image = 0.0
        measured = True
        for m in members:
            info = run.record.retrievers[m].embedding or {}
            took = info.get("embed_seconds", {})
            if not info or info.get("cache", {}).get("image_hit", True):
                measured = False
                continue
            seconds_per_image += (took["images"] - took.get("model_load", 0.0)) / max(run.record.dataset.n_images, 1)
        fp32, fp16 = 4 * dims, 2 * dims
        rows.append({"dataset": labels[run.dataset_key], "retriever": names[(run.path, name)],
                     "fusion": result.is_fusion, "dims": dims,
                     "bytes_per_image_fp32": fp32, "bytes_per_image_fp16": fp16,
                     "index_1M_fp32_GB": round(fp32 * 1e6 / 1e9, 2), "index_10M_fp32_GB": round(fp32 * 1e7 / 1e9, 1),
                     "index_10M_fp16_GB": round(fp16 * 1e7 / 1e9, 1),
                     "embed_img_per_s": round(1 / seconds_per_image, 1) if measured and seconds_per_image > 0 else None,
                     "query_ms_run": run.record.run.query_ms, **gallery_cost(run, members), **search_cost(run, name)})
    return rows


def ranked_fusions(gains: list[dict], k: int) -> list[dict]:
    """Every fusion of the sweep ranked by its t2i R@k gain over its best single model (the paired rows of
    factor 'fused vs best single'), per dataset: gain, interval over queries and over images, won/lost, Holm p."""
    rows = [g for g in gains if g["factor"] == "fused vs best single" and g["direction"] == "t2i" and g["k"] == k]
    rows.sort(key=lambda g: (g["dataset"], -g["gain"], g["candidate"]))
    return [{"dataset": g["dataset"], "fusion": g["candidate"], "over": g["baseline"], f"t2i R@{k} gain": g["gain"],
             "ci_low": g["ci_low"], "ci_high": g["ci_high"], "cluster_ci_low": g["cluster_ci_low"],
             "cluster_ci_high": g["cluster_ci_high"], "won/lost": f"{g['wins']}/{g['losses']}", "p_holm": g["p_holm"]}
            for g in rows]


def _baseline_job_gain(runs: list[Run], run: Run, b: dict, draws: int, level: float, seed: int):
    """The gain of ``run``'s headline over the headline of the sweep's job for the article row's baseline
    (for example lowercased over as-typed SigLIP 2: two jobs, the same queries), or None without that job."""
    study = b.get("baseline_study")
    if b["gain"] is not None or not study:
        return None
    for other in runs:
        ref = other.record.reference
        if ref and ref["study"] == study and ref["dataset"] == b["dataset"] \
                and other.dataset_key == run.dataset_key and other.same_queries(run):
            head, base = run.record.headline, other.record.headline
            clusters = {d: run.clusters(d) for d in DIRECTIONS}
            names = retriever_labels([run, other])
            return compare(names[(run.path, head)], names[(other.path, base)], _run_ranks(run, head), _run_ranks(other, base),
                           clusters, [1], draws, level, seed, directions=("t2i",))[0]
    return None


def beside_article_rows(runs: list[Run], draws: int = 2000, level: float = 0.95, seed: int = 0) -> list[dict]:
    """Each article job of the sweep beside the article's row for it (t2i R@1; gain, interval, won/lost). A gain
    the article measured between two of its jobs (lowercased over as-typed queries) is measured here the same
    way: paired over the same queries of the two jobs."""
    def interval(values):
        return None if not values else f"[{values[0]:+.2f}, {values[1]:+.2f}]"

    rows = []
    labels = dataset_labels(runs)
    several = len(set(labels.values())) > 1  # two corpora (seeds, galleries): each row says which
    for run in runs:
        b = beside_article(run.record)
        if b is None:
            continue
        c = _baseline_job_gain(runs, run, b, draws, level, seed)
        if c is not None:
            b.update(gain=c.gain, ci=[c.ci_low, c.ci_high], won=c.wins, lost=c.losses)
        rows.append({"dataset": b["dataset"] + (" (simulated run)" if b["simulated"] else "")
                     + (f" on {labels[run.dataset_key]}" if several else ""), "job": b["label"],
                     "article t2i R@1": b["article_t2i_r1"], "this t2i R@1": b["t2i_r1"],
                     "article gain": b["article_gain"], "article CI": interval(b["article_ci"]),
                     "article won/lost": None if b["article_won"] is None else f"{b['article_won']}/{b['article_lost']}",
                     "this gain": b["gain"], "this CI": interval(b["ci"]),
                     "this won/lost": None if b["won"] is None else f"{b['won']}/{b['lost']}"})
    return rows


def positive_rows(runs: list[Run]) -> list[dict]:
    """Each distinct retriever's extra-positive metrics (ECCV Caption, CxC), one row per retriever."""
    rows = []
    labels, names = dataset_labels(runs), retriever_labels(runs)
    for run, name in unique_retrievers(runs):
        block = run.record.retrievers[name].positives
        if block:
            rows.append({"dataset": labels[run.dataset_key], "retriever": names[(run.path, name)],
                         **{f"{s} {d} {m}": v for s, sides in block.items() for d, values in sides.items()
                            for m, v in values.items() if m != "n_queries"}})
    return rows


def positive_gain_rows(runs: list[Run]) -> list[dict]:
    """Each run's fused-vs-single comparisons on the extra-positive metrics, as the run recorded them."""
    labels, names = dataset_labels(runs), retriever_labels(runs)
    return [{"dataset": labels[run.dataset_key], "candidate": names[(run.path, c.candidate)],
             "baseline": names[(run.path, c.baseline)], "direction": c.direction, "metric": c.metric, "gain": c.gain,
             "ci_low": c.ci_low, "ci_high": c.ci_high, "cluster_ci_low": c.cluster_ci_low,
             "cluster_ci_high": c.cluster_ci_high, "won/lost": f"{c.wins}/{c.losses}", "p": c.p_value}
            for run in runs for c in run.record.positive_comparisons]


def tuned_rows(runs: list[Run]) -> list[dict]:
    """Runs in tune mode: what the tuning split chose, its value there, and the test value of that one setting."""
    rows = []
    labels = dataset_labels(runs)
    for run in runs:
        t = run.record.tune
        if t:
            direction, k = t.criterion.split(" R@")
            rows.append({"dataset": labels[run.dataset_key], "run": run.name,
                         "tuning split": f"{t.split} ({t.n_images} images)", "criterion": t.criterion,
                         "settings tried": len(t.curve), "chosen": t.chosen.describe() or "as configured",
                         "on the tuning split": t.chosen.value,
                         "on test": run.record.retrievers[run.record.headline].recall(direction, int(k))})
    return rows


@dataclass
class SweepSummary:
    """A sweep's report: its runs (and those that failed, with why), and each table of summary.md as rows
    (one dict per row, its keys the columns: what summary.csv, gains.csv and cost.csv hold)."""

    folder: Path
    runs: list[Run]
    reasons: dict[str, str]  # run dir -> why it is not reported
    ks: list[int]
    level: float
    draws: int
    article: list[dict]  # recall per retriever (summary.csv)
    gains: list[dict]  # paired gains across runs (gains.csv)
    cost: list[dict]  # index size and speed per retriever (cost.csv)
    beside_article: list[dict]
    positives: list[dict]
    positive_gains: list[dict]
    tuned: list[dict]
    plots: list[Path] = field(default_factory=list)
    out: Path | None = None  # where write_report wrote it
    scaling: ScalingReport | None = None  # runs that differ by gallery size (fusebench.report.scaling)
    index_effects: IndexEffects | None = None  # runs that differ by search backend (fusebench.report.index_effects)
    damaged: list[str] = field(default_factory=list)  # run dirs of ``reasons`` whose files are damaged (Scan.damaged)

    @property
    def failed(self) -> list[str]:
        """The run dirs not reported because their job failed, was stopped or is missing (not the damaged ones)."""
        return [name for name in self.reasons if name not in self.damaged]

    @property
    def not_reported(self) -> list[str]:
        """Every run dir not reported: failed and damaged."""
        return list(self.reasons)

    @property
    def headline_gains(self) -> list[dict]:
        """The paired gains at the first k (the table summary.md shows; every k is in gains.csv)."""
        return [r for r in self.gains if r["k"] == self.ks[0]]



def build_report(folder: str | Path, draws: int = 2000, seed: int = 0, level: float = 0.95,
                 scan: Scan | None = None) -> SweepSummary:
    """The sweep's report from its runs (``scan``: the folder's scan when the caller already made it)."""

    scan = scan if scan is not None else scan_runs(folder)
    runs = scan.runs
    ks = sorted({k for r in runs for k in r.record.ks}) or [1, 5, 10]
    return SweepSummary(folder=Path(folder), runs=runs, reasons=dict(scan.failed), damaged=list(scan.damaged), ks=ks,
                        level=level, draws=draws,
                        article=article_rows(runs, ks),
                        gains=paired_gain_rows(runs, ks, draws=draws, level=level, seed=seed), cost=cost_rows(runs),
                        beside_article=beside_article_rows(runs, draws=draws, level=level, seed=seed),
                        positives=positive_rows(runs), positive_gains=positive_gain_rows(runs), tuned=tuned_rows(runs),
                        scaling=scaling_report(runs, ks, draws=draws, level=level, seed=seed),
                        index_effects=index_effects_report(runs, ks, draws=draws, level=level, seed=seed))


def write_report(folder: str | Path, draws: int = 2000, seed: int = 0, level: float = 0.95,
                 scan: Scan | None = None, out: str | Path | None = None, plots: bool = True) -> SweepSummary:
    """Write summary.md, summary.csv, gains.csv and cost.csv (and positives.csv, scaling_*.csv for a scaling
    study, index_effects.csv for runs that differ by search backend) and the plots for the runs below ``folder``
    into ``out`` (by default ``folder``), with report.sha256 recording them; return the report (``report.out``:
    where it was written). ``plots=False``: the tables alone, an earlier report's plots removed; the caller
    draws them after (:func:`write_report_plots`, the views process: ``app.views``).

    Refused before any work (``report_files.ReportBlocked`` naming the file) when it would replace a file
    fusebench did not write; an earlier report's files are replaced (``fusebench.report.report_files``)."""

    folder = Path(folder)
    out = folder if out is None else Path(out)
    report_files.check(out)
    report = build_report(folder, draws=draws, seed=seed, level=level, scan=scan)
    report.out = out
    tables = {"summary.md": markdown(report), "summary.csv": csv_text(report.article),
              "gains.csv": csv_text(report.gains), "cost.csv": csv_text(report.cost)}
    if report.positives:
        tables["positives.csv"] = csv_text(report.positives)
    if report.scaling is not None:
        tables.update({f"scaling_{name}.csv": csv_text(getattr(report.scaling, name)) for name in SCALING_TABLES})
    if report.index_effects is not None:
        tables["index_effects.csv"] = csv_text(report.index_effects.rows)
    staging = report_files.staging(out)
    try:
        for name, text in tables.items():
            atomic_write_text(staging / name, text)
        staged = {**{name: staging / name for name in tables}, **(_drawn(staging, report, out) if plots else {})}
        placed = report_files.commit(out, staged)
    finally:
        report_files.discard(staging)
    report.plots = [p for p in placed if p.suffix == ".png"]
    return report


def write_report_plots(report: SweepSummary) -> list[Path]:
    """The plots of a report whose tables :func:`write_report` wrote without them (``plots=False``), drawn into
    its folder's plots dir and recorded in its report.sha256 beside the tables; ``report.plots`` is set to them."""
    out = Path(report.out)
    staging = report_files.staging(out)
    try:
        staged = _drawn(staging, report, out)
        for rel in list(staged):  # a file put there since the tables were written: that plot alone is left out
            found = report_files.blocker(out, [rel])
            if found is not None:
                log.warning("sweep plot %s not drawn: %s %s; a report replaces only the files it wrote", rel, *found)
                del staged[rel]
        placed = report_files.commit(out, staged, add=True) if staged else []
    finally:
        report_files.discard(staging)
    report.plots = [p for p in placed if p.suffix == ".png"]
    return report.plots


def _drawn(staging: Path, report: SweepSummary, out: Path) -> dict[str, Path]:
    """The report's plots drawn in ``staging`` (relative path in ``out`` -> the file); none when drawing failed (a
    warning: the tables are the record, plots a view)."""
    plots_dir = report_files.plots_dir(out)
    try:
        plots = sweep_plots(staging, report, plots_dir)
    except Exception as err:  # noqa: BLE001 - the tables are the record; plots are a view
        log.warning("could not draw sweep plots: %s", err)
        return {}
    return {f"{plots_dir}/{p.name}": p for p in plots}
