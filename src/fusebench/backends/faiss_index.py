"""Approximate search (``search.backend=faiss``): one FAISS index per model and direction, built from the model's
cached embeddings (inner product on L2-normalised rows = cosine), searched ``depth`` deep.

* t2i: an index over the images, searched by every caption; i2t: an index over the captions, searched by every
  image that has captions (``np.unique(caption_image)``, the exact path's i2t queries).
* Over a gallery (``model.distractors``): t2i from one index over the test images and every distractor, streamed
  and stored under the gallery's identity (:mod:`.gallery_index`); i2t from the exact gallery lists.
* Index kinds (``search.index``): ``flat`` IndexFlatIP (exact: a cross-check); ``ivf_flat``
  IndexIVFFlat(IndexFlatIP, d, nlist, METRIC_INNER_PRODUCT); ``hnsw`` IndexHNSWFlat(d, M, METRIC_INNER_PRODUCT)
  with efConstruction; ``ivf_pq`` IndexIVFPQ(IndexFlatIP, d, nlist, m, nbits, METRIC_INNER_PRODUCT), inside an
  IndexPreTransform(RemapDimensionsTransform(d, width)) that zero-pads the vectors when m does not divide d
  (``config.search.pq_layout``: the build parameter ``width``, absent when nothing is padded); ``ivf_pqfs``
  IndexIVFPQFastScan(IndexFlatIP, width, nlist, m, 4, METRIC_INNER_PRODUCT): 4-bit codes scanned by FAISS's SIMD
  fast-scan kernels (padded alike), searched on the CPU. IVF k-means
  is seeded by ``search.seed`` (``index.cp.seed``, and ``index.pq.cp.seed`` for the PQ codebooks); FAISS's
  IndexIVF constructor makes that k-means spherical for inner product (``index.cp.spherical``).
* Build parameters are part of the index's store key (``stores.indexes``); the search-time ones (``nprobe``,
  ``efSearch``) are set on the index after it is built or read, so a sweep over them builds once.
* Lists: ids int32 best first (-1 where the index returned fewer than asked), scores the index's own inner
  products (-inf beside -1), ranks the 1-based position of the first correct item IN THE LIST (0 = not listed:
  the query counts as missed at every k).
* ``search.refine_factor`` (IVF-PQ, either code): an IndexRefineFlat around it keeps the full vectors (build parameter
  ``refine: flat``) and re-ranks ``k_factor`` = refine_factor x k hits of the codes by exact inner products.
* ``device.type == "cuda"`` with FAISS's GPU build: flat and IVF indexes are copied to the GPU for the search
  (HNSW and fast-scan IVF-PQ have no GPU form in FAISS and stay on the CPU, as does a refined IVF-PQ); ``where`` records which one
  searched.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fusebench import FusebenchError
from fusebench.backends import gallery_index, list_major, target_recall
from fusebench.backends.base import require
from fusebench.backends.target_recall import Tuned, TuningQueries
from fusebench.config import search as search_config
from fusebench.config.search import IVF_INDEXES, PQ_INDEXES, SearchConfig
from fusebench.encoders.base import ModelEmbeddings
from fusebench.evaluation.search_record import IndexQuality
from fusebench.runtime.progress import Progress
from fusebench.search.gallery_search import GalleryTiles
from fusebench.search.model_lists import ModelLists
from fusebench.search.ranked import i2t_list_ranks, t2i_list_ranks
from fusebench.stores.files import array_digest
from fusebench.stores.indexes import IndexStore, StoredIndex, build_unstored, index_material
from fusebench.stores.lists import shared_digests
from fusebench.stores.tunings import TuningStore, tuning_material

log = logging.getLogger(__name__)
QUERY_BLOCK = 2048  # queries per FAISS search call (bounded result memory, one progress step each)
ADD_BLOCK = 8192  # items per index.add call while building (one progress step each)
PQ_POINTS = 39  # FAISS's ClusteringParameters.min_points_per_centroid default
GALLERY_CHUNK = 16384  # gallery rows read and added at a time (one tile of the gallery's index)
CPU_ONLY = ("hnsw", "ivf_pqfs")  # no GPU form in FAISS (HNSW; fast-scan codes are the CPU's SIMD layout)
GPU_MAX_K = 2048  # FAISS's GPU k-selection limit (GPU_MAX_SELECTION_K): k and nprobe above it stay on the CPU


def faiss_version() -> str:
    return f"faiss {require('faiss').__version__}"


@dataclass
class AnnLists:
    lists: ModelLists  # the index's lists, both directions (ranks are list ranks: 0 = not in the list)
    costs: dict[str, IndexQuality]  # direction -> build/query cost (neighbour_recall/top1_agreement: with_quality)
    params: dict[str, dict]  # direction -> the resolved parameters that ran (FAISS names)


def build_params(config: SearchConfig, n_items: int, dim: int, model: str) -> dict:
    """The resolved BUILD parameters of ``config.index`` for ``n_items`` vectors ``dim`` wide (the store key's)."""
    if config.index == "hnsw":
        return {"M": config.hnsw_m, "efConstruction": config.ef_construction}
    if config.index == "ivf_flat":
        return {"nlist": search_config.resolved_nlist(config, n_items), "seed": config.seed}
    if config.index in PQ_INDEXES:
        m, width = search_config.pq_layout(config, dim, model)
        padded = {"width": width} if width != dim else {}  # absent when nothing is padded: earlier keys hold
        refine = {"refine": "flat"} if config.refine_factor else {}  # the full vectors kept beside the codes
        return {"nlist": search_config.resolved_nlist(config, n_items), "m": m, **padded,
                "nbits": search_config.pq_bits(config), "seed": config.seed, **refine}
    return {}


def search_params(config: SearchConfig) -> dict:
    """The search-time parameters of ``config.index`` (not in the store key)."""
    if config.index == "hnsw":
        return {"efSearch": config.ef_search}
    refine = {"k_factor": config.refine_factor} if config.index in PQ_INDEXES and config.refine_factor else {}
    scan = {"list_major": True} if config.index == "ivf_flat" and config.list_major else {}  # absent: earlier keys
    return {"nprobe": config.nprobe, **refine, **scan} if config.index in IVF_INDEXES else {}


def new_index(faiss, kind: str, dim: int, build: dict):
    """An empty (untrained) index of ``kind`` with the ``build`` parameters."""
    ip = faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, build["M"], ip)
        index.hnsw.efConstruction = build["efConstruction"]
        return index
    width = build.get("width", dim)  # IVF-PQ over vectors zero-padded to a multiple of m (config.search.pq_layout)
    quantizer = faiss.IndexFlatIP(width)  # the IVF index keeps a reference to it (faiss's add_ref_in_constructor)
    if kind == "ivf_flat":
        index = faiss.IndexIVFFlat(quantizer, dim, build["nlist"], ip)
    elif kind == "ivf_pqfs":  # 4-bit codes in blocks of 32 (FAISS's bbs), scanned with SIMD lookup tables
        index = faiss.IndexIVFPQFastScan(quantizer, width, build["nlist"], build["m"], build["nbits"], ip)
        index.pq.cp.seed = build["seed"]
    else:
        index = faiss.IndexIVFPQ(quantizer, width, build["nlist"], build["m"], build["nbits"], ip)
        index.pq.cp.seed = build["seed"]
        # FAISS's k-means prints a warning per codebook (pq.m of them) to stderr below 39 points a centroid; it
        # changes nothing else (Clustering::train_encoded): build_index logs one line instead
        index.pq.cp.min_points_per_centroid = 1
    index.cp.seed = build["seed"]
    if width != dim:  # the first dim coordinates as they are, zeros after (RemapDimensionsTransform, not uniform)
        index = faiss.IndexPreTransform(faiss.RemapDimensionsTransform(dim, width, False), index)
    if build.get("refine") == "flat":  # search.refine_factor: k_factor x k codes' hits re-ranked by the full vectors
        index = faiss.IndexRefineFlat(index)  # keeps a reference to the IVF-PQ index (add_ref_in_constructor)
    return index


