"""``search=faiss``: each model's lists from its FAISS index (``search.index``: flat, ivf_flat, hnsw, ivf_pq, ivf_pqfs; built
once per model and direction, stored content-addressed beside the list store: :mod:`.faiss_index`), fused by
fusebench with the run's fusion exactly as it fuses exact lists; exact lists beside them, for the index's neighbour
recall and for the same fusion over exact lists (``exact_fused``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusebench import DIRECTIONS, FUSED, FusebenchError
from fusebench.backends.base import Backend, BackendResult, register
from fusebench.config.search import INDEXES, TARGET_READS
from fusebench.evaluation.search_record import EXACT_FUSED, SearchRecord
from fusebench.fusion.config import FusionConfig
from fusebench.runtime import checks

if TYPE_CHECKING:
    import numpy as np

    from fusebench.backends.retrieval import ListSource, SearchSettings
    from fusebench.config.search import SearchConfig
    from fusebench.encoders.base import ModelEmbeddings


@dataclass
class FaissParams:
    """The ``search.*`` settings only FAISS reads."""

    max_memory_gb: float | None = None  # ivf_* over a gallery: inverted lists past this (GB, 1e9 bytes) go to disk
    #   (OnDiskInvertedLists in the index store); the index's own structure must fit; null = all in memory
    list_major: bool = False  # ivf_flat: scan each inverted list once for every query that probes it, as one matmul
    #   (FAISS's faiss.contrib.big_batch_search) instead of each query's lists alone (FAISS's search); the same
    #   candidates, and on the CPU far faster for a batch of queries; nlist null = min(sqrt(n), n / 39) (longer lists)

    def __post_init__(self):
        checks.boolean(self.list_major, "search.list_major")
        if self.max_memory_gb is not None:
            self.max_memory_gb = checks.number(self.max_memory_gb, "search.max_memory_gb", 0, open_low=True,
                                               hint="GB an index may hold in memory; null = no limit")


def check(search: SearchConfig, _fusion: FusionConfig, _weights: list[float]) -> None:
    """``search.list_major`` scans an IVF-Flat index's lists (FAISS's big_batch_search takes IVF-Flat, not the
    fast-scan or refined IVF-PQ forms): refused with any other index."""
    if search.list_major and search.index != "ivf_flat":
        raise FusebenchError(f"search.list_major=true scans an IVF-Flat index's inverted lists, and search.index="
                             f"{search.index} is not one: valid with search.index=ivf_flat; leave search.list_major "
                             "unset (false) otherwise.")


def run(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig, keep_k: int | None,
        config: SearchConfig, settings: SearchSettings, source: ListSource, out_dir: str) -> BackendResult:
    """Each model's lists from its FAISS index, fused by fusebench; exact lists beside them for the comparison."""
    import torch

    from fusebench.backends.faiss_index import (  # lazy: heavy (torch, numpy, numba)
        GALLERY_CHUNK,
        build_params,
        faiss_lists,
        faiss_version,
    )
    from fusebench.backends.gallery_index import memory_plan  # lazy: heavy (torch, numpy, numba)
    from fusebench.backends.quality import with_quality  # lazy: heavy (numpy)
    from fusebench.backends.retrieval import exact_lists, list_depth, retrieve  # lazy: heavy (torch, numpy, numba)
    for m in models:  # every model's build parameters (pq_m against its width) and, over a gallery, its index's
        build = build_params(config, m.n_items, m.image.shape[1], m.name)  # memory, before any list or index
        if m.distractors is not None:
            memory_plan(config.index, m.n_items, m.image.shape[1], build, GALLERY_CHUNK, config.max_memory_gb)
    depth = list_depth(fusion, keep_k, settings)
    exact = exact_lists(models, caption_image, depth, settings, source)
    exact_results = retrieve(models, caption_image, fusion, keep_k, settings, source, stored=exact)
    device = torch.device(settings.device)
    ann = {m.name: faiss_lists(m, caption_image, depth, config, device, settings.store_dir, settings.progress,
                               exact[m.name], settings.tuning) for m in models}
    results = retrieve(models, caption_image, fusion, keep_k, settings, source,
                       stored={name: a.lists for name, a in ann.items()})
    if FUSED in exact_results:
        results[EXACT_FUSED] = exact_results[FUSED]
    qualities = {name: with_quality(a, exact[name]) for name, a in ann.items()}
    params = {}
    for d in DIRECTIONS:  # one block per direction, or per model when the models' resolved parameters differ (pq_m)
        by_model = {name: a.params.get(d, {}) for name, a in ann.items()}
        same = all(p == next(iter(by_model.values())) for p in by_model.values())
        params[d] = next(iter(by_model.values())) if same else by_model
    gallery = any(m.distractors is not None for m in models)
    notes = ["gallery: t2i from the index over the test images and every distractor; i2t from exact search (only "
             "test images ask i2t queries)"] if gallery else []
    if config.list_major and any(c.where == "cuda" for a in ann.values() for c in a.costs.values()):
        notes.append("search.list_major: the lists were searched on the GPU by FAISS's GPU index (each query's lists; "
                     "a list-major scan is the CPU's), at the nprobe chosen list-major on the CPU")
    record = SearchRecord(backend="faiss", index=config.index, params=params, label=config.label(),
                          version=faiss_version(), depth=depth, models=qualities, notes=notes)
    return BackendResult(results, record)


def version() -> str:
    from fusebench.backends.faiss_index import faiss_version  # lazy: heavy (torch, numpy, numba)

    return faiss_version()


BACKEND = register(Backend(name="faiss", indexes=INDEXES, reads=("threads", *TARGET_READS, "refine_factor"),
                           params=FaissParams, label_flags={"list_major": "list-major"}, check=check,
                           extra="faiss", module="faiss", run=run, version=version, order=20))
