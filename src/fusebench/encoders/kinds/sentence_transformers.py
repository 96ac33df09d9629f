"""Kind ``sentence_transformers``: one SentenceTransformer that encodes both PIL images and text (a CLIP model
such as ``sentence-transformers/clip-ViT-B-32``; ``fusebench.encoders.st_clip``), embedded through the cache.
A text-only model (the multilingual CLIP text towers) is refused when it loads: retrieval needs both sides from
one model."""

from __future__ import annotations

from dataclasses import dataclass

from fusebench.config.specs import RealModel
from fusebench.encoders.kinds import ModelKind, _real, register


@dataclass
class SentenceTransformersModel(RealModel):
    """Kind ``sentence_transformers``: ``model`` (a hub id or a folder saved with ``SentenceTransformer.save``) at
    ``revision`` (hub only)."""

    model: str | None = None
    revision: str | None = None

    def __post_init__(self):
        super().__post_init__()
        self.need("model", "a sentence-transformers model that encodes images and text (e.g. "
                           "sentence-transformers/clip-ViT-B-32) or a folder saved with SentenceTransformer.save")
        self.model = str(self.model)


def backend(name: str, spec: SentenceTransformersModel):
    from fusebench.encoders.st_clip import (
        SentenceTransformersEncoder,  # lazy: heavy (torch, numpy, numba); torch: only when a cache miss needs it
    )

    return SentenceTransformersEncoder(name, spec)


KIND = register(ModelKind("sentence_transformers", SentenceTransformersModel, _real.load,
                          "a sentence-transformers model encoding images and text (CLIP)", backend, order=45))
