"""The index-effects study in a sweep's report: when a sweep's runs differ by search backend (``search=``,
``experiment=index_effects``), whether fusing through each backend beats not fusing, and what the backend costs the
fusion. One row per run and k (t2i), three paired differences, each query by query with its bootstrap interval:

- **fused through the backend minus the best single model searched exactly** (the sweep's exact run of the same
  dataset and models): the user's question, does fusion through my index beat what I would get without it? Its
  verdict (:func:`verdict`): "survives" when the interval over images lies above 0, "loses" when it lies below,
  "not distinguishable" otherwise;
- **fused through the backend minus the same fusion on exact lists** (the run's ``exact_fused``; for an engine, its
  preset over exact lists): what the index costs the fusion;
- **fused through the backend minus the best single model through the same backend**: the gain as the backend
  sees it.

No ratio of two gains is reported: a share of the exact gain has no interval, explodes near an exact gain of 0 and
passes 100% when the index hurts single models more than the fusion. Beside them: each model's neighbour recall
and top-1 agreement against exact search, an engine's parity with fusebench's exact preset, and what the index
cost (build, query time, latency, bytes).

A backend returns lists ``fusion.top_k`` deep per model: a query whose first correct item is past that depth counts
as missed.

Also the per-retriever search columns of cost.csv (:func:`search_cost`) and the ``search`` factor every sweep
table keys retrievers by (:func:`search_label`: a model's lists from an HNSW index are not the exact model's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fusebench import FUSED
from fusebench.evaluation.comparisons import compare, level_label
from fusebench.evaluation.record import Comparison
from fusebench.evaluation.search_record import EXACT_FUSED, EngineCost, IndexQuality, SearchRecord
from fusebench.fusion.config import FusionConfig, flat_settings
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


def _fusion_settings(run: Run) -> str:
    """The fused retriever's settings besides its method and preset that are not the defaults ('rrf_k=1'), and
    its models' weights where they differ from 1: what tells two fusions of one name apart."""
    fused = run.record.retrievers[FUSED]
    defaults = flat_settings(FusionConfig())
    settings = [f"{k}={v}" for k, v in flat_settings(fused.spec.fusion).items()
                if k not in ("method", "preset") and v != defaults.get(k)]
    weights = [run.record.retrievers[m].spec.weight for m in fused.members]
    if any(w != 1 for w in weights):
        settings.append("weights=" + "/".join(f"{w:g}" for w in weights))
    return ", ".join(settings)


VERDICTS = ("survives", "loses", "not distinguishable")


def verdict(low: float, high: float) -> str:
    """The verdict on a paired difference from its interval: "survives" (above 0), "loses" (below 0) or "not
    distinguishable" (the interval holds 0)."""
    return VERDICTS[0] if low > 0 else VERDICTS[1] if high < 0 else VERDICTS[2]


@dataclass(frozen=True)
class Bootstrap:
    """The report's bootstrap settings, used for every paired difference it computes."""

    draws: int = 2000
    level: float = 0.95
    seed: int = 0


def _paired(candidate: Run, cand_name: str, baseline: Run, base_name: str, k: int, boot: Bootstrap) -> Comparison:
    """``cand_name`` of ``candidate`` against ``base_name`` of ``baseline`` at t2i R@k, query by query (the runs
    answer the same queries: checked by the caller)."""
    return compare(cand_name, base_name, {DIRECTION: candidate.ranks(cand_name, DIRECTION)},
                   {DIRECTION: baseline.ranks(base_name, DIRECTION)}, {DIRECTION: candidate.clusters(DIRECTION)},
                   [k], boot.draws, boot.level, boot.seed, directions=(DIRECTION,))[0]


def _columns(prefix: str, c: Comparison | None) -> dict:
    """A paired difference's columns: value, intervals over queries and over images, wins, losses, p."""
    names = ("", "_ci_low", "_ci_high", "_cluster_ci_low", "_cluster_ci_high", "_wins", "_losses", "_p_value")
    if c is None:
        return {prefix + n: None for n in names}
    values = (c.gain, c.ci_low, c.ci_high, c.cluster_ci_low, c.cluster_ci_high, c.wins, c.losses, c.p_value)
    return {prefix + n: v for n, v in zip(names, values)}


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


