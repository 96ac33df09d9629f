"""Retrieval through an approximate backend (``search=faiss_* | milvus | lancedb | qdrant``): every retriever's
lists, the same fusion over exact lists beside them, and what the index or engine cost.

* FAISS: each model's lists come from its index (built once, stored beside the list store); fusebench fuses them
  with the run's fusion, exactly as it fuses exact lists.
* An engine: the cached embeddings are loaded into the engine (in ``RUN_DIR/engine_db/DIRECTION``), and it answers
  each model's search and the hybrid search with its own fusion; its fused lists are compared query by query with
  fusebench's preset over exact lists.

Every backend's single-model lists are ``depth`` deep: a rank past the list is 0 (missed). ``exact_fused`` is the
run's fusion over exact lists (its ranks exact within its fused list, as for ``search=exact``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fusebench import DIRECTIONS, FUSED, FusebenchError
from fusebench.app.engine_dirs import ENGINE_DIR, fresh_workdir, remove_engine_dir, remove_workdir, seal
from fusebench.app.retrieval import ListSource, SearchSettings, exact_lists, list_depth, retrieve
from fusebench.config.search import SearchConfig
from fusebench.encoders.base import ModelEmbeddings
from fusebench.evaluation.parity import difference_rows, parity
from fusebench.evaluation.search_record import EXACT_FUSED, EngineCost, IndexQuality, SearchRecord
from fusebench.fusion.config import FusionConfig
from fusebench.search.ranked import RankedLists, i2t_list_ranks, t2i_list_ranks

log = logging.getLogger(__name__)
PARITY_K = 10


@dataclass
class BackendResult:
    lists: dict[str, dict[str, RankedLists]]  # models, fused, exact_fused
    record: SearchRecord
    differences: list[dict] = field(default_factory=list)  # engines: the queries whose top 10 differ from the preset


def _cut(array: np.ndarray, length: int | None) -> torch.Tensor:
    array = array if length is None else array[:, :length]
    return torch.from_numpy(np.ascontiguousarray(array.astype(np.int64 if array.dtype.kind == "i" else np.float32)))


def _list_ranks(ids: np.ndarray, direction: str, caption_image: np.ndarray) -> np.ndarray:
    """1-based position of the first correct item in each list; 0 when it is not in the list (missed)."""
    cap = torch.as_tensor(caption_image)
    ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    return t2i_list_ranks(ids_t, cap) if direction == "t2i" else i2t_list_ranks(ids_t, torch.unique(cap), cap)


def quality(index_ids: np.ndarray, exact: np.ndarray, depth: int) -> tuple[float, float]:
    """Mean neighbour recall at ``depth`` and top-1 agreement of one model's index lists against exact lists."""
    from fusebench.search.ann_quality import neighbour_recall, top1_agreement

    return (float(np.mean(neighbour_recall(index_ids, exact, depth))),
            float(np.mean(top1_agreement(index_ids, exact))))


def faiss_backend(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig,
                  keep_k: int | None, config: SearchConfig, settings: SearchSettings, source: ListSource
                  ) -> BackendResult:
    """Each model's lists from its FAISS index, fused by fusebench; exact lists beside them for the comparison."""
    from fusebench.search.ann import faiss_lists, faiss_version
    from fusebench.search.ann_quality import with_quality

    depth = list_depth(fusion, keep_k, settings)
    exact = exact_lists(models, caption_image, depth, settings, source)
    exact_results = retrieve(models, caption_image, fusion, keep_k, settings, source, stored=exact)
    device = torch.device(settings.device)
    ann = {m.name: faiss_lists(m, caption_image, depth, config, device, settings.store_dir, settings.progress)
           for m in models}
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
    record = SearchRecord(backend="faiss", index=config.index, params=params, label=config.label(),
                          version=faiss_version(), depth=depth, models=qualities)
    return BackendResult(results, record)


