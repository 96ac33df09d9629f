"""The run record: what one run measured, as types. metrics.json is its serialised form, and every consumer
(the printed table, plots, W&B, sweep reports, notebook helpers) reads these types, not dict keys; its parts
(dataset, run, each retriever's spec, tuning, extra positives' counts, eval and fusion settings) are
:mod:`fusebench.evaluation.subrecords`.

Layout of metrics.json (record version 3, ``RECORD_VERSION``; every version fusebench wrote is read through
:func:`fusebench.evaluation.record_versions.migrate`, the one place that knows what each lacked)::

    {"version": 3, "dataset": {...}, "retrievers": {NAME: {"t2i": {"R@1": .., "median_rank": .., "n_queries": ..},
     "i2t": {...}, "mean": {"R@1": ..}, "spec": {...}, "embedding": {...}?}}, "comparisons": [{...}],
     "oracle": {...} | null, "fusion": {...}, "eval": {...}, "run": {...}, "files": {"ranks/x.npy": sha256}}

A fusion is a retriever whose ``spec.kind`` is ``"fusion"``; its ``spec.members`` are the models it fused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from fusebench.config.schema import POSITIVE_SETS, EvalConfig
from fusebench.config.specs import DEFAULT_WEIGHT
from fusebench.evaluation.record_versions import RECORD_VERSION, RecordVersionError, migrate
from fusebench.evaluation.search_record import SearchRecord
from fusebench.evaluation.subrecords import (
    DatasetSummary,
    FusionRecord,
    GalleryRecord,
    ModelRecord,
    PositiveCounts,
    RecordError,
    RunInfo,
    TuneRecord,
    eval_from_json,
    eval_to_json,
    fusion_from_json,
    fusion_to_json,
    need,
    spec_from_json,
)
from fusebench.fusion.config import FusionConfig

POSITIVE_BLOCKS = POSITIVE_SETS  # extra-positive metric blocks a retriever may carry (fusebench.evaluation.positives)
__all__ = ["DEFAULT_WEIGHT", "Comparison", "DatasetSummary", "DirectionMetrics", "FusionRecord", "ModelRecord", "PositiveCounts",
           "GalleryRecord", "RECORD_VERSION", "RecordError", "RecordVersionError", "RetrieverResult", "RunInfo", "RunRecord",
           "TuneRecord", "migrate"]


@dataclass(frozen=True)
class DirectionMetrics:
    """Recall@k (percent) for one direction, with the median rank and the number of queries."""

    recall: dict[int, float]
    median_rank: float | None = None
    n_queries: int = 0

    def at(self, k: int) -> float | None:
        return self.recall.get(k)

    def to_json(self) -> dict:
        out: dict = {f"R@{k}": v for k, v in self.recall.items()}
        out["median_rank"], out["n_queries"] = self.median_rank, self.n_queries
        return out

    @classmethod
    def from_json(cls, data: dict, where: str) -> DirectionMetrics:
        if not isinstance(data, dict):
            raise RecordError(f"{where} is not an object")
        recall = {int(key[2:]): value for key, value in data.items() if key.startswith("R@") and key[2:].isdigit()}
        return cls(recall, data.get("median_rank"), int(data.get("n_queries", 0)))


@dataclass
class RetrieverResult:
    name: str
    t2i: DirectionMetrics
    i2t: DirectionMetrics
    mean: dict[int, float]
    spec: ModelRecord | FusionRecord
    embedding: dict | None = None
    positives: dict[str, dict] = field(default_factory=dict)  # {"eccv": {"t2i": {"mAP@R": ...}, "i2t": {...}}}

    @property
    def is_fusion(self) -> bool:
        return isinstance(self.spec, FusionRecord)

    @property
    def members(self) -> list[str]:
        return list(self.spec.members) if self.is_fusion else []

    def direction(self, direction: str) -> DirectionMetrics:
        return self.t2i if direction == "t2i" else self.i2t

    def recall(self, direction: str, k: int) -> float | None:
        """Recall@k in percent for ``t2i``, ``i2t`` or ``mean``."""
        return self.mean.get(k) if direction == "mean" else self.direction(direction).at(k)

    def to_json(self) -> dict:
        out = {"t2i": self.t2i.to_json(), "i2t": self.i2t.to_json(), "mean": {f"R@{k}": v for k, v in self.mean.items()},
               "spec": self.spec.to_json()}
        if self.embedding:
            out["embedding"] = self.embedding
        out.update(self.positives)  # retrievers.NAME.eccv / .cxc beside t2i and i2t
        return out

    @classmethod
    def from_json(cls, name: str, data: dict) -> RetrieverResult:
        where = f"retriever {name!r}"
        spec = spec_from_json(need(data, "spec", where), where)
        mean = need(data, "mean", where)
        if not isinstance(mean, dict):
            raise RecordError(f"{where}: 'mean' is not an object")
        positives = {key: data[key] for key in POSITIVE_BLOCKS if isinstance(data.get(key), dict)}
        return cls(name, DirectionMetrics.from_json(need(data, "t2i", where), f"{where} t2i"),
                   DirectionMetrics.from_json(need(data, "i2t", where), f"{where} i2t"),
                   {int(k[2:]): v for k, v in mean.items() if k.startswith("R@")}, spec, data.get("embedding"),
                   positives)


@dataclass(frozen=True)
class Comparison:
    """One paired comparison: candidate vs baseline at one direction and k (gain in points)."""

    candidate: str
    baseline: str
    direction: str
    k: int
    gain: float
    ci_low: float
    ci_high: float
    wins: int
    losses: int
    cluster_ci_low: float
    cluster_ci_high: float
    p_value: float
    baseline_recall: float
    candidate_recall: float
    n_queries: int
    level: float = 0.95
    draws: int = 0
    metric: str = ""  # "" = recall@k on the split's own positives; else e.g. "eccv mAP@R" (then k is 0)

    def to_json(self) -> dict:
        order = ("baseline", "candidate", "direction", "k", "gain", "ci_low", "ci_high", "wins", "losses",
                 "cluster_ci_low", "cluster_ci_high", "p_value", "baseline_recall", "candidate_recall", "n_queries",
                 "level", "draws")
        out = {key: getattr(self, key) for key in order}
        if self.metric:
            out["metric"] = self.metric
        return out

    @classmethod
    def from_json(cls, data: dict) -> Comparison:
        if not isinstance(data, dict):
            raise RecordError("a comparison is not an object")
        known = {f.name for f in fields(cls)}
        missing = [f.name for f in fields(cls) if f.name not in data and f.name != "metric"]
        if missing:
            raise RecordError(f"a comparison lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class RunRecord:
    dataset: DatasetSummary
    retrievers: dict[str, RetrieverResult]
    comparisons: list[Comparison]
    fusion: FusionConfig
    eval: EvalConfig
    run: RunInfo
    oracle: dict | None = None
    files: dict[str, str] = field(default_factory=dict)
    reference: dict | None = None  # the article's row for this job (fusebench.report.article), when it has one
    positives: dict[str, PositiveCounts] | None = None  # per extra-positive set: its query counts
    positive_comparisons: list[Comparison] = field(default_factory=list)  # the same pairs on those metrics
    tune: TuneRecord | None = None  # tune mode: the tuning split, criterion, every setting's value, the chosen one
    gallery: GalleryRecord | None = None  # distractors added to the dataset's gallery (gallery group); None: none
    search: SearchRecord | None = None  # an approximate backend's quality and cost (search group); None: exact
    version: int = RECORD_VERSION

    @property
    def ks(self) -> list[int]:
        return list(self.eval.ks)

    @property
    def level(self) -> float:
        return self.eval.bootstrap.level

    @property
    def fusions(self) -> list[str]:
        return [n for n, r in self.retrievers.items() if r.is_fusion]

    @property
    def headline(self) -> str:
        """The retriever a run is about: its fusion when there is one, else its first model."""
        return self.fusions[0] if self.fusions else next(iter(self.retrievers))

    @property
    def singles(self) -> list[str]:
        return [n for n, r in self.retrievers.items() if not r.is_fusion]

    @property
    def simulated(self) -> bool:
        return self.dataset.simulated

    def best_single(self, direction: str = "t2i", k: int = 1, among: list[str] | None = None) -> str | None:
        """The best single model: the non-fusion retriever (of ``among``, default all) with the highest recall
        at ``direction`` and ``k``; the first in config order on ties; None when none has a recall there (a k the
        run did not measure: never guessed). The one definition every consumer uses."""
        names = [n for n in (among if among is not None else list(self.retrievers))
                 if not self.retrievers[n].is_fusion and self.retrievers[n].recall(direction, k) is not None]
        if not names:
            return None
        return max(names, key=lambda n: (self.retrievers[n].recall(direction, k), -names.index(n)))

    def comparison(self, candidate: str, baseline: str, direction: str, k: int) -> Comparison | None:
        return next((c for c in self.comparisons if (c.candidate, c.baseline, c.direction, c.k)
                     == (candidate, baseline, direction, k)), None)

    def to_json(self) -> dict:
        out = {"version": self.version, "dataset": self.dataset.to_json(),
               "retrievers": {n: r.to_json() for n, r in self.retrievers.items()},
               "comparisons": [c.to_json() for c in self.comparisons], "oracle": self.oracle,
               "fusion": fusion_to_json(self.fusion), "eval": eval_to_json(self.eval), "run": self.run.to_json(),
               "files": self.files}
        if self.reference is not None:
            out["reference"] = self.reference
        if self.tune is not None:
            out["tune"] = self.tune.to_json()
        if self.gallery is not None:
            out["gallery"] = self.gallery.to_json()
        if self.search is not None:
            out["search"] = self.search.to_json()
        if self.positives:
            out["positives"] = {name: counts.to_json() for name, counts in self.positives.items()}
            out["positive_comparisons"] = [c.to_json() for c in self.positive_comparisons]
        return out

    @classmethod
    def from_json(cls, data) -> RunRecord:
        """The record in a parsed metrics.json of any version fusebench wrote (read as today's, :func:`migrate`);
        RecordError says what is missing, RecordVersionError that a newer fusebench wrote it."""
        data = migrate(data)
        dataset = DatasetSummary.from_json(need(data, "dataset", "metrics.json"))
        retrievers = need(data, "retrievers", "metrics.json")
        if not isinstance(retrievers, dict) or not retrievers:
            raise RecordError("metrics.json: 'retrievers' is missing or empty")
        comparisons = data.get("comparisons", [])
        if not isinstance(comparisons, list):
            raise RecordError("metrics.json: 'comparisons' is not a list")
        files = data.get("files") or {}
        if not isinstance(files, dict):
            raise RecordError("metrics.json: 'files' is not a mapping of file -> sha256")
        positives = data.get("positives") if isinstance(data.get("positives"), dict) else None
        return cls(dataset=dataset, retrievers={str(n): RetrieverResult.from_json(str(n), r) for n, r in retrievers.items()},
                   comparisons=[Comparison.from_json(c) for c in comparisons],
                   fusion=fusion_from_json(data.get("fusion") or {}, "metrics.json: 'fusion'"),
                   eval=eval_from_json(data.get("eval")), run=RunInfo.from_json(data.get("run")),
                   oracle=data.get("oracle"), files=files,
                   reference=data.get("reference") if isinstance(data.get("reference"), dict) else None,
                   positives=None if positives is None else {str(n): PositiveCounts.from_json(c)
                                                             for n, c in positives.items()},
                   positive_comparisons=[Comparison.from_json(c) for c in data.get("positive_comparisons") or []],
                   tune=TuneRecord.from_json(data["tune"]) if isinstance(data.get("tune"), dict) else None,
                   gallery=GalleryRecord.from_json(data["gallery"]) if isinstance(data.get("gallery"), dict) else None,
                   search=SearchRecord.from_json(data["search"]) if isinstance(data.get("search"), dict) else None)
