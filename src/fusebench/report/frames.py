"""pandas DataFrames over run records, to explore a sweep (or any folder of run dirs) in a notebook.

- :func:`run_frame`: one row per run (its dir, the overrides it ran with, its dataset, its headline retriever);
- :func:`retriever_frame`: one row per run x retriever x direction x k: recall, its Wilson interval, settings;
- :func:`comparison_frame`: one row per paired comparison a run recorded (gain, intervals, wins/losses, p);
- :func:`pair_frame`: the sweep report's pairs across runs (one factor apart), computed from the saved ranks;
- :func:`outcome_frame` / :func:`query_frame`: one row per query of one run: every retriever's rank, won or lost
  by a candidate against a baseline, and (query_frame) the query's text and image from the run's corpus.

Values are the record's, unchanged (``metrics.json``; :mod:`fusebench.evaluation.record`). pandas is imported
here only; the commands never import this module (it is the ``notebook`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd

from fusebench import DIRECTIONS, FusebenchError
from fusebench.config.specs import DEFAULT_WEIGHT
from fusebench.evaluation.metrics import hits_at_k
from fusebench.report.notebook import run_corpus
from fusebench.report.plots import wilson
from fusebench.report.runs import Run, load_runs
from fusebench.runtime import checks

OUTCOMES = ("won", "lost", "both hit", "both missed")  # a query, candidate against baseline, at R@k
__all__ = ["as_runs", "comparison_frame", "default_pair", "outcome_frame", "pair_frame", "query_frame",
           "retriever_frame", "run_frame"]


# --- the record's sub-records (fusebench.evaluation.subrecords), read here only: adapt these when they change ---

def _field(sub, name: str, default=None):
    """A sub-record's field (a typed part of the record, or a mapping in it such as a model's text settings)."""
    if sub is None:
        return default
    value = sub.get(name, default) if isinstance(sub, Mapping) else getattr(sub, name, default)
    return default if value is None else value


def dataset_columns(run: Run) -> dict:
    """The dataset a run evaluated: its name, size, whether it is simulated, and its test split's content digest
    (``corpus_digest``: runs pair query by query only when it is equal; None in records written before it)."""
    d = run.record.dataset
    return {"dataset": _field(d, "name"), "n_images": _field(d, "n_images"), "n_captions": _field(d, "n_captions"),
            "simulated": bool(_field(d, "simulated", False)), "corpus_digest": _field(d, "digest")}


def _preprocessing(spec) -> str:
    """A model's query preprocessing: its case (as_typed, canonicalize, lowercase) and template, if any."""
    text = _field(spec, "text")
    template = _field(text, "template")
    return _field(text, "case", "as_typed") + (f" template={template!r}" if template else "")


def _fusion_settings(spec):
    """A fusion's settings (method, fuse_on, top_k, ...): the FusionConfig its record holds."""
    return getattr(spec, "fusion", spec)


def retriever_columns(run: Run, name: str, label: str | None = None) -> dict:
    """What a retriever is: a model or a fusion, its models, their preprocessing and weights, the fusion settings
    (None for a single model), and the label the sweep report gives it (``label``: among the runs shown; else
    its base label, :func:`fusebench.report.retrievers.describe`)."""
    from fusebench.report.retrievers import describe  # lazy: heavy (scipy)

    result = run.record.retrievers[name]
    members = result.members or [name]
    specs = [run.record.retrievers[m].spec for m in members]
    fusion = _fusion_settings(result.spec) if result.is_fusion else None
    return {"retriever": name, "label": label or describe(run, name), "kind": "fusion" if result.is_fusion else "single",
            "models": " + ".join(members), "preprocessing": " + ".join(_preprocessing(s) for s in specs),
            "weights": " + ".join(f"{float(_field(s, 'weight', DEFAULT_WEIGHT)):g}" for s in specs),
            "method": _field(fusion, "method"), "preset": _field(fusion, "preset"),
            "fuse_on": _field(fusion, "fuse_on"), "top_k": _field(fusion, "top_k"),
            "final_top_k": _field(fusion, "final_top_k")}


