"""The run record's parts, as types: the dataset it ran on, how it ran, each retriever's spec, the tuning and the
extra positives' counts, and the eval and fusion settings (the config's own types). Each has ``to_json`` (what
metrics.json holds, key for key and in order) and ``from_json`` (a record of today's version: what an older
version lacks is filled in before, by :func:`fusebench.evaluation.record_versions.migrate`, and nowhere else).
:mod:`fusebench.evaluation.record` puts them together.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from fusebench import FusebenchError
from fusebench.config.schema import BootstrapConfig, EvalConfig, ListsConfig
from fusebench.config.specs import DEFAULT_WEIGHT
from fusebench.fusion.config import FusionConfig, moved_keys, no_fusion_values, settings_json


class RecordError(ValueError):
    """A metrics.json that cannot be read as a run record; the message says what is wrong."""


def need(mapping, key: str, where: str):
    if not isinstance(mapping, dict) or key not in mapping:
        raise RecordError(f"{where} lacks '{key}'")
    return mapping[key]


def _object(data, where: str) -> dict:
    if not isinstance(data, dict):
        raise RecordError(f"{where} is not an object")
    return data


def known_fields(cls, data, where: str):
    """``cls`` made from the keys of ``data`` that are its fields (a key another fusebench version wrote beside them
    is dropped); data that is no object, or lacks a field without a default, is a RecordError naming ``where``."""
    data = _object(data, where)
    try:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
    except TypeError as err:
        raise RecordError(f"{where} is malformed ({err})") from None


class FieldsRecord:
    """A record part that metrics.json holds as its fields, key for key (``WHERE`` names it in errors)."""

    WHERE: ClassVar[str] = "a record part"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data):
        return known_fields(cls, data, cls.WHERE)


@dataclass(frozen=True)
class DatasetSummary:
    """The corpus a run evaluated: its counts and the loader's facts (``meta``: simulated, nonstandard, split,
    source, the sim parameters, images dropped or held out for tuning)."""

    name: str
    n_images: int
    n_captions: int
    n_images_without_captions: int | None = None
    t2i_queries: int | None = None
    i2t_queries: int | None = None
    digest: str | None = None  # the test split's content digest (Corpus.content_digest); None in older records
    meta: dict = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return bool(self.meta.get("simulated"))

    @property
    def nonstandard(self) -> bool:
        return bool(self.meta.get("nonstandard"))

    @property
    def key(self) -> tuple[str, int, int]:
        """The dataset's name and counts (a label; what makes two corpora the same is :meth:`identity`)."""
        return self.name, self.n_images, self.n_captions

    def identity(self, n_test: int) -> tuple:
        """What makes two runs' queries and test images the same (``n_test``: the test images, without a
        gallery's distractors): the content digest; a record written before digests has its name, counts and
        the loader's facts (simulation parameters, split, source) instead."""
        if self.digest:
            return ("digest", self.digest)
        meta = {k: v for k, v in self.meta.items() if not k.startswith("gallery_") and k != "test_images"}
        return ("name", self.name, n_test, self.n_captions, json.dumps(meta, sort_keys=True, default=str))

    def to_json(self) -> dict:
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "meta"}
        return {**{k: v for k, v in counts.items() if v is not None}, **self.meta}

    @classmethod
    def from_json(cls, data) -> DatasetSummary:
        data = _object(data, "metrics.json: 'dataset'")
        if not {"name", "n_images", "n_captions"} <= set(data):
            raise RecordError("metrics.json: 'dataset' lacks name, n_images or n_captions")
        counts = [f.name for f in fields(cls) if f.name != "meta"]
        return cls(**{k: data[k] for k in counts if k in data}, meta={k: v for k, v in data.items() if k not in counts})


@dataclass
class RunInfo(FieldsRecord):
    """How the run ran: device, wall time, the search's time and similarity blocks, each model's lists (from the
    list store or computed), per-query time, library versions."""

    device: str | None = None
    seconds: float | None = None
    search_seconds: float | None = None
    lists: dict = field(default_factory=dict)
    similarity_blocks: int | None = None
    query_ms: float | None = None
    versions: dict = field(default_factory=dict)

    WHERE: ClassVar[str] = "metrics.json: 'run'"

    @classmethod
    def from_json(cls, data) -> RunInfo:
        return known_fields(cls, data or {}, cls.WHERE)


