"""The index-effects study in a sweep's report: when a sweep's runs differ by search backend (``search=``,
``experiment=index_effects``), how much of the fusion gain each backend keeps. One row per run and k (t2i): the
backend, its index's neighbour recall and top-1 agreement against exact search per model, the fused recall and
its gain over the best single model (both from the backend's lists; the run's own paired comparison), the same
fusion over exact lists and the paired exact-minus-backend difference, the share of the exact gain kept, an
engine's parity with fusebench's exact preset, and what the index cost (build, query time, latency, bytes).

A backend returns lists ``fusion.top_k`` deep per model: a query whose first correct item is past that depth counts
as missed. The exact gain a backend's gain is set against is that of the same fusion on exact lists (the run's
``exact_fused``) over the best single model of the sweep's exact run on the same dataset and models (an engine
fuses by its own preset, so its exact gain is that preset's, not the exact run's fusion's).

Also the per-retriever search columns of cost.csv (:func:`search_cost`) and the ``search`` factor every sweep
table keys retrievers by (:func:`search_label`: a model's lists from an HNSW index are not the exact model's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fusebench import FUSED
from fusebench.evaluation.comparisons import level_label
from fusebench.evaluation.search_record import EXACT_FUSED, EngineCost, IndexQuality, SearchRecord
from fusebench.report.labels import dataset_labels
from fusebench.report.runs import Run

EXACT = "exact"  # the search label of exact lists (search=exact, and every run's exact_fused)
DIRECTION = "t2i"  # the study's direction (costs and qualities are the t2i index's: images searched by captions)
COST_COLUMNS = ("search", "index_bytes", "build_s", "query_ms_index", "neighbour_recall_t2i", "engine_ingest_s",
                "latency_ms_median", "latency_ms_p95", "disk_bytes")  # cost.csv, after its other columns


def search_label(run: Run, name: str) -> str:
    """Who answered retriever ``name``'s queries in ``run``: the backend's label, or ``exact`` (an exact run, and
    the exact-list fusion every approximate run evaluates beside its backend's)."""
    search = run.record.search
    return EXACT if search is None or name == EXACT_FUSED else search.label


def _total(values) -> float | int | None:
    """The sum when every value is known, else None (a part read from the store has no build time)."""
    values = list(values)
    return None if not values or any(v is None for v in values) else sum(values)


def _quality(search: SearchRecord, model: str) -> IndexQuality | None:
    return (search.models.get(model) or {}).get(DIRECTION)


def engine_query_ms(run: Run, cost: EngineCost) -> float | None:
    """An engine's search time per t2i query (its batched search over every query of the direction)."""
    n = next(iter(run.record.retrievers.values())).t2i.n_queries
    return 1000.0 * cost.search_seconds / n if n else None


def search_cost(run: Run, name: str) -> dict:
    """cost.csv's search columns for one retriever (:data:`COST_COLUMNS`), t2i: a model's index (its bytes,
    build time, query time, neighbour recall); a fusion's summed over its models' indexes, or the engine's own
    (build, ingestion, per-query search time, request latency, disk); blank for exact lists."""
    out = dict.fromkeys(COST_COLUMNS)
    out["search"] = search_label(run, name)
    search = run.record.search
    if out["search"] == EXACT:
        return out
    result = run.record.retrievers[name]
    if not result.is_fusion:
        q = _quality(search, name)
        if q is not None:
            out.update(index_bytes=q.index_bytes, build_s=q.build_seconds, query_ms_index=q.query_ms,
                       neighbour_recall_t2i=q.neighbour_recall)
        return out
    qualities = [_quality(search, m) for m in result.members]
    known = [q for q in qualities if q is not None]
    if len(known) == len(qualities):
        out.update(index_bytes=_total(q.index_bytes for q in known), build_s=_total(q.build_seconds for q in known),
                   query_ms_index=_total(q.query_ms for q in known))
    engine = search.engine.get(DIRECTION)
    if engine is not None:
        out.update(build_s=engine.build_seconds, query_ms_index=engine_query_ms(run, engine),
                   engine_ingest_s=engine.ingest_seconds, latency_ms_median=engine.latency_ms_median,
                   latency_ms_p95=engine.latency_ms_p95, disk_bytes=engine.disk_bytes)
    return out


def _models_key(run: Run) -> tuple:
    """The run's single models as what they are (spec identity and text settings), for finding its exact run."""
    return tuple(sorted(json.dumps([run.record.retrievers[n].spec.identity(), run.record.retrievers[n].spec.text],
                                   sort_keys=True) for n in run.record.singles))


def exact_reference(runs: list[Run], run: Run) -> Run | None:
    """The sweep's exact run of ``run``'s dataset and models (``run`` itself when it is exact), or None."""
    if run.record.search is None:
        return run
    return next((r for r in runs if r.record.search is None and r.dataset_key == run.dataset_key
                 and _models_key(r) == _models_key(run)), None)


def _fusion_name(run: Run) -> str:
    fusion = run.record.retrievers[FUSED].spec.fusion
    return fusion.preset or fusion.method


def _exact_gain(reference: Run | None, run: Run, k: int) -> float | None:
    """The gain the run's fusion makes on exact lists: its exact-list fusion's t2i R@k minus the best single model
    of the exact run (the exact run's own recorded gain, for the exact run itself)."""
    if reference is None:
        return None
    if reference is run:
        best = run.record.best_single(DIRECTION, k, among=run.record.retrievers[FUSED].members)
        c = run.record.comparison(FUSED, best, DIRECTION, k) if best else None
        return None if c is None else c.gain
    exact_fused = run.record.retrievers.get(EXACT_FUSED)
    best = reference.record.best_single(DIRECTION, k, among=reference.record.singles)
    if exact_fused is None or best is None:
        return None
    fused_r, best_r = exact_fused.t2i.at(k), reference.record.retrievers[best].t2i.at(k)
    return None if fused_r is None or best_r is None else fused_r - best_r


def _quality_columns(run: Run, models: list[str]) -> dict:
    search = run.record.search
    out = {}
    for m in models:
        q = None if search is None else _quality(search, m)
        out[f"neighbour_recall {m}"] = None if q is None else q.neighbour_recall
        out[f"top1_agreement {m}"] = None if q is None else q.top1_agreement
    return out


def _cost_columns(run: Run) -> dict:
    """The backend's cost in the study's direction: FAISS summed over the models' indexes, an engine's own."""
    cost = search_cost(run, FUSED)
    search = run.record.search
    parity = None if search is None else search.parity.get(DIRECTION)
    return {"identical_top1": None if parity is None else parity.identical_top1,
            "identical_top10": None if parity is None else parity.identical_top10,
            "parity_differ": None if parity is None else parity.differ,
            "parity_explained": None if parity is None else parity.explained,
            "build_s": cost["build_s"], "ingest_s": cost["engine_ingest_s"], "query_ms": cost["query_ms_index"],
            "latency_ms_median": cost["latency_ms_median"], "latency_ms_p95": cost["latency_ms_p95"],
            "index_bytes": cost["index_bytes"], "disk_bytes": cost["disk_bytes"]}


def effect_row(runs: list[Run], run: Run, k: int) -> dict:
    """One run's row at t2i R@k (the columns of index_effects.csv)."""
    record, search = run.record, run.record.search
    fused = record.retrievers[FUSED]
    best = record.best_single(DIRECTION, k, among=fused.members)
    gain = record.comparison(FUSED, best, DIRECTION, k) if best else None
    diff = None if search is None else record.comparison(EXACT_FUSED, FUSED, DIRECTION, k)
    exact_fused = fused if search is None else record.retrievers.get(EXACT_FUSED)
    exact_gain = _exact_gain(exact_reference(runs, run), run, k)
    kept = None
    if gain is not None and exact_gain is not None and exact_gain > 0:
        kept = 1.0 if search is None else gain.gain / exact_gain
    return {"dataset": dataset_labels(runs)[run.dataset_key], "run": run.name, "backend": search_label(run, FUSED),
            "distractors": 0 if record.gallery is None else int(record.gallery.distractors),
            "exact_query_ms": _exact_query_ms(run, fused.members),
            "version": None if search is None else search.version, "fusion": _fusion_name(run), "k": k,
            "depth": None if search is None else search.depth, **_quality_columns(run, fused.members),
            "fused_recall": fused.t2i.at(k), "best_single": best,
            "best_single_recall": None if best is None else record.retrievers[best].t2i.at(k),
            "gain": None if gain is None else gain.gain, "ci_low": None if gain is None else gain.ci_low,
            "ci_high": None if gain is None else gain.ci_high,
            "cluster_ci_low": None if gain is None else gain.cluster_ci_low,
            "cluster_ci_high": None if gain is None else gain.cluster_ci_high,
            "exact_fused_recall": None if exact_fused is None else exact_fused.t2i.at(k),
            "exact_minus_backend": None if diff is None else diff.gain,
            "diff_ci_low": None if diff is None else diff.ci_low, "diff_ci_high": None if diff is None else diff.ci_high,
            "diff_p_value": None if diff is None else diff.p_value,
            "exact_gain": exact_gain, "gain_kept": kept, **_cost_columns(run)}


def _exact_query_ms(run: Run, members: list[str]) -> float | None:
    """An exact run's t2i search time per query over its gallery, summed over the fusion's models (recorded when
    the run searched the gallery itself; None otherwise, and for approximate runs: their index's query ms)."""
    gallery = run.record.gallery
    if run.record.search is not None or gallery is None:
        return None
    times = [gallery.models[m].search_ms_per_query if m in gallery.models else None for m in members]
    return None if any(t is None for t in times) else float(sum(times))


def survival_sentences(effects: IndexEffects) -> list[str]:
    """One sentence per backend: at which gallery sizes the fusion's gain over the best single model survives
    through it (its interval over queries above 0, at the study's first k), and how much of the exact gain it
    keeps."""
    k = effects.ks[0]
    rows = [r for r in effects.rows if r["k"] == k and r["gain"] is not None]
    out = []
    for backend in dict.fromkeys(r["backend"] for r in rows):
        mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["distractors"])
        held = [r for r in mine if r["ci_low"] > 0]
        sizes = ", ".join(f"{r['distractors']:,}" for r in mine)
        kept = [r["gain_kept"] for r in mine if r["gain_kept"] is not None and backend != EXACT]
        low, high = (f"{100 * min(kept):.0f}%", f"{100 * max(kept):.0f}%") if kept else (None, None)
        share = "" if not kept else f", keeping {low if low == high else f'{low}-{high}'} of the exact gain"
        if len(held) == len(mine):
            verdict = f"survives at every gallery size measured ({sizes} distractors)"
        elif not held:
            verdict = f"does not survive at any gallery size measured ({sizes} distractors: no interval above 0)"
        else:
            kept_at = ", ".join(f"{r['distractors']:,}" for r in held)
            lost_at = ", ".join(f"{r['distractors']:,}" for r in mine if r["ci_low"] <= 0)
            verdict = f"survives at {kept_at} distractors, not at {lost_at} (interval not above 0)"
        below = [r for r in mine if r.get("diff_ci_low") is not None and r["diff_ci_low"] > 0]
        cost = "" if not below else (f"; its fused R@{k} is below the same fusion on exact lists at "
                                     + ", ".join(f"{r['distractors']:,} ({r['exact_minus_backend']:+.2f})"
                                                 for r in below))
        out.append(f"{backend}: the fusion's t2i R@{k} gain {verdict}{share}{cost}.")
    return out


