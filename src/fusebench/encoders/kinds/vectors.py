"""Kind ``vectors``: embeddings the user already has, one ``.npy`` per side in corpus order (docs/formats.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fusebench import FusebenchError
from fusebench.config.specs import ModelSpec
from fusebench.encoders.kinds import ModelKind, register


@dataclass
class VectorsModel(ModelSpec):
    """Kind ``vectors``: ``image_embeddings`` and ``text_embeddings``, .npy files in corpus order."""

    image_embeddings: str | None = None
    text_embeddings: str | None = None

    def __post_init__(self):
        super().__post_init__()
        for key in ("image_embeddings", "text_embeddings"):
            if not getattr(self, key):
                raise FusebenchError(f"models.{self.name}.{key} is not set; kind 'vectors' needs image_embeddings "
                                     "and text_embeddings (.npy files).")
            setattr(self, key, str(getattr(self, key)))


def load(spec: VectorsModel, corpus, runtime=None):
    # numba (the row norms the files are checked with): a job's import, never a config check's
    from fusebench.encoders.base import RawEmbeddings  # lazy: heavy (numpy, numba)
    from fusebench.encoders.vectors import vector_arrays  # lazy: heavy (numpy, numba)

    image, text, image_src, text_src = vector_arrays(spec.name, spec.image_embeddings, spec.text_embeddings,
                                                     (corpus.n_images, corpus.n_captions))
    return RawEmbeddings(spec.name, image, text, image_src, text_src, dict(spec.given))


KIND = register(ModelKind("vectors", VectorsModel, load, "embeddings you already have (.npy files)", order=20))