def build_index(faiss, kind: str, items: np.ndarray, build: dict, update) -> object:
    """The index of ``kind`` over ``items``: trained (IVF: on every item), then filled in blocks."""
    index = new_index(faiss, kind, items.shape[1], build)
    if kind in PQ_INDEXES and len(items) < PQ_POINTS * 2 ** build["nbits"]:
        log.info("IVF-PQ: %d codebook centroids (nbits=%d) trained on %d items (FAISS suggests %d a centroid)",
                 2 ** build["nbits"], build["nbits"], len(items), PQ_POINTS)
    if not index.is_trained:
        index.train(np.ascontiguousarray(items, dtype=np.float32))
    for start in range(0, len(items), ADD_BLOCK):
        block = np.ascontiguousarray(items[start:start + ADD_BLOCK], dtype=np.float32)
        index.add(block)
        update(len(block))
    return index


def set_search_params(faiss, index, params: dict) -> None:
    """``nprobe`` / ``efSearch`` on a CPU index (after it was built or read: never stored)."""
    if "nprobe" in params:  # the IVF index itself, inside an IndexPreTransform when the vectors are padded
        gallery_index.ivf_part(faiss, index).nprobe = params["nprobe"]
    index = faiss.downcast_index(index)
    if "k_factor" in params:  # IndexRefineFlat: how many codes' hits per result the full vectors re-rank
        index.k_factor = float(params["k_factor"])
    if "efSearch" in params:
        index.hnsw.efSearch = params["efSearch"]