def _uniform(rows: list[dict]) -> list[dict]:
    """Every row with every column (the models' quality columns differ between studies of other models)."""
    columns = list(dict.fromkeys(c for r in rows for c in r))
    return [{c: r.get(c) for c in columns} for r in rows]


@dataclass
class IndexEffects:
    """The study's rows (index_effects.csv) and what summary.md says beside them."""

    simulated: bool
    ks: list[int]
    level: float
    rows: list[dict]
    exact_gains: dict[str, float]  # dataset -> the exact run's fused gain at the first k (the plot's line)
    notes: list[str] = field(default_factory=list)  # engine rules seen, runs without an exact run to set against


def index_effects_report(runs: list[Run], ks: list[int]) -> IndexEffects | None:
    """The study over the sweep's runs, or None when none ran an approximate backend. Rows: per dataset, the exact
    runs first, then the others in sweep order; runs without a fused retriever are left out."""
    if not any(r.record.search is not None for r in runs):
        return None
    studied = [r for r in runs if FUSED in r.record.retrievers]
    labels = dataset_labels(runs)
    studied.sort(key=lambda r: (labels[r.dataset_key], r.record.search is not None))  # stable: sweep order kept
    notes: list[str] = []
    rows, exact_gains = [], {}
    for run in studied:
        if run.record.search is not None and exact_reference(runs, run) is None:
            notes.append(f"{run.name}: no exact run of its dataset and models in the sweep: gain kept not computed")
        for note in (run.record.search.notes if run.record.search else []):
            notes.append(f"{search_label(run, FUSED)}: {note}")
        for k in [k for k in ks if k in run.record.ks]:
            row = effect_row(runs, run, k)
            rows.append(row)
            if run.record.search is None and k == ks[0] and row["gain"] is not None:
                exact_gains.setdefault(row["dataset"], row["gain"])
    level = studied[0].record.level if studied else 0.95
    return IndexEffects(any(r.record.simulated for r in studied), ks, level, _uniform(rows), exact_gains,
                        list(dict.fromkeys(notes)))


