"""Model kind ``sim``: a simulated embedding model over the ``sim`` dataset (see fusebench.data.simulated).

A simulated model's rows are a pure function of its spec and the corpus parameters, so they are kept in
memory for the next job of the same process (a sweep on Hydra's basic launcher runs every job in one
process; ``app.state.SharedArrays``: a model of at most 256 MB, a COCO-size sim model is ~130 MB, 768 MB in all,
so that a large corpus of 100,000 images never holds a second copy of its rows). Returned read-only.
"""

from __future__ import annotations

import json

import numpy as np

from fusebench.app import state
from fusebench.config.specs import SimParams
from fusebench.data.corpus import Corpus
from fusebench.data.simulated import require_sim_corpus, sim_model_embeddings


def _key(params: SimParams, corpus: Corpus) -> str:
    sim_meta = {k: v for k, v in corpus.meta.items() if k.startswith("sim_")}
    settings = {"dim": params.dim, "image_noise": params.image_noise, "text_noise": params.text_noise,
                "seed": params.seed, "score": params.score}
    return json.dumps({**settings, **sim_meta, "n": [corpus.n_images, corpus.n_captions]}, sort_keys=True)


def sim_arrays(params: SimParams, corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """A sim model's (image, text) rows on a sim corpus, read-only (``params``: checked by its spec)."""
    require_sim_corpus(corpus)
    return state.current().shared.get(_key(params, corpus), lambda: _make(params, corpus))


def _make(params: SimParams, corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    image, text = sim_model_embeddings(corpus, params.dim, params.image_noise, params.text_noise, params.seed,
                                       params.score)
    image.setflags(write=False)
    text.setflags(write=False)
    return image, text