def searcher(faiss, index, kind: str, device: torch.device, k: int, params: dict) -> tuple[object, str, object]:
    """(the index to search, where it searches, the GPU resources to keep alive): a GPU copy of a flat or IVF
    index when ``device`` is CUDA and this FAISS has GPUs, else the CPU index itself."""
    if (device.type != "cuda" or kind in CPU_ONLY or "k_factor" in params or not hasattr(faiss, "StandardGpuResources")
            or faiss.get_num_gpus() < 1 or k > GPU_MAX_K or params.get("nprobe", 0) > GPU_MAX_K):
        return index, "cpu", None
    try:
        resources = faiss.StandardGpuResources()
        gpu = faiss.index_cpu_to_gpu(resources, device.index or 0, index)  # copies nprobe from the CPU index
    except RuntimeError as err:  # a form this GPU build does not take (an IVF-PQ code size it lacks, ...)
        log.warning("FAISS could not move the %s index to %s (%s); searching on the CPU", kind, device, err)
        return index, "cpu", None
    if "nprobe" in params and hasattr(gpu, "nprobe"):
        gpu.nprobe = params["nprobe"]
    return gpu, "cuda", resources


def block_search(faiss, index, params: dict, where: str = "cpu") -> tuple[Callable, int]:
    """(search(rows, k) -> (scores, ids), the queries it takes at a time) for ``index`` as ``params`` search it:
    list-major on the CPU when ``search.list_major`` is set (:mod:`.list_major`), else FAISS's own search."""
    if params.get("list_major") and where == "cpu" and list_major.supported(faiss, index):
        return (lambda rows, k: list_major.search(faiss, index, rows, k)), list_major.BLOCK
    return index.search, QUERY_BLOCK


def search_blocks(search: Callable, block: int, queries: np.ndarray, k: int, update
                  ) -> tuple[np.ndarray, np.ndarray, float]:
    """(ids int64, scores float32 with -inf beside -1 ids, seconds) of ``queries`` searched ``k`` deep by
    ``search`` (:func:`block_search`), ``block`` queries at a time."""
    ids = np.empty((len(queries), k), dtype=np.int64)
    scores = np.empty((len(queries), k), dtype=np.float32)
    seconds = 0.0
    for start in range(0, len(queries), block):
        rows = np.ascontiguousarray(queries[start:start + block], dtype=np.float32)
        started = time.perf_counter()
        scores[start:start + len(rows)], ids[start:start + len(rows)] = search(rows, k)
        seconds += time.perf_counter() - started
        update(len(rows))
    scores[ids < 0] = -np.inf
    return ids, scores, seconds


def _no_progress(_desc: str, _total: int):
    return lambda _n: None


