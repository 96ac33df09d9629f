"""What every embedded engine shares: :class:`EngineRequest` in, :class:`EngineLists` out, and the steps around
the engine (:func:`engine_backend`: the request rows per direction, the engine's database folder, its lists as
:class:`~fusebench.search.ranked.RankedLists`, their neighbour recall against exact lists, its costs, and its fused
lists compared query by query with fusebench's preset over exact lists).

An engine module (``fusebench.backends.kinds.milvus``, ``lancedb``, ``qdrant``) registers its
:class:`~fusebench.backends.base.Backend` with ``run=engine_runner(run, version)``, where ``run(request) ->
EngineLists`` and ``version() -> str`` are its own. ``run`` loads ``request.items`` into its engine (item id = row index), builds the index
``request.search`` names, and sends every query through the engine's own search: each model alone (``singles``,
``per_model_k`` deep) and the engine's hybrid search over all models with its own fusion of the preset
``request.fusion`` (``fused``, ``final_k`` deep, the same limits the preset has in fusebench). It writes only
under ``request.workdir`` (an empty folder the caller made and removes). Importing an engine's package happens
inside ``run``/``version``, through :func:`~fusebench.backends.base.require`, so that a missing extra is one line
(exit 2). Nothing here imports torch at the top: the registry is read when a config is checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fusebench import DIRECTIONS, FUSED
from fusebench.backends.base import BackendResult
from fusebench.evaluation.search_record import EXACT_FUSED, EngineCost, IndexQuality, SearchRecord
from fusebench.fusion.config import FusionConfig
from fusebench.runtime.progress import Progress

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fusebench.backends.retrieval import ListSource, SearchSettings
    from fusebench.config.search import SearchConfig
    from fusebench.encoders.base import ModelEmbeddings

log = logging.getLogger(__name__)
GALLERY_TILE = 16384  # gallery rows read at a time (FAISS's gallery index reads the same tiles)

@dataclass
class EngineRequest:
    direction: str  # "t2i": items are images, queries captions | "i2t": items are captions, queries images
    items: dict[str, np.ndarray | GalleryRows]  # model -> (n_items, dim) float32 L2-normalised rows; item id = row
    #   index (a gallery's: GalleryRows, read block by block through item_blocks, never whole)
    queries: dict[str, np.ndarray]  # model -> (n_queries, dim) float32 L2-normalised rows (same models, same order)
    weights: dict[str, float]  # model -> its weight (engines that take weights pass them on)
    fusion: FusionConfig  # the engine preset (fusion.preset names it; fuse_on says source_object or document)
    per_model_k: int  # each model's search limit (the preset's top_k, at most n_items)
    final_k: int  # the fused list's length (the preset's final_top_k)
    search: SearchConfig  # index type and parameters, threads, batch size, latency_queries
    workdir: Path  # the only folder the engine may write: empty, made by the caller, removed by it
    progress: Progress | None = None

    @property
    def models(self) -> list[str]:
        return list(self.items)

    @property
    def n_items(self) -> int:
        return len(next(iter(self.items.values())))

    @property
    def n_queries(self) -> int:
        return len(next(iter(self.queries.values())))

    def dim(self, model: str) -> int:
        return int(self.items[model].shape[1])

    def item_blocks(self, size: int) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
        """(start, stop, model -> its float32 rows start:stop) for every block of ``size`` items, in id order: what
        an engine loads, one block in memory at a time (a gallery's rows are read tile by tile, never whole)."""
        yield from item_blocks(self.items, size)


class GalleryRows:
    """One model's t2i items over a gallery: the test images, then its distractors (``ModelEmbeddings.distractors``),
    in the gallery's index order (item i is the exact path's t2i item i), read tile by tile through
    :class:`~fusebench.search.gallery_search.GalleryTiles`, as FAISS's gallery index reads them."""

    def __init__(self, image: np.ndarray, distractors, tile: int = GALLERY_TILE):
        self.image, self.distractors, self.tile = image, distractors, tile
        self.shape = (int(image.shape[0]) + int(distractors.n), int(image.shape[1]))

    def __len__(self) -> int:
        return self.shape[0]

    def tiles(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first item, rows) per tile, in order; a tile is released once the next is asked for."""
        from fusebench.search.gallery_search import GalleryTiles  # lazy: heavy (torch, numpy, numba)

        tiles = GalleryTiles(self.image, self.distractors, self.tile)
        for t, (c0, _c1) in enumerate(tiles.tiles):
            yield c0, tiles.rows(t)
            tiles.release(t)


def item_blocks(items: dict[str, np.ndarray | GalleryRows], size: int
                ) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """Every model's rows in aligned blocks of ``size`` (the last one shorter): an array sliced, a gallery read
    tile by tile in step (a block cut from the current tile, copied across a tile's edge)."""
    import numpy as np

    lengths = {m: len(rows) for m, rows in items.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"every model's items must be the same rows; lengths {lengths}")
    n = len(next(iter(items.values())))
    tiles = {m: rows.tiles() for m, rows in items.items() if isinstance(rows, GalleryRows)}
    held = {m: (0, np.empty((0, items[m].shape[1]), np.float32)) for m in tiles}  # (first item, rows) of its tile
    for start in range(0, n, size):
        stop = min(start + size, n)
        block = {}
        for m, rows in items.items():
            if m not in tiles:
                block[m] = np.ascontiguousarray(rows[start:stop], dtype=np.float32)
                continue
            parts, at = [], start
            while at < stop:
                first, tile = held[m]
                if at >= first + len(tile):
                    held[m] = next(tiles[m])
                    continue
                parts.append(tile[at - first: stop - first])
                at += len(parts[-1])
            block[m] = np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts), dtype=np.float32)
        yield start, stop, block