def _bytes(value) -> str | None:
    """'3.2 MB' (decimal units, as cost.csv's GB columns)."""
    if value is None:
        return None
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def markdown_section(effects: IndexEffects | None) -> list[str]:
    """summary.md's "## Index effects": each backend's fused gain at the first k, with what it cost."""
    if effects is None:
        return []
    from fusebench.report.sweep_markdown import _interval, _table

    k, level = effects.ks[0], level_label(effects.level)
    flag = " [SIMULATED: simulated models, not real results]" if effects.simulated else ""
    shown = [r for r in effects.rows if r["k"] == k]
    models = list(dict.fromkeys(c.split(" ", 1)[1] for r in shown for c in r if c.startswith("neighbour_recall ")))

    def per_model(row: dict, column: str) -> str:
        values = [row.get(f"{column} {m}") for m in models]
        return "-" if all(v is None for v in values) else " / ".join("-" if v is None else f"{v:.3f}" for v in values)

    table = [{"backend": r["backend"], "fusion": r["fusion"], f"neighbour recall ({' / '.join(models)})":
              per_model(r, "neighbour_recall"), "top-1 agreement": per_model(r, "top1_agreement"),
              f"fused t2i R@{k}": r["fused_recall"], "best single": r["best_single"],
              "gain over it": _interval(r, "gain", "ci_low", "ci_high", True),
              f"exact fused R@{k}": r["exact_fused_recall"],
              "exact - backend": _interval(r, "exact_minus_backend", "diff_ci_low", "diff_ci_high", True),
              "gain kept": None if r["gain_kept"] is None else f"{100 * r['gain_kept']:.0f}%",
              "identical top-10": r["identical_top10"], "build s": r["build_s"], "query ms": r["query_ms"],
              "p95 ms": r["latency_ms_p95"], "index / disk": _bytes(r["index_bytes"] if r["index_bytes"] is not None
                                                              else r["disk_bytes"])}
             for r in shown]
    if len({r["dataset"] for r in shown}) > 1:
        table = [{"dataset": r["dataset"], **t} for r, t in zip(shown, table)]
    lines = [f"## Index effects{flag}", "",
             f"t2i R@{k}, each backend's own lists (every k in index_effects.csv; plot: plots/index_effects.png). "
             "A backend returns each model's list to its depth (fusion.top_k): a query whose first correct item is "
             "past it counts as missed. Gain: the fused lists over the best single model's, both the backend's "
             f"(the run's paired comparison, {level} bootstrap interval over queries). Exact - backend: the same "
             "fusion over exact lists minus the backend's, query by query. Gain kept: the gain over the gain of the "
             "same fusion on exact lists over the exact run's best single model. Identical top-10: an engine's "
             "fused lists against fusebench's exact preset of that engine. Neighbour recall: the share of exact "
             "search's top list (at the list depth) the index returned.", "", _table(table, list(table[0])) if table
             else "No run with a fused retriever.", ""]
    sentences = survival_sentences(effects)
    if sentences:
        lines += ["Does the fusion's gain survive each backend?", "", *[f"- {x}" for x in sentences], "",
                  "Plots: plots/index_recall_time.png (the fused retriever's R@1 against query time per backend), "
                  "plots/index_gain_kept.png (the share of the exact gain kept against gallery size).", ""]
    if effects.notes:
        lines += ["Notes:", "", *[f"- {n}" for n in effects.notes], ""]
    return lines