def run_columns(run: Run) -> dict:
    """Where a run is (its dir, its name: the overrides it ran with), its dataset, and each override as a
    column ``override.KEY`` (the factors a sweep varied)."""
    overrides = {}
    for text in run.overrides:
        overrides[f"override.{checks.override_key(text)}"] = text.partition("=")[2]
    return {"run": run.name, "run_dir": str(run.path), **dataset_columns(run), **overrides}


def _run_seconds(run: Run) -> dict:
    return {"seconds": _field(run.record.run, "seconds"), "query_ms": _field(run.record.run, "query_ms")}


# --- frames ---

def as_runs(source) -> list[Run]:
    """The finished runs of ``source``: a sweep dir or any folder of run dirs (every intact run below it), a
    :class:`Run`, or a list of them."""
    if isinstance(source, Run):
        return [source]
    if isinstance(source, (str, Path)):
        return load_runs(source)[0]
    return list(source)


def run_frame(source) -> pd.DataFrame:
    """One row per run: run, run_dir, dataset columns, overrides, the headline retriever (its fusion, else its
    first model) with its settings, how many retrievers and comparisons, seconds and query_ms."""
    rows = []
    for run in as_runs(source):
        record = run.record
        rows.append({**run_columns(run), "headline": record.headline,
                     **{k: v for k, v in retriever_columns(run, record.headline).items() if k != "retriever"},
                     "retrievers": len(record.retrievers), "comparisons": len(record.comparisons),
                     **_run_seconds(run)})
    return pd.DataFrame(rows)


def retriever_frame(source, unique: bool = False, directions=DIRECTIONS) -> pd.DataFrame:
    """One row per run x retriever x direction x k (the run's ``eval.ks``): recall (percent), its Wilson
    interval at the run's level (``recall_ci_low``, ``recall_ci_high``: the interval the run's recall plot
    draws), median_rank and n_queries, beside the run's and the retriever's columns. ``unique``: each distinct
    retriever once per dataset (a single model evaluated in several jobs counts once, as in the sweep report)."""
    from fusebench.report.retrievers import retriever_labels, unique_retrievers  # lazy: heavy (scipy)

    runs = as_runs(source)
    pairs = unique_retrievers(runs) if unique else [(run, name) for run in runs for name in run.record.retrievers]
    labels = retriever_labels(runs)
    rows = []
    for run, name in pairs:
        record, result = run.record, run.record.retrievers[name]
        settings = {**run_columns(run), **retriever_columns(run, name, labels[(run.path, name)])}
        for direction in directions:
            metrics = result.direction(direction)
            for k in record.ks:
                recall = metrics.at(k)
                low, high = (None, None) if recall is None else wilson(recall, metrics.n_queries, record.level)
                rows.append({**settings, "direction": direction, "k": k, "recall": recall, "recall_ci_low": low,
                             "recall_ci_high": high, "level": record.level, "median_rank": metrics.median_rank,
                             "n_queries": metrics.n_queries})
    return pd.DataFrame(rows)


def _is_best_single(run: Run, comparison) -> bool | None:
    """Whether a comparison's baseline is its candidate's best single model (:meth:`RunRecord.best_single` among
    the fusion's models) at its direction and k; None for a comparison on an extra-positive metric."""
    if comparison.metric:
        return None
    record = run.record
    candidate = record.retrievers[comparison.candidate]
    among = candidate.members or [n for n in record.singles if n != comparison.candidate]
    return comparison.baseline == record.best_single(comparison.direction, comparison.k, among=among)


