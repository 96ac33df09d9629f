"""Model kind ``sim``: a simulated embedding model over the ``sim`` dataset (see fusebench.data.sim)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fusebench.data.corpus import Corpus
from fusebench.data.sim import sim_model_embeddings


def sim_arrays(spec: Mapping, corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    return sim_model_embeddings(
        corpus,
        dim=int(spec.get("dim", 512)),
        image_noise=float(spec.get("image_noise", 0.5)),
        text_noise=float(spec.get("text_noise", 0.5)),
        seed=int(spec.get("seed", 0)),
    )