def split_labels(runs: list[Run]) -> dict[tuple, str]:
    """What the study calls each test split (:attr:`Run.corpus_key`), whatever its gallery: its dataset's name and
    flags, numbered when two splits share one (the sentences follow a backend across gallery sizes of one split)."""
    names: dict[tuple, str] = {}
    for run in runs:
        d = run.record.dataset
        names.setdefault(run.corpus_key, d.name + (" (simulated)" if d.simulated else "")
                         + (" (non-standard)" if d.nonstandard else ""))
    seen: dict[str, int] = {}
    out = {}
    for key, name in names.items():
        seen[name] = seen.get(name, 0) + 1
        out[key] = name if list(names.values()).count(name) == 1 else f"{name} [test split {seen[name]}]"
    return out


def effect_row(runs: list[Run], run: Run, k: int, boot: Bootstrap) -> dict:
    """One run's row at t2i R@k (the columns of index_effects.csv): the three paired differences of the module's
    docstring, each with its intervals (``vs_exact_best``, ``vs_exact_fusion``, ``gain``), the verdict, and the
    backend's quality and cost."""
    record, search = run.record, run.record.search
    fused = record.retrievers[FUSED]
    best = record.best_single(DIRECTION, k, among=fused.members)
    gain = _paired(run, FUSED, run, best, k, boot) if best else None
    reference = exact_reference(runs, run)
    if reference is not None and not run.same_queries(reference):
        reference = None
    if reference is not None and k not in reference.record.ks:  # its best single at k is unknown, never guessed
        reference = None
    exact_best = None if reference is None else reference.record.best_single(DIRECTION, k,
                                                                               among=reference.record.singles)
    vs_best = None if exact_best is None else _paired(run, FUSED, reference, exact_best, k, boot)
    exact_fused = None if search is None else record.retrievers.get(EXACT_FUSED)
    vs_fusion = None if exact_fused is None else _paired(run, FUSED, run, EXACT_FUSED, k, boot)
    return {"dataset": dataset_labels(runs)[run.dataset_key], "test_split": split_labels(runs)[run.corpus_key],
            "run": run.name, "backend": search_label(run, FUSED),
            "distractors": 0 if record.gallery is None else int(record.gallery.distractors),
            "exact_query_ms": _exact_query_ms(run, fused.members),
            "version": None if search is None else search.version, "fusion": _fusion_name(run),
            "fusion_settings": _fusion_settings(run), "models": "+".join(fused.members), "k": k,
            "depth": None if search is None else search.depth, **_quality_columns(run, fused.members),
            "fused_recall": fused.t2i.at(k),
            "exact_best_single": exact_best,
            "exact_best_single_recall": None if vs_best is None else vs_best.baseline_recall,
            **_columns("vs_exact_best", vs_best),
            "verdict": None if vs_best is None else verdict(vs_best.cluster_ci_low, vs_best.cluster_ci_high),
            "exact_fused_recall": None if vs_fusion is None else vs_fusion.baseline_recall,
            **_columns("vs_exact_fusion", vs_fusion),
            "best_single": best, "best_single_recall": None if best is None else record.retrievers[best].t2i.at(k),
            **_columns("gain", gain), **_cost_columns(run)}


def _exact_query_ms(run: Run, members: list[str]) -> float | None:
    """An exact run's t2i search time per query over its gallery, summed over the fusion's models (recorded when
    the run searched the gallery itself; None otherwise, and for approximate runs: their index's query ms)."""
    gallery = run.record.gallery
    if run.record.search is not None or gallery is None:
        return None
    lists = run.record.run.lists or {}
    if not all("t2i_seconds" in (lists.get(m) or {}) for m in members):
        return None  # a record from before the search was timed per direction: its time covers i2t too
    times = [gallery.models[m].search_ms_per_query if m in gallery.models else None for m in members]
    return None if any(t is None for t in times) else float(sum(times))


def _interval_text(row: dict, prefix: str) -> str:
    """'+1.23 [+0.45, +2.01]': a paired difference with its interval over images (the verdict's interval); '-'
    without one (the report's one interval format, ``sweep_markdown._interval``)."""
    from fusebench.report.sweep_markdown import _interval  # lazy: cycle (report.sweep_markdown imports this one)

    return _interval(row, prefix, f"{prefix}_cluster_ci_low", f"{prefix}_cluster_ci_high", signed=True)


def _verdict_phrase(rows: list[dict]) -> str:
    """'survives at every gallery size measured', or 'loses at 10,000 and not distinguishable at 100,000'."""
    verdicts = [r["verdict"] for r in rows]
    if len(set(verdicts)) == 1 and len(rows) > 1:
        return f"{verdicts[0]} at every gallery size measured"
    parts = []
    for v in dict.fromkeys(verdicts):
        sizes = [f"{r['distractors']:,}" for r in rows if r["verdict"] == v]
        parts.append(f"{v} at {' and '.join(sizes)} distractors" if len(parts) == 0 else f"{v} at {' and '.join(sizes)}")
    return ", ".join(parts)