@dataclass(frozen=True)
class ModelRecord:
    """A model as the record keeps it: its spec as configured (``values``), with the weight it ran with and the
    width an index of it stores (``dim``); a sim stand-in's is what ran, the real model under ``stands_in_for``."""

    values: dict

    kind = property(lambda self: self.values.get("kind"))
    weight = property(lambda self: self.values.get("weight", DEFAULT_WEIGHT))
    dim = property(lambda self: int(self.values.get("dim", 0)))
    text = property(lambda self: self.values.get("text") or {})
    published = property(lambda self: self.values.get("published") or {})

    def identity(self) -> dict:
        """What makes the model that model: its spec without weight, labels, text settings and width. A sim
        stand-in is the model it stands in for (its text noise follows the text settings)."""
        spec = self.values.get("stands_in_for") or self.values
        return {k: v for k, v in spec.items() if k not in ("weight", "published", "label", "text", "dim")}

    def to_json(self) -> dict:
        return self.values


@dataclass(frozen=True)
class FusionRecord:
    """A fusion as the record keeps it: the models it fused, in order, and its settings."""

    members: list[str]
    fusion: FusionConfig
    kind = "fusion"

    def to_json(self) -> dict:
        return {"kind": "fusion", "members": list(self.members), **fusion_to_json(self.fusion)}

    @classmethod
    def from_json(cls, data: dict, where: str) -> FusionRecord:
        return cls(list(data.get("members", [])), fusion_from_json(data, where))


def spec_from_json(data, where: str) -> ModelRecord | FusionRecord:
    data = _object(data, f"{where}: 'spec'")
    return FusionRecord.from_json(data, where) if data.get("kind") == "fusion" else ModelRecord(data)


def fusion_to_json(fusion: FusionConfig) -> dict:
    """A fusion's settings as a record holds them: every one, at its value."""
    return settings_json(fusion)


def fusion_from_json(data: dict, where: str) -> FusionConfig:
    """A recorded fusion's settings (a record of today's version: ``record_versions.migrate`` filled in those an
    older record lacks)."""
    try:
        kept = [f.name for f in fields(FusionConfig) if f.name in data and f.name not in moved_keys()]
        return FusionConfig(**no_fusion_values({name: data[name] for name in kept}))
    except (FusebenchError, TypeError) as err:
        raise RecordError(f"{where}: the fusion settings cannot be read ({err})") from None


def eval_to_json(settings: EvalConfig) -> dict:
    """The eval settings as metrics.json holds them (the bootstrap's keys at the top)."""
    boot = settings.bootstrap
    out = {"ks": settings.ks, "draws": boot.draws, "level": boot.level, "seed": boot.seed,
           "save_topk": settings.save_topk, "chunk_size": settings.chunk_size,
           "item_chunk_size": settings.item_chunk_size, "lists": asdict(settings.lists), "device": settings.device,
           "positives": settings.positives, "search_precision": settings.search_precision}
    return out


def eval_from_json(data) -> EvalConfig:
    """A record's eval settings (of today's version: ``record_versions.migrate`` filled in those an older record
    lacks)."""
    data = _object(data or {}, "metrics.json: 'eval'")
    default = EvalConfig()
    boot = {k: data.get(k, getattr(default.bootstrap, k)) for k in ("draws", "seed", "level")}
    try:
        return EvalConfig(**{k: data[k] for k in ("ks", "device", "chunk_size", "item_chunk_size", "save_topk",
                                                      "positives", "search_precision") if k in data},
                          bootstrap=BootstrapConfig(**boot), lists=ListsConfig(**(data.get("lists") or {})))
    except (FusebenchError, TypeError) as err:
        raise RecordError(f"metrics.json: 'eval' cannot be read ({err})") from None


@dataclass(frozen=True)
class TunePoint:
    """One setting of the tuning grid: each model's weight and the fusion settings it changes (rrf_k, ddof), with
    its criterion on the tuning split (``value``); the first of a curve carries the single models' (``singles``)."""

    weights: dict[str, float]
    fusion: dict[str, float]
    value: float | None = None
    singles: dict[str, float] | None = None

    def describe(self) -> str:
        """'b=0.5, rrf_k=60' (the first model's weight, always 1, left out)."""
        weights = list(self.weights.items())[1:]
        return ", ".join([f"{name}={w:g}" for name, w in weights] + [f"{k}={v:g}" for k, v in self.fusion.items()])

    def to_json(self) -> dict:
        out = {"weights": self.weights, "fusion": self.fusion}
        if self.value is not None:
            out["value"] = self.value
        if self.singles is not None:
            out["singles"] = self.singles
        return out

    @classmethod
    def from_json(cls, data) -> TunePoint:
        data = _object(data, "metrics.json: a tuning point")
        return cls(dict(need(data, "weights", "a tuning point")), dict(data.get("fusion") or {}), data.get("value"),
                   data.get("singles"))