def _index(faiss, model: ModelEmbeddings, direction: str, items: np.ndarray, build: dict, config: SearchConfig,
           store_dir: str | None, progress: Progress) -> StoredIndex:
    """The index of ``items`` from the store (``store_dir``), else built (and stored when there is a store)."""
    def make():
        return build_index(faiss, config.index, items, build, progress(f"index {model.name} {direction}", len(items)))

    if store_dir is None:
        return build_unstored(make)

    (digest,) = shared_digests([np.asarray(items, dtype=np.float32)])
    material = index_material(digest, len(items), items.shape[1], direction, config.index, build, faiss_version())
    return IndexStore(store_dir).get_or_build(material, make, {"model": model.name, "direction": direction})


def _tune(faiss, index, config: SearchConfig, build: dict, tuning: TuningQueries, model: str, direction: str,
          blocks: Callable[[], Iterable[tuple[int, np.ndarray]]], k: int, n_items: int, what: str,
          stored: StoredIndex | None = None, store_dir: str | None = None,
          progress: Progress = _no_progress) -> Tuned:
    """The smallest nprobe / efSearch reaching ``config.target_recall`` (:mod:`.target_recall`) on ``tuning``'s
    queries of ``model`` in ``direction``, searched on the CPU index itself, against exact search over the same
    items (``blocks()``: the items as :func:`.target_recall.exact_top` reads them); two bars: the exact reference
    over the items, then the values tried. With a store (``store_dir``) and a stored index (``stored``), the
    choice is read from the tuning store when it was made before for the same index and queries
    (``stores.tunings``): no item is read and the index is not searched."""
    fixed = search_params(config)  # the settings not tuned (a refined IVF-PQ's k_factor) as they will search
    queries = np.ascontiguousarray(tuning.rows[model][direction], dtype=np.float32)
    low, high = target_recall.bounds(config.tuned, build.get("nlist"), k, n_items)

    def choose() -> Tuned:
        started = time.perf_counter()
        exact_ids = target_recall.exact_top(queries, blocks(), k,
                                            progress(f"tuning {model} {direction}: exact reference", n_items))
        exact_seconds = time.perf_counter() - started

        run, _block = block_search(faiss, index, fixed)

        def search(rows: np.ndarray, value: int) -> np.ndarray:
            set_search_params(faiss, index, {**fixed, config.tuned: value})
            return run(rows, k)[1]

        tries = progress(f"tuning {model} {direction}: {config.tuned} tried", target_recall.most_tries(low, high))
        return target_recall.choose(search, queries, exact_ids, k, config.tuned, low, high, config.target_recall,
                                    what, tuning.describe(), exact_seconds, tries)

    if store_dir is None or stored is None or stored.key is None:
        return choose()
    material = tuning_material(stored.key, array_digest(queries), k, config.target_recall, config.tuned, low, high,
                               fixed)
    chosen, _hit = TuningStore(store_dir).get_or_choose(material, lambda: choose().to_json(config.target_recall),
                                                        {"model": model, "direction": direction})
    return Tuned.from_json(chosen)


def _tuned(tuning: TuningQueries | None, model: str) -> TuningQueries:
    if tuning is None or model not in tuning.rows:
        raise ValueError(f"search.target_recall needs tuning queries of model {model} (the app gathers them)")
    return tuning


def _direction(faiss, model, direction, items, queries, depth, config, device, store_dir, progress, tuning=None):
    """One direction's (ids, scores, cost, params); ``tuning``: the queries a target recall is chosen on."""
    k = min(depth, len(items))
    build = build_params(config, len(items), items.shape[1], model.name)
    params = {**build, **search_params(config)}
    stored = _index(faiss, model, direction, items, build, config, store_dir, progress)
    tuned = None
    if config.tuned:
        tuned = _tune(faiss, stored.index, config, build, _tuned(tuning, model.name), model.name, direction,
                      lambda: target_recall.array_blocks(items), k, len(items),
                      f"model {model.name}'s {direction} index", stored, store_dir, progress)
        params[config.tuned] = tuned.value
    set_search_params(faiss, stored.index, params)
    index, where, _resources = searcher(faiss, stored.index, config.index, device, k, params)
    ids, scores, seconds = search_blocks(*block_search(faiss, index, params, where), queries, k,
                                         progress(f"search {model.name} {direction}", len(queries)))
    cost = IndexQuality(neighbour_recall=0.0, top1_agreement=0.0, depth=k, build_seconds=stored.build_seconds,
                        index_bytes=stored.index_bytes, query_ms=1000 * seconds / max(len(queries), 1),
                        stored=stored.stored, hit=stored.hit, key=stored.key, where=where,
                        target=None if tuned is None else tuned.to_json(config.target_recall))
    return ids, scores, cost, params


