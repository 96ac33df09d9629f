"""The ``fusion`` config group's schema: :class:`FusionConfig` (its defaults, and every range and combination check)
and the names each setting takes. The methods and what each reads come from their registry
(:mod:`fusebench.fusion.methods`, one module per method). Light on purpose (no torch, numpy or numba): the CLI
registers it with Hydra and converts a run's config before any heavy import, so a config mistake is one line
within the start-up time."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fusebench import FusebenchError
from fusebench.fusion import methods as registry
from fusebench.runtime import checks

log = logging.getLogger(__name__)
METHODS = ("none", *registry.names())  # none: no fusion (the single models alone)
FUSE_ON = ("document", "source_object")
# how an image's evidence from several lists adds up (source_object); the last three are OpenSearch's
COMBINES = ("sum", "max", "mnz", "mean", "geometric", "harmonic")
MEANS = ("mean", "geometric", "harmonic")  # weighted means: per image, never per (model, hit) entry
HOLDER_MEANS = MEANS[1:]  # means over the lists that hold the image (evidence > 0), not over every list
RANK_METHODS = registry.names("rank")  # evidence from the rank alone
SCORE_MAPS = ("none", "cosine01", "atan")  # an engine's own score for a cosine s, before normalising
TIES = ("first", "id")  # equal fused scores: first appearance (lists read model by model) | smaller item id (Milvus)
RRF_RANKS = ("own", "concatenated")  # concatenated: ranks run on through the models' lists (older LanceDB)


# what a run with no fusion (method none) reads of the group: each model's list length (its search depth and saved
# lists); every other setting, and every model's weight, is the fusion's and is refused there (issue 39, item 6)
NO_FUSION_READS = ("top_k",)


def method_reads(name: str) -> tuple[str, ...]:
    """The flat settings only some methods read that method ``name`` reads: ``rrf_ranks`` for a rank method,
    ``score_map`` for the others and ``flat_score`` for an affine map (its own settings: ``fusion.params``)."""
    spec = registry.method(name)
    return ("rrf_ranks" if spec.kind == "rank" else "score_map", *(("flat_score",) if spec.kind == "affine" else ()))


def method_dependent() -> tuple[str, ...]:
    """The flat settings only some methods read (every method's :func:`method_reads`, from the registry as it is
    now): an engine preset's own value of one may be carried to a method that never reads it (``fusion=milvus_weighted
    fusion.method=rrf`` carries score_map=cosine01), and ``presets.true_label`` drops it with the label."""
    return tuple(dict.fromkeys(key for name in registry.names() for key in method_reads(name)))


def param_names() -> tuple[str, ...]:
    """Every method's own settings (the fields of each ``Method.params`` dataclass), in the registry's order."""
    return tuple(dict.fromkeys(f.name for m in registry.REGISTRY.items() if m.params for f in fields(m.params)))


def param_owners(key: str) -> tuple[str, ...]:
    """The methods whose ``fusion.params`` hold ``key``."""
    return tuple(m.name for m in registry.REGISTRY.items() if m.params and key in {f.name for f in fields(m.params)})


def param_default(key: str):
    """``key``'s default in the first method that has it (methods sharing a setting share its default:
    tests/test_fusion_methods.py)."""
    return checks.default_of(registry.method(param_owners(key)[0]).params, key)


def moved_keys() -> tuple[str, ...]:
    """The old flat keys of settings that now live in their method's ``fusion.params`` (``fusion.rrf_k`` is
    ``fusion.params.rrf_k``): read, with a warning, until the next release; never recorded."""
    return tuple(f.name for f in fields(FusionConfig) if f.metadata.get("moved"))


def flat_settings(fusion: FusionConfig) -> dict[str, Any]:
    """Every setting of ``fusion`` as one flat mapping, as labels and report factors show them: a method's setting
    that was once a flat key (rrf_k, ddof, rrf_weighting) in that key's place, at its default where the method has
    none (as records before the move held it), and ``params`` the method's other settings (rbc's phi)."""
    moved = moved_keys()
    out = {}
    for f in fields(FusionConfig):
        if f.name in moved:
            out[f.name] = fusion.params.get(f.name, param_default(f.name))
        elif f.name == "params":
            out[f.name] = {k: v for k, v in fusion.params.items() if k not in moved}
        else:
            out[f.name] = getattr(fusion, f.name)
    return out


def settings_json(fusion: FusionConfig) -> dict[str, Any]:
    """``fusion`` as a record holds it (record version 4): every setting but the old flat keys."""
    moved = moved_keys()
    return {k: v for k, v in asdict(fusion).items() if k not in moved}


def check_moved_overrides(overrides) -> None:
    """An old flat key and its new place given together (``fusion.rrf_k=30 fusion.params.rrf_k=50``) are refused
    (exit 2) rather than one of them read: the command line is the only place both can be told apart from what a
    group's YAML gave."""
    keys = {checks.override_key(o) for o in overrides}
    for key in moved_keys():
        if f"fusion.{key}" in keys and f"fusion.params.{key}" in keys:
            raise FusebenchError(f"fusion.{key} and fusion.params.{key} are both given: fusion.{key} is the old name "
                                 f"of fusion.params.{key}; give fusion.params.{key} alone.")


