"""Model specs as types, one class per model kind: a key nothing reads is an error, never silently ignored.

A model spec is free-form YAML (``conf/models/NAME.yaml`` or ``+models.NAME.KEY=...`` overrides), so Hydra
cannot type-check it: :func:`model_specs` turns the ``models`` group into one typed spec per model, of its kind's
class, whose fields are the kind's keys and whose ``__post_init__`` checks their values.
``+models.sim_dfn5b_like.wieght=0`` would otherwise run with the weight unchanged; it is refused, naming the key
and listing the kind's keys. Every kind may carry ``weight``, ``text`` (query preprocessing; for ``vectors`` and
``sim`` a description the reports read), ``label`` and ``published`` (the model's published numbers, free-form).
A spec keeps the mapping it was given (``given``, in its order): the run record stores what was configured, as
configured.

Each kind is one module of ``fusebench.encoders.kinds`` (its name, spec class and operation), found by a scan:
:data:`MODEL_KINDS` is that registry, read here, so this layer names no kind (the scan imports the plugins by
their dotted name). This module keeps what the kinds share: :class:`ModelSpec`, :class:`TextConfig`,
:class:`RealModel` (a real model's ``sim:`` stand-in) and :class:`SimParams`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from fusebench import FUSED, FusebenchError
from fusebench.runtime import checks
from fusebench.runtime.checks import INTERNAL
from fusebench.runtime.plugins import Registry

DEFAULT_WEIGHT = 1.0  # a model's weight in the fused score when its spec sets none
# the query text's cases, in the sweep report's order too (report.sweep.FACTOR_ORDER: a later case is the candidate
# against an earlier one)
TEXT_CASES = ("as_typed", "canonicalize", "lowercase")
NOTE = "(nothing reads them)"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class TextConfig:
    """Query preprocessing: ``case`` (as_typed, canonicalize: open_clip's clean, lowercase) and an optional
    ``template`` with one ``{}`` for the caption."""

    case: str = "as_typed"
    template: str | None = None
    where: str = field(default="text", metadata=INTERNAL)

    def __post_init__(self):
        if self.case not in TEXT_CASES:
            raise FusebenchError(f"{self.where}.case={self.case!r} is not valid; valid: {', '.join(TEXT_CASES)}.")
        if self.template is not None and (not isinstance(self.template, str) or self.template.count("{}") != 1):
            raise FusebenchError(f"{self.where}.template={self.template!r} must be a string with exactly one '{{}}'.")


@dataclass
class SimParams:
    """A simulated model's parameters (``dim``, ``image_noise``, ``text_noise``, ``seed``: all set, as
    conf/models/sim_*.yaml do; ``score_scale`` and ``score_shift``: where its cosines sit, both or neither). In a
    real model's ``sim:`` block (its stand-in on dataset=sim) ``text_noise`` may map each ``text.case`` to a noise."""

    dim: int | None = None
    image_noise: float | None = None
    text_noise: float | dict | None = None
    seed: int | None = None
    score_scale: float | None = None
    score_shift: float | None = None
    where: str = field(default="sim", metadata=INTERNAL)
    per_case: bool = field(default=False, metadata=INTERNAL)  # text_noise may be a mapping (a sim: block)

    def __post_init__(self):
        for key in ("dim", "image_noise", "text_noise", "seed"):
            checks.required({k: v for k, v in vars(self).items() if v is not None}, key, self.where)
        self.dim = checks.integer(self.dim, f"{self.where}.dim", 1)
        self.image_noise = checks.number(self.image_noise, f"{self.where}.image_noise", 0)
        if not (self.per_case and isinstance(self.text_noise, Mapping)):
            self.text_noise = checks.number(self.text_noise, f"{self.where}.text_noise", 0)
        self.seed = checks.integer(self.seed, f"{self.where}.seed", 0)
        if self.score_scale is not None or self.score_shift is not None:
            given = {k: getattr(self, k) for k in ("score_scale", "score_shift") if getattr(self, k) is not None}
            self.score_scale = checks.number(checks.required(given, "score_scale", self.where),
                                             f"{self.where}.score_scale", 0, 1, open_low=True)
            self.score_shift = checks.number(checks.required(given, "score_shift", self.where),
                                             f"{self.where}.score_shift", -1, 1)

    @property
    def score(self) -> tuple[float, float] | None:
        return None if self.score_scale is None else (self.score_scale, self.score_shift)

    def for_case(self, case: str) -> SimParams:
        """These parameters with the text noise of ``case`` (a per-case mapping resolved)."""
        if not isinstance(self.text_noise, Mapping):
            return self
        if case not in self.text_noise:
            raise FusebenchError(f"{self.where}.text_noise has no value for text.case={case!r}; it has "
                                 f"{', '.join(map(str, self.text_noise))}: add {case}: NOISE.")
        return replace(self, text_noise=self.text_noise[case], per_case=False)


