"""Embedding sources behind one entry point: ``embed(name, spec, corpus)``.

Each model spec (one ``conf/models/*.yaml`` or ``+models.NAME.*`` overrides) has a ``kind``; the kind picks
the backend. This issue's kinds: ``vectors`` (embeddings the user already has) and ``sim`` (simulated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import ModelEmbeddings, check_embeddings
from fusebench.encoders.sim import embed_sim
from fusebench.encoders.vectors import embed_vectors

BACKENDS: dict[str, Callable[[str, Mapping, Corpus], ModelEmbeddings]] = {
    "vectors": embed_vectors,
    "sim": embed_sim,
}


def embed(name: str, spec: Mapping, corpus: Corpus) -> ModelEmbeddings:
    """Embeddings of ``corpus`` for model ``name``, validated (shapes, finite, non-zero) and L2-normalised."""
    kind = spec.get("kind")
    if kind not in BACKENDS:
        raise FusebenchError(
            f"models.{name}.kind={kind!r} is not a known model kind; valid kinds: {', '.join(sorted(BACKENDS))}."
        )
    return BACKENDS[kind](name, spec, corpus)


__all__ = ["BACKENDS", "ModelEmbeddings", "check_embeddings", "embed"]
