"""Model kind ``sim``: a simulated embedding model over the ``sim`` dataset (see fusebench.data.sim)."""

from __future__ import annotations

from collections.abc import Mapping

from fusebench.data.corpus import Corpus
from fusebench.data.sim import sim_model_embeddings
from fusebench.encoders.base import ModelEmbeddings, check_embeddings


def embed_sim(name: str, spec: Mapping, corpus: Corpus) -> ModelEmbeddings:
    image, text = sim_model_embeddings(
        corpus,
        dim=int(spec.get("dim", 512)),
        image_noise=float(spec.get("image_noise", 0.5)),
        text_noise=float(spec.get("text_noise", 0.5)),
        seed=int(spec.get("seed", 0)),
    )
    source = f"sim model {name!r}"
    return check_embeddings(name, image, text, corpus.n_images, corpus.n_captions, source, source, dict(spec))