@dataclass
class EngineLists:
    """What the engine returned. Ids are item ids (row indices; -1 pads a list the engine returned short),
    scores are the engine's own (a distance turned into "higher is better" where the engine returns distances,
    and said so in ``notes``)."""

    singles: dict[str, tuple[np.ndarray, np.ndarray]]  # model -> (ids (q, per_model_k) int64, scores float32)
    fused_ids: np.ndarray  # (q, final_k) int64, best first, -1 padding
    fused_scores: np.ndarray  # (q, final_k) float32, the engine's fused scores
    ingest_seconds: float  # loading the items (inserts, flush)
    build_seconds: float  # building the index (0 for a flat search with no index)
    search_seconds: float  # every query's fused answer (the hybrid search, with the per-model searches it runs), batched
    latency_ms: np.ndarray  # one fused (hybrid) request at a time, for the first latency_queries queries
    disk_bytes: int  # the engine's files under workdir after ingestion and index build
    version: str  # "pymilvus 3.0.2, milvus-lite 3.2.2"
    notes: list[str] = field(default_factory=list)  # what the engine does its own way (ties, score forms, limits)
    fused_models: np.ndarray | None = None  # fuse_on=document: (q, final_k) the model whose hit each entry is, -1 pad


def folder_bytes(folder: Path) -> int:
    """Bytes of every regular file under ``folder`` (the engine's on-disk size)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink())


def pad(rows: list[list[tuple[int, float]]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-query (id, score) hits, best first, as (ids int64, scores float32) arrays ``length`` wide, -1/-inf
    padded: the form every engine module returns."""
    import numpy as np

    ids = np.full((len(rows), length), -1, dtype=np.int64)
    scores = np.full((len(rows), length), -np.inf, dtype=np.float32)
    for q, hits in enumerate(rows):
        hits = hits[:length]
        if hits:
            ids[q, :len(hits)] = [h[0] for h in hits]
            scores[q, :len(hits)] = [h[1] for h in hits]
    return ids, scores


def vector_names(request: EngineRequest) -> dict[str, str]:
    """model -> its vector field, column or named vector in the engine (v0, v1, ... in model order: a model's name
    need not be a valid name there)."""
    return {m: f"v{i}" for i, m in enumerate(request.models)}


def query_batches(request: EngineRequest, what: str) -> Iterator[tuple[int, int]]:
    """(start, stop) of every block of ``search.batch_size`` queries, in order; the progress bar (``what``) moves
    once a block is answered."""
    tick = ticker(request, what, request.n_queries)
    for start in range(0, request.n_queries, request.search.batch_size):
        stop = min(start + request.search.batch_size, request.n_queries)
        yield start, stop
        tick(stop - start)


