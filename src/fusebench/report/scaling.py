"""The distractor-scaling study in a sweep's report: when a sweep's runs differ by gallery size (``gallery.size``,
``experiment=distractor_scaling``), each retriever's t2i recall at every size, each fusion's gain over its best
single model at every size (each run's own comparison), each retriever's paired change from the smallest gallery
(query by query, from the runs' rank files), and each single model's R@1 extrapolated to larger galleries
(:mod:`fusebench.evaluation.extrapolation`), checked against the sizes measured at the same step where they allow.

Only t2i changes: distractors carry no captions, so they ask no i2t query and are no i2t item. Runs compare when
their test split is the same (dataset name, counts and settings) and their distractors come from one source and
seed (so the galleries nest); the runs without distractors join every source's study.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from fusebench.evaluation.comparisons import compare
from fusebench.evaluation.extrapolation import COVERED_FROM, METHOD, Prediction, displacements, predict_recall
from fusebench.evaluation.metrics import recall_at_k
from fusebench.report.index_effects import EXACT, search_label
from fusebench.report.labels import distinct, study_labels
from fusebench.report.plots import wilson
from fusebench.report.retrievers import describe, retriever_factors, settings_of
from fusebench.report.runs import Run

EXTRAPOLATE_FACTOR = 10  # predict R@1 at this many times the largest gallery measured


def distractors(run: Run) -> int:
    """Distractor images in the run's gallery (after near-duplicates were dropped); 0 without a gallery."""
    return 0 if run.record.gallery is None else int(run.record.gallery.distractors)


def asked(run: Run) -> int:
    """The distractors the run asked for (``gallery.size``: before near-duplicates of test images were dropped)."""
    return 0 if run.record.gallery is None else int(run.record.gallery.size)


def gallery_images(run: Run) -> int:
    """Every image the run's t2i queries searched: the test split's and the distractors."""
    return int(run.record.dataset.n_images)


def test_split(run: Run) -> tuple:
    """What makes two runs' test splits (and so their queries) the same: the test split's content digest (older
    records: name, test images, captions and the dataset's own facts), never the gallery's."""
    return run.corpus_key


def source(run: Run) -> str | None:
    """Where the run's distractors come from (kind, seed, source, near-duplicate threshold); None without any."""
    g = run.record.gallery
    if g is None or g.distractors == 0:
        return None
    return g.identity


def gallery_cost(run: Run, members: list[str]) -> dict:
    """What the run's gallery costs for a retriever's models (summed over a fusion's models): its size, bytes as
    fp32 and as stored, embedding throughput and device when this run embedded distractors, search time per t2i
    query (``gallery.models`` of the record; a run without distractors: its test images, nothing stored)."""
    gallery = run.record.gallery
    costs = [gallery.models.get(m) for m in members] if gallery else []
    known = [c for c in costs if c is not None]
    out = {"gallery_distractors": gallery.distractors if gallery else 0, "gallery_images": run.record.dataset.n_images,
           "gallery_bytes_fp32": sum(c.bytes_fp32 for c in known) if known else
           4 * run.record.dataset.n_images * sum(run.record.retrievers[m].spec.dim for m in members),
           "gallery_bytes_stored": sum(c.bytes_stored for c in known) if known else None,
           "stored_dtype": "/".join(dict.fromkeys(c.stored_dtype for c in known)) or None,
           "embed_device": "/".join(dict.fromkeys(c.embed_device for c in known if c.embed_device)) or None,
           "gallery_embed_img_per_s": None, "search_ms_per_query": None}
    if known and len(known) == len(members):
        rates = [c.images_per_second for c in known]
        if all(rates):  # both models embed each image: their times add up
            out["gallery_embed_img_per_s"] = round(1 / sum(1 / r for r in rates), 1)
        times = [c.search_ms_per_query for c in known]
        if all(t is not None for t in times):
            out["search_ms_per_query"] = sum(times)
    return out


@dataclass
class Series:
    """One retriever over gallery sizes: ``points`` maps distractors -> (run, retriever name)."""

    study: str
    label: str
    fusion: bool
    points: dict[int, tuple[Run, str]] = field(default_factory=dict)

    def sizes(self) -> list[int]:
        return sorted(self.points)