SETUP = ("test_split", "backend", "fusion", "fusion_settings", "models")  # what one sentence (one series) follows


def series(rows: list[dict]) -> dict[str, list[dict]]:
    """``rows`` grouped into series, one per test split, backend, fusion and its settings and models, each sorted by
    gallery size, under a label that says what tells it apart from the others: the split when there are several,
    the backend, and in brackets what differs between the series of that backend (the fusion, its settings, the
    models)."""
    keys = list(dict.fromkeys(tuple(r.get(c) for c in SETUP) for r in rows))
    splits = {k[0] for k in keys}
    out = {}
    for key in keys:
        same_backend = [k for k in keys if k[:2] == key[:2]]
        differ = [i for i in (2, 3, 4) if len({k[i] for k in same_backend}) > 1]
        extra = [f"{SETUP[i]} {key[i] or 'defaults'}" if i > 2 else str(key[i]) for i in differ]
        label = (f"{key[0]}: " if len(splits) > 1 else "") + str(key[1]) + (f" ({'; '.join(extra)})" if extra else "")
        out[label] = sorted((r for r in rows if tuple(r.get(c) for c in SETUP) == key), key=lambda r: r["distractors"])
    return out


def survival_sentences(effects: IndexEffects) -> list[str]:
    """One sentence per series (:func:`series`: a backend with one fusion of one model set on one test split), at
    the study's first k: whether fusing through it survives against the best single model searched exactly, at
    each gallery size (:func:`verdict` on the interval over images), with the paired differences, and what the
    backend costs the fusion against the same fusion on exact lists."""
    k = effects.ks[0]
    rows = [r for r in effects.rows if r["k"] == k and r.get("verdict") is not None]
    level = level_label(effects.level)
    out = []
    for label, mine in series(rows).items():
        subject = "fusion on exact lists" if mine[0]["backend"] == EXACT else "fusion through it"
        values = "; ".join(f"{r['distractors']:,}: {_interval_text(r, 'vs_exact_best')}" for r in mine)
        sentence = (f"{label}: {subject} {_verdict_phrase(mine)} (fused minus the best single model searched "
                    f"exactly, t2i R@{k}, points, {level} interval over images: {values})")
        costs = [r for r in mine if r.get("vs_exact_fusion") is not None]
        if costs:
            sentence += ("; against the same fusion on exact lists: "
                         + "; ".join(f"{r['distractors']:,}: {_interval_text(r, 'vs_exact_fusion')}" for r in costs))
        out.append(sentence + ".")
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
    notes: list[str] = field(default_factory=list)  # engine rules seen, runs without an exact run to set against