def comparison_frame(source) -> pd.DataFrame:
    """One row per paired comparison each run recorded (its fusions against each single model, and on extra
    positives when the run has them): every field of :class:`fusebench.evaluation.record.Comparison` as the
    record holds it (gain, ci_low, ci_high, cluster_ci_low, cluster_ci_high, wins, losses, p_value, recalls,
    n_queries, level, draws), ``metric`` (``R@k``, or e.g. ``eccv mAP@R``), ``vs_best_single``, the labels of
    candidate and baseline, and the run's and the candidate's columns."""
    from fusebench.report.retrievers import retriever_labels  # lazy: heavy (scipy)

    rows = []
    runs = as_runs(source)
    labels = retriever_labels(runs)
    for run in runs:
        for comparison in [*run.record.comparisons, *run.record.positive_comparisons]:
            values = {f.name: getattr(comparison, f.name) for f in fields(comparison)}
            values["metric"] = comparison.metric or f"R@{comparison.k}"
            settings = {k: v for k, v in retriever_columns(run, comparison.candidate).items()
                        if k not in ("retriever", "label")}
            rows.append({**run_columns(run), **values, "vs_best_single": _is_best_single(run, comparison),
                         "candidate_label": labels[(run.path, comparison.candidate)],
                         "baseline_label": labels[(run.path, comparison.baseline)], **settings})
    return pd.DataFrame(rows)