@dataclass
class ModelSpec:
    """What every kind carries; the subclasses add the kind's own keys."""

    kind: str
    weight: float = DEFAULT_WEIGHT
    text: TextConfig = field(default_factory=TextConfig)
    label: str | None = None
    published: dict | None = None  # free-form: {dataset: {t2i_r1, i2t_r1, protocol, source}}
    name: str = field(default="", metadata=INTERNAL)
    given: dict = field(default_factory=dict, metadata=INTERNAL)  # the spec as configured, keys in order

    def __post_init__(self):
        self.weight = checks.weight(self.weight, f"models.{self.name}.weight")
        self.published = checks.mapping(self.published, f"models.{self.name}.published")

    def text_record(self) -> dict:
        """The text settings as configured, with case and template filled in (the cache key's and record's)."""
        return {**dict(self.given.get("text") or {}), "case": self.text.case, "template": self.text.template}


@dataclass
class RealModel(ModelSpec):
    """A real model (a kind with an encoder backend, embedded through the cache): its ``sim:`` block is its
    stand-in on dataset=sim (``stand_in``: resolved for its text case; None without a block)."""

    sim: SimParams | None = None
    stand_in: SimParams | None = field(default=None, metadata=INTERNAL)

    def __post_init__(self):
        super().__post_init__()
        self.stand_in = None if self.sim is None else self.sim.for_case(self.text.case)

    def need(self, key: str, what: str) -> None:
        """Refuse this model without ``key`` (the kind's weights): one line naming it and what the kind needs."""
        if not getattr(self, key):
            raise FusebenchError(f"models.{self.name}.{key} is not set; kind '{self.kind}' needs {what}.")


@dataclass(frozen=True)
class ModelKind:
    """One model kind, registered by its module in ``fusebench.encoders.kinds``."""

    name: str  # the value of models.NAME.kind
    spec: type[ModelSpec]  # its keys: a ModelSpec subclass whose fields are the keys and __post_init__ the checks
    load: Callable  # (spec, corpus, runtime: the embed group or None) -> RawEmbeddings: the model's rows
    doc: str  # one line: what the kind is (messages, docs)
    backend: Callable | None = None  # a real kind's encoder, (name, spec) -> encoders.base.Encoder (heavy: built
    #   only when a cache miss needs it)
    order: int = 50  # its place in the lists a user reads (messages, docs)


MODEL_KINDS: Registry[ModelKind] = Registry("fusebench.encoders.kinds", "model kind", "models.NAME.kind")


def model_spec(name: str, value, registry: list[str]) -> ModelSpec:
    """One model's spec, typed: a known kind, no key its kind does not read (in ``text`` and ``sim`` too)."""
    given = checks.mapping(value, f"models.{name}")
    kind = given.get("kind")
    if kind is None:
        raise FusebenchError(_no_kind(name, given, registry))
    if kind not in MODEL_KINDS:
        raise FusebenchError(f"models.{name}.kind={kind!r} is not a known model kind; valid kinds: "
                             f"{', '.join(MODEL_KINDS.names())}.")
    cls = MODEL_KINDS.get(kind).spec
    text_cls = next(f for f in fields(cls) if f.name == "text").default_factory  # a kind may widen text:

    def text(block, _key):
        where = f"models.{name}.text"
        return checks.typed(text_cls, block, where, every_key=False, note=NOTE, where=where)

    def sim(block, _key):
        if not isinstance(block, Mapping):
            raise FusebenchError(f"models.{name}.sim={block!r} is not valid; valid: a block of dim, image_noise, "
                                 "text_noise, seed.")
        where = f"models.{name}.sim"
        return checks.typed(SimParams, block, where, every_key=False, note=NOTE, where=where, per_case=True)

    nested = {"text": text, **({"sim": sim} if issubclass(cls, RealModel) else {})}
    values = {k: v for k, v in given.items() if not (k in nested and v is None)}  # text: null = the defaults
    return checks.typed(cls, values, f"models.{name} (kind {kind})", every_key=False, note=NOTE, nested=nested,
                        name=name, given=dict(given))


def model_specs(models, registry: list[str]) -> dict[str, ModelSpec]:
    """The ``models`` group, typed: at least one model, each name usable in file names and not the fused one's."""
    specs = checks.mapping(models, "models")
    if not specs:
        raise FusebenchError("no models selected: pick some with models=[a,b] or +models.NAME.kind=... overrides.")
    out = {}
    for name, spec in specs.items():
        name = str(name)
        if name == FUSED or not _NAME.match(name):
            raise FusebenchError(f"model name {name!r} is not allowed: use letters, digits, '_', '.', '-' "
                                 f"(and not {FUSED!r}, the fused retriever's name).")
        out[name] = model_spec(name, spec, registry)
    return out


def _no_kind(name: str, spec: Mapping, registry: list[str]) -> str:
    keys = ", ".join(f"models.{name}.{k}" for k in spec) or f"models.{name}"
    if name in registry:
        return (f"{keys} was set but model {name!r} is not selected, so it has no kind: select it with "
                f"models=[...,{name}] (then models.{name}.KEY=... changes it), or drop the override.")
    return (f"models.{name} has no kind: a new model needs +models.{name}.kind=... ({', '.join(MODEL_KINDS.names())}), "
            f"or pick one from the registry with models=[...] ({', '.join(registry)}).")


def registry(folders: list[Path]) -> list[str]:
    """Model names of the registry: ``models/*.yaml`` in each config folder."""
    return sorted({p.stem for folder in folders for p in (folder / "models").glob("*.yaml")})