def index_effects_report(runs: list[Run], ks: list[int], draws: int = 2000, level: float = 0.95,
                         seed: int = 0) -> IndexEffects | None:
    """The study over the sweep's runs, or None when none ran an approximate backend; every paired difference
    with the report's bootstrap settings. Rows: per dataset, the exact runs first, then the others in sweep order;
    runs without a fused retriever are left out."""
    if not any(r.record.search is not None for r in runs):
        return None
    studied = [r for r in runs if FUSED in r.record.retrievers]
    labels = dataset_labels(runs)
    studied.sort(key=lambda r: (labels[r.dataset_key], r.record.search is not None))  # stable: sweep order kept
    boot = Bootstrap(draws, level, seed)
    notes: list[str] = []
    rows = []
    for run in studied:
        reference = exact_reference(runs, run)
        if reference is None:
            notes.append(f"{run.name}: no exact run of its dataset and models in the sweep: fused minus the best "
                         "single model searched exactly not computed")
        elif not run.same_queries(reference):
            notes.append(f"{run.name}: its queries are not those of {reference.name} (the exact run of its dataset "
                         "and models): fused minus the best single model searched exactly not computed")
        unmeasured = [k for k in ks if k in run.record.ks and reference is not None and k not in reference.record.ks]
        if unmeasured:
            notes.append(f"{run.name}: {reference.name} (the exact run of its dataset and models) did not measure "
                         f"t2i R@{', R@'.join(map(str, unmeasured))}: fused minus the best single model searched "
                         "exactly not computed there")
        if ks[0] not in run.record.ks:
            notes.append(f"{run.name}: it measured no t2i R@{ks[0]} (eval.ks={run.record.ks}), the study's first k: "
                         "no verdict for it in the sentences and plots (its other ks are in index_effects.csv)")
        for note in (run.record.search.notes if run.record.search else []):
            notes.append(f"{search_label(run, FUSED)}: {note}")
        rows += [effect_row(runs, run, k, boot) for k in ks if k in run.record.ks]
    return IndexEffects(any(r.record.simulated for r in studied), ks, level, _uniform(rows),
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
    """summary.md's "## Index effects": per backend, at the first k, fused through it minus the best single model
    searched exactly (with the verdict), minus the same fusion on exact lists, and its gain over its own best single
    model, each with its interval over images; what it cost."""
    if effects is None:
        return []
    from fusebench.report.sweep_markdown import _table  # lazy: cycle (report.sweep_markdown imports this one)

    k, level = effects.ks[0], level_label(effects.level)
    flag = " [SIMULATED: simulated models, not real results]" if effects.simulated else ""
    shown = [r for r in effects.rows if r["k"] == k]
    models = list(dict.fromkeys(c.split(" ", 1)[1] for r in shown for c in r if c.startswith("neighbour_recall ")))

    def per_model(row: dict, column: str) -> str:
        values = [row.get(f"{column} {m}") for m in models]
        return "-" if all(v is None for v in values) else " / ".join("-" if v is None else f"{v:.3f}" for v in values)

    table = [{"backend": r["backend"], "fusion": r["fusion"], "distractors": f"{r['distractors']:,}",
              f"neighbour recall ({' / '.join(models)})": per_model(r, "neighbour_recall"),
              "top-1 agreement": per_model(r, "top1_agreement"), f"fused t2i R@{k}": r["fused_recall"],
              "minus best single, exact": _interval_text(r, "vs_exact_best"), "verdict": r["verdict"],
              "minus same fusion, exact": _interval_text(r, "vs_exact_fusion"),
              "minus best single, same backend": _interval_text(r, "gain"),
              "identical top-10": r["identical_top10"], "build s": r["build_s"], "query ms": r["query_ms"],
              "p95 ms": r["latency_ms_p95"], "index / disk": _bytes(r["index_bytes"] if r["index_bytes"] is not None
                                                              else r["disk_bytes"])}
             for r in shown]
    apart = [(c, n) for c, n in (("fusion_settings", "fusion settings"), ("models", "models"))
             if len({r.get(c) for r in shown}) > 1]  # shown where they tell rows of one backend apart
    table = [{**{c: v for c, v in list(t.items())[:2]}, **{n: r.get(c) or "defaults" for c, n in apart},
              **dict(list(t.items())[2:])} for r, t in zip(shown, table)]
    if len({r["dataset"] for r in shown}) > 1:
        table = [{"dataset": r["dataset"], **t} for r, t in zip(shown, table)]
    lines = [f"## Index effects{flag}", "",
             f"t2i R@{k}, the fused retriever through each backend (every k in index_effects.csv; plots: "
             "plots/index_effects.png, plots/index_verdict.png). Three paired differences, query by query, in "
             f"points with the {level} bootstrap interval over images (each image's captions resampled together; "
             "the interval over queries is in index_effects.csv): fused through the backend minus the best single "
             "model searched exactly (the sweep's exact run of the same dataset and models: does fusing through the "
             "index beat not fusing?), minus the same fusion on exact lists (what the index costs the fusion; an "
             "engine's: its preset over exact lists), and minus the best single model through the same backend. "
             "Verdict: survives when the first interval lies above 0, loses when it lies below, not "
             "distinguishable otherwise. A backend returns each model's list to its depth (fusion.top_k): a query "
             "whose first correct item is past it counts as missed. Identical top-10: an engine's fused lists "
             "against fusebench's exact preset of that engine. Neighbour recall: the share of exact search's top "
             "list (at the list depth) the index returned. Query ms: t2i, per query, summed over the fused models "
             "(an engine: its own fused search).", "",
             _table(table, list(table[0])) if table else "No run with a fused retriever.", ""]
    sentences = survival_sentences(effects)
    if sentences:
        lines += ["Does fusing through each backend beat the best single model searched exactly?", "",
                  *[f"- {x}" for x in sentences], "",
                  "Plots: plots/index_recall_time.png (the fused retriever's R@1 against query time per backend), "
                  "plots/index_verdict.png (fused through each backend minus the best single model searched exactly, "
                  "with its interval, against gallery size).", ""]
    if effects.notes:
        lines += ["Notes:", "", *[f"- {n}" for n in effects.notes], ""]
    return lines