def studies(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """The sweep's scaling studies: (label, runs) per test split and distractor source, where the runs span at
    least two gallery sizes. The label names the dataset and the source kind."""
    by_split: dict[tuple, list[Run]] = {}
    for run in runs:
        by_split.setdefault(test_split(run), []).append(run)
    found: dict[tuple, tuple[str, list[Run]]] = {}
    for split, members in by_split.items():
        bare = [r for r in members if source(r) is None]
        sources = sorted({source(r) for r in members} - {None})
        for src in sources or [None]:
            group = bare + [r for r in members if src is not None and source(r) == src]
            if len({distractors(r) for r in group}) < 2:
                continue
            kind = json.loads(src)["kind"] if src else "none"
            first = group[0].record
            simulated = " (simulated)" if first.simulated else ""
            found[(split, src)] = (f"{first.dataset.name}{simulated}, {group[0].n_test} test images, gallery={kind}",
                                   group)
    # two studies of one label (two dataset seeds, two gallery seeds or sources): what differs is added
    labels = study_labels({key: (label, max(group, key=distractors)) for key, (label, group) in found.items()})
    return [(labels[key], group) for key, (_, group) in found.items()]


def series_of(study: str, runs: list[Run]) -> list[Series]:
    """Each distinct retriever of a study over its sizes (a single model evaluated in several jobs of one size
    counts once)."""
    out: dict[str, Series] = {}
    for run in sorted(runs, key=distractors):
        for name in run.record.retrievers:
            key = json.dumps(retriever_factors(run, name), sort_keys=True)
            series = out.setdefault(key, Series(study, describe(run, name), run.record.retrievers[name].is_fusion))
            series.points.setdefault(distractors(run), (run, name))
    first = {key: next(iter(s.points.values())) for key, s in out.items()}  # labels unique within the study
    labels = distinct({key: s.label for key, s in out.items()}, {key: settings_of(*rn) for key, rn in first.items()},
                      {key: key for key in out}, tag="retriever")
    for key, series in out.items():
        series.label = labels[key]
    return list(out.values())


def query_problem(a: Run, b: Run) -> str | None:
    """Why two runs' t2i queries cannot be paired query by query (None when they are the same queries)."""
    if test_split(a) != test_split(b):
        return "their test splits differ (their corpora's content digests)"
    files = [r.path / "ranks" / "queries.npz" for r in (a, b)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        return f"the queries cannot be checked: {missing[0]} is missing"
    if not np.array_equal(a.clusters("t2i"), b.clusters("t2i")):
        return "ranks/queries.npz differ: not the same captions of the same images"
    return None


def recall_rows(series: list[Series], ks: list[int], level: float) -> list[dict]:
    """Per retriever and size: t2i recall@k with its Wilson interval (percent)."""

    rows = []
    for s in series:
        for size in s.sizes():
            run, name = s.points[size]
            metrics = run.record.retrievers[name].t2i
            row = {"study": s.study, "retriever": s.label, "distractors": size, "asked": asked(run),
                   "gallery images": gallery_images(run)}
            for k in ks:
                value = metrics.at(k)
                low, high = (None, None) if value is None else wilson(value, metrics.n_queries, level)
                row.update({f"t2i R@{k}": value, f"R@{k} low": low, f"R@{k} high": high})
            rows.append(row)
    return rows


def gain_rows(series: list[Series], ks: list[int]) -> list[dict]:
    """Per fusion and size: its t2i gain over its best single model at each k, as the run compared them."""
    rows = []
    for s in (s for s in series if s.fusion):
        for size in s.sizes():
            run, name = s.points[size]
            record = run.record
            for k in ks:
                best = record.best_single("t2i", k, among=record.retrievers[name].members)
                c = record.comparison(name, best, "t2i", k) if best else None
                if c is not None:
                    rows.append({"study": s.study, "fusion": s.label, "distractors": size,
                                 "gallery images": gallery_images(run), "k": k, "over": best, "gain": c.gain,
                                 "ci_low": c.ci_low, "ci_high": c.ci_high, "cluster_ci_low": c.cluster_ci_low,
                                 "cluster_ci_high": c.cluster_ci_high, "wins": c.wins, "losses": c.losses,
                                 "p_value": c.p_value})
    return rows


def change_rows(series: list[Series], ks: list[int], draws: int, level: float, seed: int,
                refused: list[str]) -> list[dict]:
    """Per retriever and size: the paired change of its t2i recall@k from its smallest gallery, query by query
    (``refused`` gets why a pair of runs was not compared)."""
    rows = []
    for s in series:
        sizes = s.sizes()
        base_run, base = s.points[sizes[0]]
        for size in sizes[1:]:
            run, name = s.points[size]
            problem = query_problem(base_run, run)
            if problem:
                refused.append(f"{s.study}: {s.label} at {size:,} not paired with {sizes[0]:,} distractors: {problem}")
                continue
            found = compare(s.label, s.label, {"t2i": run.ranks(name, "t2i")},
                            {"t2i": base_run.ranks(base, "t2i")}, {"t2i": run.clusters("t2i")}, ks, draws, level,
                            seed, directions=("t2i",))
            for c in found:
                rows.append({"study": s.study, "retriever": s.label, "from": sizes[0], "to": size, "k": c.k,
                             "change": c.gain, "ci_low": c.ci_low, "ci_high": c.ci_high,
                             "cluster_ci_low": c.cluster_ci_low, "cluster_ci_high": c.cluster_ci_high,
                             "gained": c.wins, "lost": c.losses, "p_value": c.p_value})
    return rows


def source_limit(run: Run) -> int | None:
    """The distractors the run's source holds in all (None: unbounded, as simulated ones are); a prediction never
    goes past it."""
    available = None if run.record.gallery is None else run.record.gallery.source.get("available")
    return None if available is None else int(available)


def _prediction(s: Series, source_size: int, target: int, draws: int, level: float,
                seed: int) -> tuple[Prediction | None, str | None]:
    """(the prediction at ``target`` from the run at ``source_size``, None) or (None, why it cannot be made). When
    ``target`` was measured, the two runs must hold the same queries over nested galleries (:func:`query_problem`,
    and no rank may fall: :func:`displacements`)."""
    run, name = s.points[source_size]
    try:
        if target in s.points:
            problem = query_problem(run, s.points[target][0])
            if problem:
                return None, problem
            displacements(run.ranks(name, "t2i"), s.points[target][0].ranks(s.points[target][1], "t2i"))
        ids, scores = run.topk(name, "t2i")
        clusters = run.clusters("t2i")
        return predict_recall(run.ranks(name, "t2i"), clusters, ids, scores, run.n_test, clusters, source_size,
                              target, 1, draws, level, seed), None
    except (OSError, KeyError, ValueError) as err:  # ScalingError is a ValueError; a damaged list file too
        return None, str(err)


def check_source(sizes: list[int], target: int, factor: int = EXTRAPOLATE_FACTOR,
                 asked: dict[int, int] | None = None) -> int:
    """The measured size (with distractors) a measured ``target`` is predicted from as its check: the largest at
    most ``target / factor`` (a check of the printed prediction's own step), else the next smaller one. Steps are
    taken on the sizes asked (``asked``: distractors kept -> ``gallery.size``; by default the same), so that the
    near-duplicates a gallery drops never make a x10 step read as a shorter one."""
    asked = asked or {}
    below = [n for n in sizes if 0 < n < target]
    at_step = [n for n in below if asked.get(n, n) * factor <= asked.get(target, target)]
    return max(at_step) if at_step else max(below)


def extrapolation_rows(series: list[Series], refused: list[str], draws: int = 1000, level: float = 0.95,
                       seed: int = 0, factor: int = EXTRAPOLATE_FACTOR) -> list[dict]:
    """Per single model: its t2i R@1 predicted at each measured size from a smaller one (:func:`check_source`:
    the check, is the measured value inside the interval?), then at ``factor`` times the largest (capped by what
    the source holds), withheld when a check missed or could not be made, and labelled with what the checks
    support: ``checked at xF`` (a check of at least the prediction's step held), ``checked only at xF`` (the
    largest step checked is shorter than the prediction's), or ``unchecked`` (one size with distractors: no check)
    (:mod:`fusebench.evaluation.extrapolation`)."""
    rows = []
    for s in (s for s in series if not s.fusion and _exact(s)):
        sizes = [n for n in s.sizes() if n > 0]
        if not sizes:
            continue
        checks_held, steps = True, []
        asked_size = {n: asked(s.points[n][0]) or n for n in sizes}
        for target in sizes[1:]:
            source_size = check_source(sizes, target, factor, asked_size)
            prediction, problem = _prediction(s, source_size, target, draws, level, seed)
            if prediction is None:
                refused.append(f"{s.study}: {s.label}: no extrapolation from {source_size:,} distractors: {problem}")
                checks_held = False
                continue
            measured = s.points[target]
            value = recall_at_k(measured[0].ranks(measured[1], "t2i"), 1)
            inside = prediction.low <= value <= prediction.high
            checks_held &= inside
            steps.append(asked_size[target] / asked_size[source_size])  # the step asked (near-duplicates aside)
            rows.append(_row(s, source_size, target, prediction, value, inside,
                             "inside" if inside else "MISSED"))
        largest, run = sizes[-1], s.points[sizes[-1]][0]
        limit = source_limit(run)
        target = factor * largest if limit is None else min(factor * largest, limit)
        if target <= largest:
            refused.append(f"{s.study}: {s.label}: no prediction past {largest:,} distractors: the source holds "
                           f"{limit:,}, and a prediction never goes past its source")
            continue
        if not checks_held:
            refused.append(f"{s.study}: {s.label}: no prediction at {target:,} distractors: a check between the "
                           "sizes measured missed or could not be made (above), so the tail model does not hold here")
            continue
        if largest > COVERED_FROM:
            refused.append(f"{s.study}: {s.label}: no prediction from {largest:,} distractors: the interval's coverage "
                           f"is measured from galleries of at most {COVERED_FROM:,} (docs/galleries.md), and from "
                           "50,000 it missed on the simulators; the checks above are the evidence at this size")
            continue
        prediction, problem = _prediction(s, largest, target, draws, level, seed)
        if prediction is None:
            refused.append(f"{s.study}: {s.label}: no prediction from {largest:,} distractors: {problem}")
            continue
        rows.append(_row(s, largest, target, prediction, None, None, support(steps, target / largest)))
    return rows


def support(steps: list[float], step: float) -> str:
    """What the checks that held (their steps, to / from) say for a prediction of ``step``."""
    if not steps:
        return "unchecked"
    best = max(steps)
    return f"checked at x{_factor(best)}" if best >= step else f"checked only at x{_factor(best)}"


def _factor(step: float) -> str:
    return f"{step:.3g}"


def _exact(s: Series) -> bool:
    """Whether the series' lists come from exact search (an index's lists are not exact ranks: not extrapolated)."""
    return all(search_label(run, name) == EXACT for run, name in s.points.values())


def _row(s: Series, source_size: int, target: int, p: Prediction, measured: float | None,
         inside: bool | None, check: str) -> dict:
    return {"study": s.study, "model": s.label, "from": source_size, "to": target, "step": target / source_size,
            "predicted R@1": p.value, "low": p.low, "high": p.high, "measured R@1": measured, "inside": inside,
            "check": check,
            "measured - predicted": None if measured is None else measured - p.value,
            "queries pooled": p.pooled_queries, "margins pooled": p.margins, "method": METHOD}


@dataclass
class ScalingReport:
    """The study's tables (one dict per row, as summary.md and the scaling_*.csv files show them)."""

    simulated: bool
    ks: list[int]
    level: float
    series: list[Series]
    recall: list[dict]
    gains: list[dict]
    changes: list[dict]
    extrapolation: list[dict]
    refused: list[str]


def scaling_report(runs: list[Run], ks: list[int], draws: int, level: float, seed: int) -> ScalingReport | None:
    """The study over the sweep's runs, or None when no runs of one test split differ by gallery size."""
    found = studies(runs)
    if not found:
        return None
    series = [s for label, members in found for s in series_of(label, members)]
    refused: list[str] = []
    changes = change_rows(series, ks, draws, level, seed, refused)
    extrapolation = extrapolation_rows(series, refused, draws, level, seed)
    simulated = any(r.record.simulated for _, members in found for r in members)
    return ScalingReport(simulated, ks, level, series, recall_rows(series, ks, level), gain_rows(series, ks),
                         changes, extrapolation, refused)