_WARNED: set[str] = set()  # the old flat keys already warned about in this process (one line each)


def fusion_reads(name: str) -> tuple[str, ...]:
    """Every setting of the group that a run with ``fusion.method=name`` reads (``method`` and ``params``, checked on
    their own, aside): ``NO_FUSION_READS`` for none; for a method, what every method reads (each setting no method
    lists in :func:`method_reads`) and its own :func:`method_reads`."""
    if name == "none":
        return NO_FUSION_READS
    some = method_dependent()
    common = tuple(k for k in checks.config_keys(FusionConfig) if k not in ("method", "params", *some, *moved_keys()))
    return (*common, *method_reads(name))


def no_fusion_values(values: dict) -> dict:
    """A recorded fusion with ``method: none`` as it is read: the settings no run without fusion reads at their
    defaults (records written before those were refused with fusion.method=none could hold other values, which
    nothing read)."""
    if values.get("method") != "none":
        return values
    return {k: v if k in ("method", *NO_FUSION_READS) else checks.default_of(FusionConfig, k) for k, v in values.items()}


MOVED = {"moved": "params"}  # an old flat key, now fusion.params.KEY (moved_keys)


@dataclass
class FusionConfig:
    """The ``fusion`` config group's schema and defaults (registered with Hydra by :mod:`fusebench.config.schema`)."""

    method: str = "dbsf"  # none, or a method of fusebench.fusion.methods (rrf, isr, borda, rbc, dbsf, sum, minmax,
    #   zscore, l2)
    fuse_on: str = "source_object"  # source_object: one entry per image; document: each model's hit its own entry
    top_k: int | None = 100  # per-model list length; null = all items
    final_top_k: int | None = None  # fused list length; null = top_k
    # the old flat keys of fusion.params.rrf_k, .ddof and .rrf_weighting (deprecated: read until the next release)
    rrf_k: float | None = field(default=None, metadata=MOVED)
    ddof: int | None = field(default=None, metadata=MOVED)
    rrf_weighting: str | None = field(default=None, metadata=MOVED)
    combine: str = "sum"  # source_object: sum (CombSUM) | max (CombMAX) | mnz (sum x lists holding it, CombMNZ)
    #   | mean (sum / all weights) | geometric | harmonic (weighted means over the lists holding it: OpenSearch)
    score_map: str = "none"  # none | cosine01: (1 + s) / 2 (Lucene, Milvus COSINE) | atan: 1/2 + atan(s) / pi (Milvus IP)
    flat_score: float | None = None  # evidence for a list whose scores are all equal; null = the method's own
    floor: float | None = None  # evidence <= 0 becomes this (OpenSearch's 0.001); null = none
    rrf_ranks: str = "own"  # rank methods: own list's rank | concatenated: model m's ranks start after the lists before it
    ties: str = "first"  # equal fused scores: first appearance in the lists | id: the smaller item id first (Milvus)
    preset: str | None = None  # the engine preset this is (conf/fusion/ENGINE_METHOD.yaml), for labels
    params: dict[str, Any] = field(default_factory=dict)  # the method's own settings (fusion.params.rrf_k for rrf,
    #   .ddof for dbsf and zscore, .phi for rbc): its parameters dataclass in fusebench/fusion/methods/METHOD.py;
    #   every one recorded as it ran

    def __post_init__(self):
        checks.choice(self.method, "fusion.method", ("none", *registry.names()))  # the registry as it is now
        self._read_moved_keys()
        self.params = self._checked_params()
        checks.choice(self.fuse_on, "fusion.fuse_on", FUSE_ON)
        for key in ("top_k", "final_top_k"):
            checks.optional_integer(getattr(self, key), f"fusion.{key}", 1, "null = all items")
        checks.choice(self.combine, "fusion.combine", COMBINES)
        checks.choice(self.score_map, "fusion.score_map", SCORE_MAPS)
        checks.choice(self.rrf_ranks, "fusion.rrf_ranks", RRF_RANKS)
        checks.choice(self.ties, "fusion.ties", TIES)
        if self.ties == "id" and self.top_k is None and self.method != "none":
            raise FusebenchError("fusion.ties=id orders tied fused scores by item id within the fused lists, which "
                                 "whole rankings (fusion.top_k=null) do not build: set fusion.top_k (the engine caps it "
                                 "anyway: Milvus at 16384), or fusion.ties=first.")
        for key in ("flat_score", "floor"):
            if getattr(self, key) is not None:
                checks.number(getattr(self, key), f"fusion.{key}", hint="null = none")
        checks.text(self.preset, "fusion.preset", allow_none=True)
        counts_candidates = self.method != "none" and registry.method(self.method).candidates  # Borda
        if self.fuse_on == "document" and (self.combine in MEANS or counts_candidates):
            what = f"fusion.combine={self.combine}" if self.combine in MEANS else f"fusion.method={self.method}"
            raise FusebenchError(f"{what} combines an image's entries across lists, so it needs "
                                 "fusion.fuse_on=source_object (fuse_on=document keeps each model's hit apart).")
        if counts_candidates and self.combine != "sum":
            raise FusebenchError(f"fusion.combine={self.combine} is not valid with fusion.method={self.method}: it "
                                 "adds every list's points, a lacking list's too (fusion.combine=sum).")
        self._check_method_settings()
        if self.combine in MEANS and self.own_params().get("rrf_weighting") == "rank":  # else dropped with the preset
            raise FusebenchError(f"fusion.combine={self.combine} weighs each list's evidence by its weight: use "
                                 "fusion.params.rrf_weighting=multiply with it.")

    def _read_moved_keys(self) -> None:
        """An old flat key (``fusion.rrf_k=30``) as its new one (``fusion.params.rrf_k``), over the value the
        group's YAML gave there, with one warning per key; the flat field is then cleared (never recorded)."""
        for key in moved_keys():
            value = getattr(self, key)
            if value is None:
                continue
            if key not in _WARNED:
                _WARNED.add(key)
                log.warning("fusion.%s is now fusion.params.%s; the old key is read until the next release", key, key)
            self.params = {**checks.mapping(self.params or {}, "fusion.params"), key: value}
            setattr(self, key, None)

    def _own_keys(self) -> tuple[str, ...]:
        spec = registry.method(self.method) if self.method != "none" else None
        return tuple(f.name for f in fields(spec.params)) if spec is not None and spec.params else ()

    def own_params(self) -> dict[str, Any]:
        """The method's own settings (``params`` less a preset's setting carried over from another method)."""
        own = self._own_keys()
        return {k: v for k, v in self.params.items() if k in own}

    def _checked_params(self, preset_own: dict | None = None) -> dict:
        """The method's own settings (``fusion.params``) through its parameters dataclass, every one filled in
        (what ran is recorded). A setting of another method's is refused (issue 39's rule: a setting the run never
        reads), unless it holds its default (``fusion=dbsf fusion.method=rrf`` carries dbsf.yaml's ddof: 0) or, with
        an engine preset, the preset's own value (``fusion=qdrant_dbsf fusion.method=rrf`` carries ddof: 1, kept
        until ``presets.true_label`` drops it with the label; ``preset_own``: the preset's flat settings, None
        while its file is unread)."""
        given = checks.mapping(self.params or {}, "fusion.params")
        own_keys = self._own_keys()
        kept = {}
        for key, value in given.items():
            known = key in param_names()
            if key in own_keys or not known and own_keys:  # an unknown key: the method's dataclass names the valid
                continue
            if known:  # checked as its own method checks it first (rrf_k=nan is invalid before it is unread)
                checks.typed(registry.method(param_owners(key)[0]).params, {key: value}, "fusion.params",
                             every_key=False)
            if known and any(value == checks.default_of(registry.method(m).params, key) for m in param_owners(key)):
                continue
            if known and self.preset is not None and (preset_own is None or preset_own.get(key) == value):
                kept[key] = value
                continue
            raise FusebenchError(self._foreign_message(key, value))
        if not own_keys:
            return kept
        spec = registry.method(self.method)
        mine = asdict(checks.typed(spec.params, {k: v for k, v in given.items() if k not in kept and (
            k in own_keys or k not in param_names())}, "fusion.params", every_key=False))
        return {**mine, **kept}

    def _foreign_message(self, key: str, value) -> str:
        """A ``fusion.params`` setting the chosen method does not have: the methods that read it (issue 39's words
        for a setting the run never reads), or, for a key no method has, the methods with parameters."""
        owners = param_owners(key)
        if owners:
            why = self._unread_why()
            return (f"fusion.params.{key}={value!r} is never read with fusion.method={self.method}{why}; "
                    f"fusion.params.{key} is read only with fusion.method={' | '.join(owners)}: leave it unset or "
                    "pick one of those.")
        return (f"fusion.params.{key} is not a setting of fusion.method={self.method}, which has no parameters of its "
                f"own; methods with parameters: {', '.join(m for m in registry.names() if registry.method(m).params)}.")

    def _check_method_settings(self, own: dict | None = None) -> None:
        """A setting the run never reads is refused, not recorded as if it had changed the result: the one rule
        (``checks.unread``) every group's kind-dependent settings go through, over what each method reads
        (:func:`fusion_reads`; with no fusion, only ``top_k``). An engine preset's :func:`method_dependent`
        settings are let through while its file is unknown (as the group is built); ``own`` (the preset's
        definition, ``presets.true_label`` passes it) lets through only those at the preset's own value, which the
        user did not set (``fusion=qdrant_dbsf fusion.method=rrf`` carries the preset's ddof=1), and refuses the
        others."""
        if self.method == "none" and self.preset is not None:
            raise FusebenchError(f"fusion.method=none runs no fusion, so fusion.preset={self.preset} has nothing to "
                                 "label: use fusion=none (not a preset with fusion.method=none), or drop "
                                 "fusion.method=none.")
        checks.unread(self, "fusion", "method", self.reads_by_method(own), self._unread_why())
        if own is not None:
            self._checked_params({**own, **own.get("params", {})})

    def _unread_why(self) -> str:
        """What the chosen method reads instead, for the message of a setting it never reads."""
        if self.method == "none":
            return " (no fusion: each model is evaluated alone, its lists fusion.top_k long)"
        spec = registry.method(self.method)
        if self.preset is not None:
            keys = [f"fusion.params.{key}" for key in self._own_keys()] + [f"fusion.{key}" for key in method_reads(self.method)]
            reads = ", ".join(keys[:-1]) + " and " + keys[-1] if len(keys) > 1 else keys[0]
            return (f" (with fusion.preset={self.preset}, fusion.method={self.method} reads, of the settings only some "
                    f"methods read, {reads}{'; its evidence is the rank alone' if spec.kind == 'rank' else ''})")
        return " (it reads only ranks)" if spec.kind == "rank" else ""

    def reads_by_method(self, own: dict | None = None) -> dict[str, tuple[str, ...]]:
        """Each method's settings (:func:`fusion_reads`; ``none``: no fusion). An engine preset's
        :func:`method_dependent` settings are not refused while they may be the preset's own (``own`` None: the
        preset's file not read yet; else those equal to ``own``'s): ``presets.true_label`` drops them, with the
        preset's label, where the method never reads them (the record then shows what ran)."""
        if self.preset is None:
            kept = ()
        elif own is None:
            kept = method_dependent()
        else:
            kept = tuple(key for key in method_dependent() if getattr(self, key) == own.get(key))
        return {name: (*fusion_reads(name), *kept) for name in ("none", *registry.names())}

    def check_preset_values(self, own: dict) -> None:
        """Refuse a setting of an engine preset's that its method never reads and that is not the preset's own
        value ``own[key]`` (the user set it: ``fusion=milvus_weighted fusion.params.rrf_k=5``)."""
        self._check_method_settings(own)

    def per_model_k(self, n_items: int) -> int:
        return n_items if self.top_k is None else min(self.top_k, n_items)

    def final_k(self, n_items: int, n_models: int) -> int:
        """Length of the fused list: final_top_k, else top_k; never more than the entries that exist."""
        wanted = self.final_top_k if self.final_top_k is not None else self.top_k
        available = n_models * self.per_model_k(n_items) if self.fuse_on == "document" else n_items
        return available if wanted is None else min(wanted, available)

    def check_ks(self, ks: list[int], source: str = "eval.ks") -> None:
        """Recall@k needs lists at least k long (``source``: the key the ks come from, named in the error)."""
        largest = max(ks)
        for key in ("top_k", "final_top_k"):
            value = getattr(self, key)
            if value is not None and value < largest:
                raise FusebenchError(
                    f"fusion.{key}={value} is below the largest {source} ({largest}); recall@{largest} needs lists "
                    f"of at least {largest} items: raise fusion.{key} or drop k={largest} from {source}."
                )