@dataclass(frozen=True)
class TuneRecord:
    """What tuning did: the split and criterion, every setting's value there (``curve``), the one chosen, the
    single models' values, its time; for a seeded split its share and seed."""

    split: str
    criterion: str
    n_images: int
    n_captions: int
    curve: list[TunePoint]
    chosen: TunePoint
    singles: dict[str, float]
    seconds: float
    fraction: float | None = None
    seed: int | None = None

    @property
    def seeded(self) -> bool:
        return self.split == "seeded"

    @property
    def chosen_index(self) -> int:
        """The chosen setting's position in the curve."""
        return next(i for i, p in enumerate(self.curve) if (p.weights, p.fusion) == (self.chosen.weights, self.chosen.fusion))

    def to_json(self) -> dict:
        out = {"split": self.split, "criterion": self.criterion, "n_images": self.n_images,
               "n_captions": self.n_captions, "curve": [p.to_json() for p in self.curve],
               "chosen": self.chosen.to_json(), "singles": self.singles, "seconds": self.seconds}
        return {**out, "fraction": self.fraction, "seed": self.seed} if self.seeded else out

    @classmethod
    def from_json(cls, data) -> TuneRecord:
        data = _object(data, "metrics.json: 'tune'")
        values = {k: need(data, k, "metrics.json: 'tune'") for k in ("split", "criterion", "n_images", "n_captions")}
        return cls(**values, curve=[TunePoint.from_json(p) for p in data.get("curve") or []],
                   chosen=TunePoint.from_json(need(data, "chosen", "metrics.json: 'tune'")),
                   singles=dict(data.get("singles") or {}), seconds=data.get("seconds", 0.0),
                   fraction=data.get("fraction"), seed=data.get("seed"))


@dataclass(frozen=True)
class PositiveCounts(FieldsRecord):
    """One extra-positive set's query counts on the run's corpus (fusebench.evaluation.positives)."""

    t2i_queries: int = 0
    i2t_queries: int = 0
    captions_left_out: int = 0  # corpus captions outside the set's gallery
    queries_not_in_corpus: int = 0
    positives_outside_gallery: int = 0

    WHERE: ClassVar[str] = "metrics.json: 'positives'"


@dataclass
class GalleryModelCost(FieldsRecord):
    """What one model's distractor gallery costs: its bytes as fp32 and as stored, and, when this run embedded
    some of it, the embedding throughput on its device."""

    dim: int
    bytes_fp32: int  # every gallery row (test images and distractors) as fp32
    bytes_stored: int  # as the store holds them (the cache's dtype; a vectors dump's own)
    stored_dtype: str
    embed_device: str | None = None
    images_per_second: float | None = None  # embedding throughput, when this run embedded shards
    search_ms_per_query: float | None = None  # this model's exact search over the whole gallery, per t2i query

    WHERE: ClassVar[str] = "metrics.json: 'gallery.models'"


SIZE_DEPENDENT = ("listing", "undecodable")  # a gallery source's entries that change with gallery.size


@dataclass
class GalleryRecord:
    """The distractors a run added to its dataset's gallery (``gallery`` group): how many were asked, kept and
    dropped as near-duplicates of a test image, from which source in which order, and what each model's gallery
    costs. The gallery's total size is ``dataset.n_images``."""

    kind: str
    size: int  # distractors asked for (the first `size` of the source in seeded order)
    distractors: int  # distractors in the gallery (size less near-duplicates)
    near_duplicates: int  # dropped: cosine to a test image above the threshold under some model
    near_duplicate: float | None  # the threshold (null: none dropped)
    seed: int
    source: dict = field(default_factory=dict)
    models: dict[str, GalleryModelCost] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        """What galleries of one source share at every size (kind, seed, source, threshold; not the size, the
        digest of the ids taken or the undecodable count): two runs with one identity have nested galleries."""
        source = {k: v for k, v in self.source.items() if k not in SIZE_DEPENDENT}
        return json.dumps({"kind": self.kind, "seed": self.seed, "source": source,
                           "near_duplicate": self.near_duplicate}, sort_keys=True, default=str)

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "models"},
                "models": {name: cost.to_json() for name, cost in self.models.items()}}

    @classmethod
    def from_json(cls, data) -> GalleryRecord:
        data = _object(data, "metrics.json: 'gallery'")
        missing = [name for name in ("kind", "size", "distractors", "near_duplicates", "seed") if name not in data]
        if missing:
            raise RecordError(f"metrics.json: 'gallery' lacks {', '.join(missing)}")
        models = {str(name): GalleryModelCost.from_json(cost) for name, cost in (data.get("models") or {}).items()}
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data and f.name != "models"},
                   models=models)
