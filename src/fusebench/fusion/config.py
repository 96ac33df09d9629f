"""The ``fusion`` config group's schema: :class:`FusionConfig` (its defaults, and every range and combination check)
and the names each setting takes. Light on purpose (no torch, numpy or numba): the CLI registers it with Hydra and
converts a run's config before any heavy import, so a config mistake is one line within the start-up time."""

from __future__ import annotations

from dataclasses import dataclass

from fusebench import FusebenchError
from fusebench.config import checks

METHODS = ("none", "rrf", "dbsf", "sum", "minmax", "zscore", "isr", "l2", "borda")
FUSE_ON = ("document", "source_object")
RRF_WEIGHTINGS = ("multiply", "rank")
# how an image's evidence from several lists adds up (source_object); the last three are OpenSearch's
COMBINES = ("sum", "max", "mnz", "mean", "geometric", "harmonic")
MEANS = ("mean", "geometric", "harmonic")  # weighted means: per image, never per (model, hit) entry
HOLDER_MEANS = MEANS[1:]  # means over the lists that hold the image (evidence > 0), not over every list
RANK_METHODS = ("rrf", "isr", "borda")  # evidence from the rank alone
SCORE_MAPS = ("none", "cosine01", "atan")  # an engine's own score for a cosine s, before normalising
TIES = ("first", "id")  # equal fused scores: first appearance (lists read model by model) | smaller item id (Milvus)
RRF_RANKS = ("own", "concatenated")  # concatenated: ranks run on through the models' lists (older LanceDB)


@dataclass
class FusionConfig:
    """The ``fusion`` config group's schema and defaults (registered with Hydra by :mod:`fusebench.config.schema`)."""

    method: str = "dbsf"  # none | rrf | isr | borda | dbsf | sum | minmax | zscore | l2
    fuse_on: str = "source_object"  # source_object: one entry per image; document: each model's hit its own entry
    top_k: int | None = 100  # per-model list length; null = all items
    final_top_k: int | None = None  # fused list length; null = top_k
    rrf_k: float = 60.0  # rrf only: 1 / (rrf_k + rank)
    ddof: int = 0  # dbsf/zscore sd: 0 population, 1 sample (Qdrant)
    rrf_weighting: str = "multiply"  # rrf only: multiply: w / (rrf_k + rank) | rank: 1 / (rank / w + rrf_k) (Qdrant)
    combine: str = "sum"  # source_object: sum (CombSUM) | max (CombMAX) | mnz (sum x lists holding it, CombMNZ)
    #   | mean (sum / all weights) | geometric | harmonic (weighted means over the lists holding it: OpenSearch)
    score_map: str = "none"  # none | cosine01: (1 + s) / 2 (Lucene, Milvus COSINE) | atan: 1/2 + atan(s) / pi (Milvus IP)
    flat_score: float | None = None  # evidence for a list whose scores are all equal; null = the method's own
    floor: float | None = None  # evidence <= 0 becomes this (OpenSearch's 0.001); null = none
    rrf_ranks: str = "own"  # rank methods: own list's rank | concatenated: model m's ranks start after the lists before it
    ties: str = "first"  # equal fused scores: first appearance in the lists | id: the smaller item id first (Milvus)
    preset: str | None = None  # the engine preset this is (conf/fusion/ENGINE_METHOD.yaml), for labels

    def __post_init__(self):
        checks.choice(self.method, "fusion.method", METHODS)
        checks.choice(self.fuse_on, "fusion.fuse_on", FUSE_ON)
        for key in ("top_k", "final_top_k"):
            checks.optional_integer(getattr(self, key), f"fusion.{key}", 1, "null = all items")
        if isinstance(self.ddof, bool) or self.ddof not in (0, 1):
            raise FusebenchError(f"fusion.ddof={self.ddof!r} is not valid: use 0 (population sd) or 1 (sample sd, as Qdrant).")
        checks.number(self.rrf_k, "fusion.rrf_k", 0, hint="rrf only: 1 / (rrf_k + rank); the usual value is 60")
        checks.choice(self.rrf_weighting, "fusion.rrf_weighting", RRF_WEIGHTINGS)
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
        if self.fuse_on == "document" and (self.combine in MEANS or self.method == "borda"):
            what = f"fusion.combine={self.combine}" if self.combine in MEANS else "fusion.method=borda"
            raise FusebenchError(f"{what} combines an image's entries across lists, so it needs "
                                 "fusion.fuse_on=source_object (fuse_on=document keeps each model's hit apart).")
        if self.method == "borda" and self.combine != "sum":
            raise FusebenchError(f"fusion.combine={self.combine} is not valid with fusion.method=borda: Borda adds "
                                 "every list's points (fusion.combine=sum).")
        self._check_method_settings()
        if self.combine in MEANS and self.rrf_weighting == "rank":
            raise FusebenchError(f"fusion.combine={self.combine} weighs each list's evidence by its weight: use "
                                 "fusion.rrf_weighting=multiply with it.")

    def _check_method_settings(self) -> None:
        """A setting the method never reads is refused, not recorded as if it had changed the result."""
        ignored = [(self.score_map != "none" and self.method in RANK_METHODS, "score_map", self.score_map,
                    "maps scores, but this method reads only ranks", "none"),
                   (self.rrf_ranks != "own" and self.method not in RANK_METHODS, "rrf_ranks", self.rrf_ranks,
                    f"numbers ranks for the rank methods ({', '.join(RANK_METHODS)}) only", "own"),
                   (self.rrf_weighting != "multiply" and self.method != "rrf", "rrf_weighting", self.rrf_weighting,
                    "applies to rrf only", "multiply")]
        for unused, key, value, why, default in ignored:
            if unused and self.method != "none":
                raise FusebenchError(f"fusion.{key}={value} has no effect with fusion.method={self.method}: it {why}. "
                                     f"Drop it (fusion.{key}={default}) or pick a method that uses it.")

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