def pair_frame(source, draws: int = 2000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """The sweep report's paired gains (``gains.csv``: retrievers of different runs one factor apart, and each
    fusion against its best single model), computed here from the runs' saved ranks with ``draws``."""
    from fusebench.report.sweep import paired_gain_rows  # lazy: heavy (scipy)

    runs = as_runs(source)
    ks = sorted({k for run in runs for k in run.record.ks}) or [1]
    return pd.DataFrame(paired_gain_rows(runs, ks, draws=draws, level=level, seed=seed))


def default_pair(run: Run, direction: str = "t2i", k: int = 1, candidate: str | None = None) -> tuple[str, str]:
    """(candidate, baseline) to compare query by query: ``candidate`` (default: the run's headline, its fusion
    when it has one) and its best single model at ``direction`` and ``k`` (among the fusion's models; for a
    single model, among the run's other single models)."""
    record = run.record
    candidate = candidate or record.headline
    if candidate not in record.retrievers:
        raise FusebenchError(f"run {run.name!r} has no retriever {candidate!r}; it has {', '.join(record.retrievers)}")
    among = record.retrievers[candidate].members or [n for n in record.singles if n != candidate]
    baseline = record.best_single(direction, k, among=among)
    if baseline is None and among and k not in record.ks:
        raise FusebenchError(f"run {run.name!r} measured no {direction} R@{k}: k is one of {record.ks}")
    if baseline is None:
        raise FusebenchError(f"run {run.name!r} has no single model to compare {candidate!r} with")
    return candidate, baseline


def _first_items(run: Run, name: str, direction: str) -> np.ndarray:
    """The item each query's list put first (image index for t2i, caption index for i2t; -1 for none)."""
    with np.load(run.path / "topk" / f"{name}.{direction}.npz") as data:
        ids = data["ids"]
    return ids[:, 0].astype(np.int64) if ids.ndim == 2 and ids.shape[1] else np.full(len(ids), -1, dtype=np.int64)


def outcome_frame(run: Run, direction: str = "t2i", k: int = 1, candidate: str | None = None,
                  baseline: str | None = None) -> pd.DataFrame:
    """One row per query of ``run`` (``query``: its row in the rank files): ``image`` (t2i: the caption's image;
    i2t: the query image; index into the run's images), ``outcome`` of ``candidate`` against ``baseline`` at
    R@k (won: only the candidate finds the correct item within k; lost: only the baseline; both hit; both
    missed), ``rank NAME`` of every retriever (rank of the first correct item, 1-based; 0: not in its list),
    and ``first NAME`` (the item each of the two put first). Defaults: :func:`default_pair`. ``frame.attrs``
    holds the choices."""
    if candidate is None or baseline is None:
        candidate, best = default_pair(run, direction, k, candidate)
        baseline = baseline or best

    ranks = {name: run.ranks(name, direction) for name in run.record.retrievers}
    hit_c, hit_b = hits_at_k(ranks[candidate], k), hits_at_k(ranks[baseline], k)
    outcome = np.select([hit_c & ~hit_b, ~hit_c & hit_b, hit_c & hit_b], list(OUTCOMES[:3]), OUTCOMES[3])
    has_queries = (run.path / "ranks" / "queries.npz").is_file()
    frame = pd.DataFrame({"query": np.arange(len(outcome)),
                          "image": run.clusters(direction) if has_queries else None, "outcome": outcome,
                          **{f"rank {name}": r for name, r in ranks.items()},
                          **{f"first {name}": _first_items(run, name, direction) for name in dict.fromkeys(
                              [candidate, baseline])}})
    frame.attrs.update(run=run.name, run_dir=str(run.path), direction=direction, k=k, candidate=candidate,
                       baseline=baseline)
    return frame


def _corpus_problem(run: Run, corpus, direction: str, frame: pd.DataFrame) -> str | None:
    """Why ``corpus`` is not the one the run evaluated (its queries differ), or None."""
    images = corpus.caption_image if direction == "t2i" else corpus.i2t_query_images
    if len(images) != len(frame):
        return f"the corpus has {len(images)} {direction} queries, the run {len(frame)}"
    if frame["image"].notna().all() and not np.array_equal(frame["image"].to_numpy(dtype=np.int64), images):
        return "the corpus's queries are not the run's (ranks/queries.npz differs)"
    return None


def query_frame(run: Run, direction: str = "t2i", k: int = 1, candidate: str | None = None,
                baseline: str | None = None, corpus=None) -> pd.DataFrame:
    """:func:`outcome_frame` with the queries from the run's corpus (``corpus``, default: rebuilt from the run's
    saved config, :func:`fusebench.report.notebook.run_corpus`): ``text`` (t2i: the caption; i2t: None),
    ``image_id`` and ``image_path`` of the query's image (its correct image for t2i; None where the dataset
    has no image files, as sim), and for the two retrievers compared ``first NAME id`` (t2i: image id; i2t:
    the caption) and, for t2i, ``first NAME path``. When the corpus cannot be rebuilt here or is not the one
    the run evaluated (a tuning split held images out), those columns are missing and ``frame.attrs["note"]``
    says why."""
    frame = outcome_frame(run, direction, k, candidate, baseline)
    if corpus is None:
        try:
            corpus = run_corpus(run)
        except (FusebenchError, OSError) as err:
            frame.attrs["note"] = f"no query texts or images: the run's corpus cannot be rebuilt here ({err})"
            return frame
    problem = _corpus_problem(run, corpus, direction, frame)
    if problem:
        frame.attrs["note"] = f"no query texts or images: {problem}"
        return frame
    paths = corpus.image_paths or [None] * corpus.n_images
    images = corpus.caption_image if direction == "t2i" else corpus.i2t_query_images
    frame.insert(2, "text", [corpus.captions[i] for i in frame["query"]] if direction == "t2i" else None)
    frame.insert(3, "image_id", [corpus.image_ids[i] for i in images])
    frame.insert(4, "image_path", [paths[i] for i in images])
    for name in dict.fromkeys([frame.attrs["candidate"], frame.attrs["baseline"]]):
        first = frame[f"first {name}"].to_numpy()
        labels = corpus.image_ids if direction == "t2i" else corpus.captions
        frame[f"first {name} id"] = [labels[i] if i >= 0 else None for i in first]
        if direction == "t2i":
            frame[f"first {name} path"] = [paths[i] if i >= 0 else None for i in first]
    frame.attrs["note"] = "" if corpus.image_paths else f"the dataset {corpus.name!r} has no image files" + (
        " (simulated)" if run.record.simulated else "")
    return frame
