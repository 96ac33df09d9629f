"""``search=exact`` (the default): brute force in torch, in this process: every model's exact lists and ranks in its
full ranking, and the run's fusion over them (:mod:`.retrieval`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fusebench.backends.base import Backend, BackendResult, register
from fusebench.fusion.config import FusionConfig

if TYPE_CHECKING:
    import numpy as np

    from fusebench.backends.retrieval import ListSource, SearchSettings
    from fusebench.config.search import SearchConfig
    from fusebench.encoders.base import ModelEmbeddings


def run(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig, keep_k: int | None,
        config: SearchConfig, settings: SearchSettings, source: ListSource, out_dir: str) -> BackendResult:
    from fusebench.backends.retrieval import retrieve  # lazy: heavy (torch, numpy, numba)

    return BackendResult(retrieve(models, caption_image, fusion, keep_k=keep_k, settings=settings, source=source))


BACKEND = register(Backend(name="exact", indexes=("flat",), run=run, order=10,
                           index_note=" (exact search has no index: pick search=faiss_* or an engine for an index)",
                           reads_note=" (brute force in torch, in this process)"))