def _gallery_index(faiss, model: ModelEmbeddings, config: SearchConfig, store_dir: str | None, progress: Progress
                   ) -> tuple[StoredIndex, dict, bool]:
    """The t2i index over ``model``'s gallery (test images, then its distractors), streamed
    (:mod:`.gallery_index`): from the store, else built; (it, its build parameters, whether its lists are on disk)."""
    tiles = GalleryTiles(model.image, model.distractors, GALLERY_CHUNK)
    n, dim = tiles.n, model.image.shape[1]
    build = build_params(config, n, dim, model.name)
    plan = gallery_index.memory_plan(config.index, n, dim, build, GALLERY_CHUNK, config.max_memory_gb)
    sample = gallery_index.train_sample(n, gallery_index.train_size(config.index, n, build), config.seed)
    if config.index in PQ_INDEXES and len(sample) < PQ_POINTS * 2 ** build["nbits"]:
        log.info("IVF-PQ: %d codebook centroids (nbits=%d) trained on %d rows", 2 ** build["nbits"], build["nbits"],
                 len(sample))

    def make(ivfdata=None):
        index = new_index(faiss, config.index, dim, build)
        reading = progress(f"index {model.name} t2i (gallery): training sample read", n) if len(sample) else None
        return gallery_index.build_streamed(faiss, index, config.index, tiles, sample, ivfdata,
                                            progress(f"index {model.name} t2i (gallery)", n), reading)

    if store_dir is None:
        if plan.on_disk:
            raise FusebenchError(f"search.max_memory_gb={config.max_memory_gb:g} puts model {model.name}'s inverted "
                                 f"lists ({plan.codes_bytes / 1e9:.2f} GB) on disk, in the index store, and "
                                 "eval.lists.store=false keeps no store: valid: eval.lists.store=true, or "
                                 "search.max_memory_gb=null.")
        return build_unstored(make), build, False

    (digest,) = shared_digests([np.asarray(model.image, dtype=np.float32)])
    items = gallery_index.gallery_digest(digest, model.distractors.key)
    material = {**index_material(items, n, dim, "t2i", config.index, build, faiss_version()),
                "gallery": {"train_rows": len(sample), "train_seed": config.seed if len(sample) < n else None,
                            "on_disk": plan.on_disk}}
    stored = IndexStore(store_dir).get_or_build(material, make, {"model": model.name, "direction": "t2i",
                                                                 "gallery": True}, on_disk=plan.on_disk)
    return stored, build, plan.on_disk


def _tile_blocks(tiles: GalleryTiles):
    """A gallery's items as :func:`.target_recall.exact_top` reads them: tile by tile, each read once."""
    for t, (c0, _c1) in enumerate(tiles.tiles):
        yield c0, tiles.rows(t)
        tiles.release(t)