def engine_request_rows(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, direction: str
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(items, queries) per model for one direction: t2i searches images with captions, i2t captions with the
    images that have captions (in index order)."""
    query_images = np.unique(np.asarray(caption_image, dtype=np.int64))
    if direction == "t2i":
        return ({m.name: np.asarray(m.image, dtype=np.float32) for m in models},
                {m.name: np.asarray(m.text, dtype=np.float32) for m in models})
    return ({m.name: np.asarray(m.text, dtype=np.float32) for m in models},
            {m.name: np.asarray(m.image, dtype=np.float32)[query_images] for m in models})


def _contributors(fused_ids: np.ndarray, singles: list[np.ndarray]) -> torch.Tensor:
    """Bit m set where model m's own list holds the fused entry's item (what fused lists carry)."""
    bits = np.zeros(fused_ids.shape, dtype=np.int64)
    for m, ids in enumerate(singles):
        for q in range(len(fused_ids)):
            bits[q] |= np.isin(fused_ids[q], ids[q][ids[q] >= 0]).astype(np.int64) << m
    return torch.from_numpy(np.where(fused_ids >= 0, bits, 0))


def engine_backend(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig,
                   keep_k: int | None, config: SearchConfig, settings: SearchSettings, source: ListSource,
                   out_dir: str) -> BackendResult:
    """The engine's own lists (each model alone, and its hybrid search) in both directions; the exact preset
    beside them, compared query by query."""
    from fusebench.engines.base import EngineRequest, engine_module

    engine = engine_module(config.backend)
    depth = list_depth(fusion, keep_k, settings)
    exact = exact_lists(models, caption_image, depth, settings, source)
    exact_results = retrieve(models, caption_image, fusion, None, settings, source, stored=exact)  # whole final_k
    n_items = {"t2i": models[0].n_items, "i2t": len(caption_image)}
    results: dict[str, dict[str, RankedLists]] = {m.name: {} for m in models}
    results[FUSED] = {}
    results[EXACT_FUSED] = {d: r.cut(keep_k) for d, r in exact_results[FUSED].items()}
    qualities: dict[str, dict[str, IndexQuality]] = {m.name: {} for m in models}
    costs, parities, differences, notes = {}, {}, [], []
    root = Path(out_dir) / ENGINE_DIR
    for direction in DIRECTIONS:
        items, queries = engine_request_rows(models, caption_image, direction)
        workdir = fresh_workdir(out_dir, direction)
        request = EngineRequest(direction=direction, items=items, queries=queries,
                                weights={m.name: float(m.weight) for m in models}, fusion=fusion,
                                per_model_k=fusion.per_model_k(n_items[direction]),
                                final_k=fusion.final_k(n_items[direction], len(models)), search=config,
                                workdir=workdir, progress=settings.progress)
        log.info("%s %s: loading %d items x %d models, %d queries", config.backend, direction, request.n_items,
                 len(models), request.n_queries)
        try:
            out = engine.run(request)
        finally:
            if not config.keep_db:
                remove_workdir(workdir)
        if config.keep_db:  # what the engine wrote, so that a file put there later is never taken for it
            seal(workdir)
        notes += [n for n in out.notes if n not in notes]
        for m in models:
            ids, scores = out.singles[m.name]
            results[m.name][direction] = RankedLists(ranks=_list_ranks(ids, direction, caption_image),
                                                     ids=_cut(ids, keep_k), scores=_cut(scores, keep_k))
            recall, top1 = quality(ids, exact[m.name][direction].ids.numpy(), request.per_model_k)
            qualities[m.name][direction] = IndexQuality(neighbour_recall=recall, top1_agreement=top1,
                                                        depth=request.per_model_k)
        fused_ranks = _list_ranks(out.fused_ids, direction, caption_image)
        if out.fused_models is not None:  # document form: each entry is one model's hit
            contributors = torch.from_numpy(np.where(out.fused_models >= 0, np.left_shift(1, np.maximum(out.fused_models, 0)), 0))
        else:
            contributors = _contributors(out.fused_ids, [out.singles[m.name][0] for m in models])
        cut = slice(None) if keep_k is None else slice(0, keep_k)
        results[FUSED][direction] = RankedLists(ranks=fused_ranks, ids=_cut(out.fused_ids, keep_k),
                                                scores=_cut(out.fused_scores, keep_k), contributors=contributors[:, cut])
        latency = np.asarray(out.latency_ms, dtype=np.float64)
        costs[direction] = EngineCost(ingest_seconds=round(out.ingest_seconds, 3), build_seconds=round(out.build_seconds, 3),
                                      search_seconds=round(out.search_seconds, 3),
                                      latency_ms_median=round(float(np.median(latency)), 4) if latency.size else None,
                                      latency_ms_p95=round(float(np.percentile(latency, 95)), 4) if latency.size else None,
                                      latency_queries=int(latency.size), disk_bytes=int(out.disk_bytes))
        reference = exact_results[FUSED][direction]
        block, differ, explained = parity(out.fused_ids, reference.ids.numpy(), reference.scores.numpy(), PARITY_K)
        parities[direction] = block
        differences += difference_rows(direction, differ, explained, out.fused_ids, out.fused_scores,
                                       reference.ids.numpy(), reference.scores.numpy(), PARITY_K)
    if config.keep_db:
        log.info("the engine's databases are kept in %s (search.keep_db=true)", root)
    else:
        remove_engine_dir(out_dir)
    record = SearchRecord(backend=config.backend, index=config.index, params=config.index_params(),
                          label=config.label(), version=engine.version(), depth=fusion.per_model_k(n_items["t2i"]),
                          models=qualities,
                          engine=costs, parity=parities, notes=notes)
    return BackendResult(results, record, differences)


def approximate(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig,
                keep_k: int | None, config: SearchConfig, settings: SearchSettings, source: ListSource,
                out_dir: str) -> BackendResult:
    """The run's lists through ``config``'s backend (never ``exact``)."""
    if config.backend == "faiss":
        return faiss_backend(models, caption_image, fusion, keep_k, config, settings, source)
    if config.engine:
        return engine_backend(models, caption_image, fusion, keep_k, config, settings, source, out_dir)
    raise FusebenchError(f"search.backend={config.backend} is not an approximate backend")