def latencies(request: EngineRequest, one: Callable[[int], object]) -> tuple[np.ndarray, list]:
    """Milliseconds of ``one(q)`` (one whole fused request) for each of the first ``search.latency_queries``
    queries, one at a time; and what each returned."""
    import numpy as np

    times, answers = [], []
    for q in range(min(request.search.latency_queries, request.n_queries)):
        began = time.perf_counter()
        answers.append(one(q))
        times.append((time.perf_counter() - began) * 1000.0)
    return np.asarray(times, dtype=np.float64), answers


def engine_lists(request: EngineRequest, singles: dict[str, list], fused: list, owners: list | None = None,
                 **measured) -> EngineLists:
    """An engine's per-query hits (each model's, ``per_model_k`` deep; the fused, ``final_k`` deep; for
    ``fuse_on=document`` the model each fused entry is a hit of, as ``(model, 0.0)``) padded into
    :class:`EngineLists`, with what it measured (``ingest_seconds``, ``build_seconds``, ``search_seconds``,
    ``latency_ms``, ``disk_bytes``, ``version``, ``notes``)."""
    fused_ids, fused_scores = pad(fused, request.final_k)
    return EngineLists(singles={m: pad(rows, request.per_model_k) for m, rows in singles.items()},
                       fused_ids=fused_ids, fused_scores=fused_scores,
                       fused_models=None if owners is None else pad(owners, request.final_k)[0], **measured)


PARITY_K = 10


def _cut(array: np.ndarray, length: int | None) -> torch.Tensor:
    import numpy as np
    import torch

    array = array if length is None else array[:, :length]
    return torch.from_numpy(np.ascontiguousarray(array.astype(np.int64 if array.dtype.kind == "i" else np.float32)))


def _list_ranks(ids: np.ndarray, direction: str, caption_image: np.ndarray) -> np.ndarray:
    """1-based position of the first correct item in each list; 0 when it is not in the list (missed)."""
    import numpy as np
    import torch

    from fusebench.search.ranked import i2t_list_ranks, t2i_list_ranks  # lazy: heavy (torch, numpy)

    cap = torch.as_tensor(caption_image)
    ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    return t2i_list_ranks(ids_t, cap) if direction == "t2i" else i2t_list_ranks(ids_t, torch.unique(cap), cap)


def quality(index_ids: np.ndarray, exact: np.ndarray, depth: int) -> tuple[float, float]:
    """Mean neighbour recall at ``depth`` and top-1 agreement of one model's index lists against exact lists."""
    import numpy as np

    from fusebench.backends.quality import neighbour_recall, top1_agreement  # lazy: heavy (numpy)

    return (float(np.mean(neighbour_recall(index_ids, exact, depth))),
            float(np.mean(top1_agreement(index_ids, exact))))


def engine_request_rows(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, direction: str
                        ) -> tuple[dict[str, np.ndarray | GalleryRows], dict[str, np.ndarray]]:
    """(items, queries) per model for one direction: t2i searches images with captions (over a gallery: the test
    images and the distractors, as :class:`GalleryRows`), i2t captions with the images that have captions (in
    index order: distractors ask no i2t query)."""
    import numpy as np

    query_images = np.unique(np.asarray(caption_image, dtype=np.int64))
    if direction == "t2i":
        return ({m.name: np.asarray(m.image, dtype=np.float32) if m.distractors is None else
                 GalleryRows(np.asarray(m.image, dtype=np.float32), m.distractors) for m in models},
                {m.name: np.asarray(m.text, dtype=np.float32) for m in models})
    return ({m.name: np.asarray(m.text, dtype=np.float32) for m in models},
            {m.name: np.asarray(m.image, dtype=np.float32)[query_images] for m in models})


def _contributors(fused_ids: np.ndarray, singles: list[np.ndarray]) -> torch.Tensor:
    """Bit m set where model m's own list holds the fused entry's item (what fused lists carry)."""
    import numpy as np
    import torch

    bits = np.zeros(fused_ids.shape, dtype=np.int64)
    for m, ids in enumerate(singles):
        for q in range(len(fused_ids)):
            bits[q] |= np.isin(fused_ids[q], ids[q][ids[q] >= 0]).astype(np.int64) << m
    return torch.from_numpy(np.where(fused_ids >= 0, bits, 0))


