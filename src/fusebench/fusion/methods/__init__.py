"""The fusion methods: one module per method, each registering one :class:`Method` (its name, kind, parameters,
source and evidence), found by a scan of this package (:class:`fusebench.runtime.plugins.Registry`). Every list that names methods is
derived from :data:`REGISTRY`:
the config's valid values and checks (``fusion.config``), the sweep report's orientation (``report.sweep``), the
stores' choice of what to keep per row (``app.retrieval``) and the docs' table (``tests/test_fusion_methods.py``
checks docs/formulas.md names each).

A method's **kind** decides the path it runs on, in all three places fusion runs (per-model lists:
``fusion.combine``; whole rankings: ``fusion.whole_rankings``; the numba kernel that adds evidence by item id:
``search.topk_kernels.fuse_by_id``, which takes evidence already computed and so serves every kind):

- ``rank``: evidence from the list position alone, ``evidence(ranks, config, candidates)`` over 1-based ranks
  (a (1, k) float tensor; ``candidates``: (B, 1) or None); whole rankings scatter it by each row's order.
  ``Method.candidates`` marks Borda-like methods whose points depend on how many distinct items the query's
  lists hold (an item a list lacks gets ``_ranks.absent_points`` from it).
- ``affine``: a per-row affine map of the scores, ``rows(scores, valid, config, moments) -> RowAffine``; on the
  CPU its element-wise step is one numba pass (``row_kernels.affine_evidence``). ``moments``: the map is made
  from each row's mean and sd, which the score store keeps.
- ``score``: any other map of a list's scores, ``evidence(scores, valid, config)``; it runs on the generic torch
  path (no kernel code of its own).

Light on purpose: importing the registry imports no torch (the CLI checks a config before any heavy import);
the method modules import their math where it runs.

A new method is one module here (a ``METHOD = register(Method(...))``), one ``conf/fusion/NAME.yaml``, one line
in docs/formulas.md and a test against a slow reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusebench.runtime.plugins import Registry

KINDS = ("rank", "affine", "score")


@dataclass(frozen=True)
class Method:
    name: str
    kind: str  # rank | affine | score
    formula: str  # one line, for the docs and messages
    source: str  # where the method comes from (paper, engine, library)
    evidence: Callable  # rank: (ranks, config, candidates) -> evidence; affine: (scores, valid, config, moments)
    #   -> RowAffine; score: (scores, valid, config) -> evidence
    params: type | None = None  # a dataclass of its own parameters, set as fusion.params.NAME (None: it has none;
    #   rrf: rrf_k, rrf_weighting; dbsf, zscore: ddof; rbc: phi)
    order: int = 50  # the sweep report's orientation: a method of higher order is the candidate against a lower
    moments: bool = False  # affine: the map is made from each row's mean and sd
    candidates: bool = False  # rank: points depend on the number of distinct candidates (Borda)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"method {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.moments and self.kind != "affine" or self.candidates and self.kind != "rank":
            raise ValueError(f"method {self.name!r}: moments are for affine maps, candidates for rank methods")


REGISTRY: Registry[Method] = Registry(__name__, "fusion method", "fusion.method")  # filled by a scan of this package
register = REGISTRY.register


def method(name: str) -> Method:
    return REGISTRY.get(name)


def names(kind: str | None = None) -> tuple[str, ...]:
    """The registered methods (of ``kind``), in the sweep report's order, then by name."""
    return tuple(m.name for m in REGISTRY.items() if kind is None or m.kind == kind)


def with_moments() -> tuple[str, ...]:
    return tuple(m.name for m in REGISTRY.items() if m.moments)
