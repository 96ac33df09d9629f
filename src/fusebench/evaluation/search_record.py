"""What a run with an approximate backend (``search=faiss_* | milvus | lancedb | qdrant``) records beside its
recall: per model and direction, how close the index's lists are to exact search and what the index cost; for an
engine, its ingestion, latency and size, and how its fused lists compare query by query with fusebench's exact
preset. metrics.json's ``search`` block is :meth:`SearchRecord.to_json`; absent for ``search=exact``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar

from fusebench.evaluation.subrecords import FieldsRecord, RecordError, known_fields

EXACT_FUSED = "exact_fused"  # the run's fusion over exact lists, evaluated beside an approximate backend's


TUNING_SOURCES = {"split": "the dataset's {split} split", "held_out": "test images held out of every reported metric"}


def tuning_words(queries: dict, direction: str) -> str:
    """What a target recall's tuning queries were (an IndexQuality target's ``queries``), in one direction: '1,000
    captions of the dataset's val split'."""
    what = f"{queries['captions']:,} captions" if direction == "t2i" else f"{queries['images']:,} images"
    return f"{what} of {TUNING_SOURCES[queries['source']].format(split=queries['split'])}"


@dataclass
class IndexQuality:
    """One model's index in one direction, against exact search at the list depth."""

    neighbour_recall: float  # mean over queries of |index top-depth ∩ exact top-depth| / min(depth, items)
    top1_agreement: float  # share of queries whose first item is exact search's first item
    depth: int  # the list depth compared
    build_seconds: float | None = None  # building the index (None: read from the store; engines: see EngineCost)
    index_bytes: int | None = None  # the index as stored (FAISS serialised bytes)
    query_ms: float | None = None  # search time per query (every query of the direction, batched)
    stored: bool = False  # the index came from (or went to) the index store
    hit: bool = False  # read from the store, not built in this run
    key: str | None = None  # the index store key
    where: str = "cpu"  # cpu | cuda (FAISS's GPU build)
    target: dict | None = None  # search.target_recall set: the setting it chose, the tuning queries (outside every
    #   reported metric), their recall and its lower bound, each value tried, the seconds it took
    #   (backends.target_recall.Tuned); absent from the JSON when not set

    def to_json(self) -> dict:
        out = asdict(self)
        if out["target"] is None:  # records of runs without a target stay as they were written before it existed
            del out["target"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> IndexQuality:
        return known_fields(cls, data, "an index quality")


@dataclass
class EngineCost(FieldsRecord):
    """An engine's costs in one direction (both models loaded in it)."""

    ingest_seconds: float
    build_seconds: float
    search_seconds: float
    latency_ms_median: float | None  # one hybrid request at a time
    latency_ms_p95: float | None
    latency_queries: int
    disk_bytes: int

    WHERE: ClassVar[str] = "an engine cost"


@dataclass
class Parity(FieldsRecord):
    """The engine's fused lists against fusebench's exact preset, query by query, in one direction."""

    n_queries: int
    identical_top1: float  # share of queries with the same first item
    identical_top10: float  # share with the same first 10 items, in order
    differ: int  # queries whose top 10 differ
    explained: int  # of those, differences within tied (float-rounding-equal) fused scores of the exact preset
    file: str | None = None  # the run-dir file listing each differing query (JSON lines)

    WHERE: ClassVar[str] = "an engine parity block"


@dataclass
class SearchRecord:
    backend: str  # faiss | milvus | lancedb | qdrant
    index: str  # flat | ivf_flat | hnsw | ivf_pq | ivf_pqfs
    params: dict  # the index parameters that ran (resolved: nlist and pq_m numbers, per direction when they differ)
    label: str  # "faiss hnsw M=32 efConstruction=200 efSearch=256"
    version: str  # "faiss 1.15.1" | "pymilvus 3.0.2, milvus-lite 3.2.2" | ...
    depth: int  # list depth per model: a rank past it counts as missed
    models: dict[str, dict[str, IndexQuality]]  # model -> direction -> quality and cost
    engine: dict[str, EngineCost] = field(default_factory=dict)  # engines: direction -> cost
    parity: dict[str, Parity] = field(default_factory=dict)  # engines: direction -> vs the exact preset
    notes: list[str] = field(default_factory=list)  # the engine's own rules that showed in this run

    def to_json(self) -> dict:
        return {"backend": self.backend, "index": self.index, "params": self.params, "label": self.label,
                "version": self.version, "depth": self.depth,
                "models": {m: {d: q.to_json() for d, q in by.items()} for m, by in self.models.items()},
                "engine": {d: c.to_json() for d, c in self.engine.items()},
                "parity": {d: p.to_json() for d, p in self.parity.items()}, "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data) -> SearchRecord:
        if not isinstance(data, dict):
            raise RecordError("metrics.json: 'search' is not an object")
        try:
            models = {str(m): {str(d): IndexQuality.from_json(q) for d, q in by.items()}
                      for m, by in (data.get("models") or {}).items()}
            return cls(backend=str(data["backend"]), index=str(data["index"]), params=dict(data.get("params") or {}),
                       label=str(data.get("label", data["backend"])), version=str(data.get("version", "")),
                       depth=int(data["depth"]), models=models,
                       engine={str(d): EngineCost.from_json(c) for d, c in (data.get("engine") or {}).items()},
                       parity={str(d): Parity.from_json(p) for d, p in (data.get("parity") or {}).items()},
                       notes=[str(n) for n in data.get("notes") or []])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise RecordError(f"metrics.json: 'search' is malformed ({type(err).__name__}: {err})") from None