def _quietly(remove: Callable[[Path], None], folder: Path) -> None:
    """A cleanup that must not replace the error being raised (or a Ctrl-C): a failure is a warning."""
    try:
        remove(folder)
    except OSError as err:
        log.warning("could not remove %s (%s); the next run in this dir removes it", folder, err)


def engine_runner(lists: Callable[[EngineRequest], EngineLists], version: Callable[[], str]) -> Callable[..., BackendResult]:
    """An engine's ``Backend.run``: :func:`engine_backend` around its own ``run(request)`` and ``version()``."""
    def run(models, caption_image, fusion, keep_k, config, settings, source, out_dir) -> BackendResult:
        return engine_backend(lists, version, models, caption_image, fusion, keep_k, config, settings, source, out_dir)
    return run


def ticker(request: EngineRequest, what: str, total: int) -> Callable[[int], None]:
    """The request's progress bar for ``what`` (``total`` steps), or a no-op without one."""
    return request.progress(what, total) if request.progress is not None else (lambda _n: None)


def engine_backend(lists: Callable[[EngineRequest], EngineLists], version: Callable[[], str],
                   models: Sequence[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig,
                   keep_k: int | None, config: SearchConfig, settings: SearchSettings, source: ListSource,
                   out_dir: str) -> BackendResult:
    """The engine's own lists (each model alone, and its hybrid search) in both directions; the exact preset
    beside them, compared query by query."""
    import numpy as np
    import torch

    from fusebench.backends.base import check_capacity, get  # lazy: cycle (backends.base imports this one)
    from fusebench.backends.engine_dirs import (
        ENGINE_DIR,
        fresh_workdir,
        remove_bare_root,
        remove_engine_dir,
        remove_workdir,
        seal,
    )  # lazy: cycle (backends.engine_dirs imports this one)
    from fusebench.backends.retrieval import exact_lists, list_depth, retrieve  # lazy: heavy (torch, numpy, numba)
    from fusebench.evaluation.parity import difference_rows, parity  # lazy: heavy (numpy)
    from fusebench.search.ranked import RankedLists  # lazy: heavy (torch, numpy)

    gallery = models[0].distractors is not None
    # an API caller's rows, checked as the pipeline checks a config's (before any work)
    n_test = len(models[0].image)
    check_capacity(get(config.backend), len(models), fusion.fuse_on == "document", models[0].n_items - n_test, n_test,
                   len(caption_image), config)
    depth = list_depth(fusion, keep_k, settings)
    exact = exact_lists(models, caption_image, depth, settings, source)
    exact_results = retrieve(models, caption_image, fusion, None, settings, source, stored=exact)  # whole final_k
    n_items = {"t2i": models[0].n_items, "i2t": len(caption_image)}
    results: dict[str, dict[str, RankedLists]] = {m.name: {} for m in models}
    results[FUSED] = {}
    results[EXACT_FUSED] = {d: r.cut(keep_k) for d, r in exact_results[FUSED].items()}
    qualities: dict[str, dict[str, IndexQuality]] = {m.name: {} for m in models}
    costs, parities, differences, answered = {}, {}, [], None
    notes = [f"gallery: t2i over the test images and every distractor ({n_items['t2i']:,} items), loaded block by "
             "block from the gallery's rows; i2t as without one (only test images ask i2t queries)"] if gallery else []
    root = Path(out_dir) / ENGINE_DIR
    try:  # a refusal or an interrupt mid-run leaves no engine folder behind (a kept one is the user's choice)
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
                out = lists(request)
            finally:
                if not config.keep_db:
                    _quietly(remove_workdir, workdir)
            if config.keep_db:  # what the engine wrote, so that a file put there later is never taken for it
                seal(workdir)
            notes += [n for n in out.notes if n not in notes]
            answered = answered or out.version  # the engine's own word (a server's: its version and address)
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
    except BaseException:
        remove_bare_root(out_dir)  # this run's direction folders went in its finally; an earlier kept one stays
        raise
    if config.keep_db:
        log.info("the engine's databases are kept in %s (search.keep_db=true)", root)
    else:
        remove_engine_dir(out_dir)
    record = SearchRecord(backend=config.backend, index=config.index, params=config.index_params(),
                          label=config.label(), version=answered or version(), depth=fusion.per_model_k(n_items["t2i"]),
                          models=qualities,
                          engine=costs, parity=parities, notes=notes)
    return BackendResult(results, record, differences)