def _gallery_lists(faiss, model: ModelEmbeddings, caption_image: np.ndarray, depth: int, config: SearchConfig,
                   device: torch.device, store_dir: str | None, progress: Progress, exact: ModelLists,
                   tuning: TuningQueries | None = None) -> AnnLists:
    """t2i from the index over the whole gallery; i2t as the exact path gives it (only test images ask i2t
    queries, and distractors are no i2t item): ``exact``'s i2t lists, cut to ``depth``, exact ranks."""
    stored, build, on_disk = _gallery_index(faiss, model, config, store_dir, progress)
    n = model.n_items
    k = min(depth, n)
    params = {**build, **search_params(config)}
    tuned = None
    if config.tuned:
        tiles = GalleryTiles(model.image, model.distractors, GALLERY_CHUNK)
        tuned = _tune(faiss, stored.index, config, build, _tuned(tuning, model.name), model.name, "t2i",
                      lambda: _tile_blocks(tiles), k, n, f"model {model.name}'s t2i index (gallery)", stored,
                      store_dir, progress)
        params[config.tuned] = tuned.value
    if on_disk:
        params["on_disk"] = True
    set_search_params(faiss, stored.index, params)
    index, where, _resources = (stored.index, "cpu", None) if on_disk else searcher(
        faiss, stored.index, config.index, device, k, params)
    ids, scores, seconds = search_blocks(*block_search(faiss, index, params, where), model.text, k,
                                         progress(f"search {model.name} t2i", len(model.text)))
    cost = IndexQuality(neighbour_recall=0.0, top1_agreement=0.0, depth=k, build_seconds=stored.build_seconds,
                        index_bytes=stored.index_bytes, query_ms=1000 * seconds / max(len(model.text), 1),
                        stored=stored.stored, hit=stored.hit, key=stored.key, where=where,
                        target=None if tuned is None else tuned.to_json(config.target_recall))
    i2t = exact["i2t"]
    width = min(depth, i2t.ids.shape[1])
    ranks = t2i_list_ranks(torch.from_numpy(ids), torch.from_numpy(np.asarray(caption_image, dtype=np.int64)))
    arrays = {"t2i_ids": ids.astype(np.int32), "t2i_scores": scores, "t2i_ranks": np.asarray(ranks, dtype=np.int64),
              "i2t_ids": np.ascontiguousarray(i2t.ids.numpy()[:, :width]),
              "i2t_scores": np.ascontiguousarray(i2t.scores.numpy()[:, :width]), "i2t_ranks": np.asarray(i2t.ranks)}
    return AnnLists(ModelLists.from_arrays(depth, arrays), {"t2i": cost}, {"t2i": params})


@contextlib.contextmanager
def _threads(faiss, threads: int | None):
    """``search.threads`` for what runs inside: FAISS's OpenMP threads and, where threadpoolctl is installed (the
    faiss extra), numpy's BLAS threads (a list-major search's matmuls are numpy's); both restored after."""
    if not threads:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads, user_api="blas") if threadpool_limits else contextlib.nullcontext():
            yield
    finally:
        faiss.omp_set_num_threads(before)


def faiss_lists(model: ModelEmbeddings, caption_image: np.ndarray, depth: int, config: SearchConfig,
                device: torch.device, store_dir: str | None, progress: Progress | None = None,
                exact: ModelLists | None = None, tuning: TuningQueries | None = None) -> AnnLists:
    """``model``'s lists ``depth`` deep in both directions from FAISS indexes of ``config.index`` (see the module);
    ``exact``: the model's exact lists, at least ``depth`` deep (needed over a gallery: its i2t lists);
    ``tuning``: the queries ``config.target_recall`` chooses the search-time setting on (needed when it is set)."""
    faiss = require("faiss")
    progress = progress or _no_progress
    if model.distractors is not None:
        if exact is None:
            raise ValueError("an index over a gallery needs the exact gallery lists (its i2t lists)")
        with _threads(faiss, config.threads):
            return _gallery_lists(faiss, model, caption_image, depth, config, device, store_dir, progress, exact,
                                  tuning)
    caption_image = np.asarray(caption_image, dtype=np.int64)
    query_images = np.unique(caption_image)
    sides = {"t2i": (model.image, model.text), "i2t": (model.text, model.image[query_images])}
    with _threads(faiss, config.threads):
        out = {d: _direction(faiss, model, d, items, queries, depth, config, device, store_dir, progress, tuning)
               for d, (items, queries) in sides.items()}
    cap_img = torch.from_numpy(caption_image)
    ranks = {"t2i": t2i_list_ranks(torch.from_numpy(out["t2i"][0]), cap_img),
             "i2t": i2t_list_ranks(torch.from_numpy(out["i2t"][0]), torch.from_numpy(query_images), cap_img)}
    arrays = {}
    for d, (ids, scores, _cost, _params) in out.items():
        arrays.update({f"{d}_ids": ids.astype(np.int32), f"{d}_scores": scores,
                       f"{d}_ranks": np.asarray(ranks[d], dtype=np.int64)})
    return AnnLists(ModelLists.from_arrays(depth, arrays), {d: o[2] for d, o in out.items()}, {d: o[3] for d, o in out.items()})
