"""Every retriever's ranked lists and exact ranks, both directions: each model's lists (from the list
store, or computed once and stored), then fusion over them.

* A model alone: its stored lists (top ``depth`` per query) and exact ranks in its full ranking.
* Fusion with ``top_k`` set: each model's stored lists cut to ``top_k``, fused (:mod:`fusebench.fusion.combine`).
  No similarity is computed when every model's lists are stored.
* Fusion with ``top_k: null`` (whole rankings): the dense path (:mod:`fusebench.fusion.whole_rankings`), one bounded
  block of queries at a time, over each model's whole score matrices: from the score store when they fit
  under ``max_scores_mb`` (computed once per model), else recomputed block by block.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from fusebench import DIRECTIONS, FUSED, FusebenchError
from fusebench.backends.gallery_slices import merged_lists
from fusebench.encoders.base import ModelEmbeddings
from fusebench.fusion import methods as registry
from fusebench.fusion.combine import fuse_in_blocks
from fusebench.fusion.config import RANK_METHODS, FusionConfig
from fusebench.fusion.whole_rankings import DenseSide, RowBlocks, correct_items, dense_fuse
from fusebench.runtime.progress import Progress
from fusebench.search.exact import float_rows
from fusebench.search.gallery_search import gallery_lists
from fusebench.search.model_lists import (
    ModelLists,
    compute_model_lists,
    full_rows,
    lists_pass,
    row_tile,
    tiles,
    whole_rows_in_pass,
)
from fusebench.search.ranked import RankedLists, i2t_list_ranks, t2i_list_ranks
from fusebench.stores.lists import ListStore, list_materials
from fusebench.stores.scores import ScoreStore

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fusebench.backends.target_recall import TuningQueries


@dataclass
class SearchSettings:
    """How to search: where, in what tiles, how deep to store lists, and where the list store is."""

    device: torch.device | str = "cpu"
    chunk_size: int = 4096  # query rows per similarity tile
    item_chunk_size: int = 16384  # item columns per similarity tile
    depth: int = 100  # list depth stored per model (at least top_k and the saved length)
    store_dir: str | None = None  # list store root (the embedding cache folder); None = no store
    max_scores_mb: int = 2048  # top_k null: store a model's whole score matrices up to this size (MB)
    precision: str | None = None  # a gallery's distractor tiles: None (bf16 on cuda, fp32 elsewhere) | fp32 | bf16 | tf32
    progress: Progress | None = None
    tuning: TuningQueries | None = None  # search.target_recall: the queries outside the metrics it is chosen on
    slices: int | None = None  # gallery.slices: a gallery's lists merged from its stored slices (computing any missing)
    whole_rows: bool = False  # a job of this process fuses whole rankings: lists computed here also store the score
    #   matrices it will read, in the same pass (model_lists)

    @property
    def tile_bytes(self) -> int:
        return 4 * self.chunk_size * self.item_chunk_size


@dataclass
class ListSource:
    """Where each model's lists (and score matrices) came from, for metrics.json: hit, key, seconds; and each
    model's store key material, hashed once per run."""

    records: dict[str, dict] = field(default_factory=dict)
    materials: dict[str, dict] = field(default_factory=dict)
    # per model and direction, when its gallery lists were computed here (gallery_lists' t2i_seconds, i2t_seconds)
    direction_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    scored: set[str] = field(default_factory=set)  # models whose score matrices this run stored in its list pass

    def prepare(self, models: Sequence[ModelEmbeddings], caption_image: np.ndarray, device_type: str) -> None:
        """Hash every model's key material at once, on all cores (the keys of a job's models in one go)."""
        todo = [m for m in models if m.name not in self.materials]
        if not todo:
            return
        found = list_materials([(np.asarray(m.image), np.asarray(m.text)) for m in todo], caption_image, device_type)
        self.materials.update({m.name: material if m.distractors is None else {**material, "distractors": m.distractors.key}
                               for m, material in zip(todo, found)})

    def material(self, model: ModelEmbeddings, caption_image: np.ndarray, device_type: str) -> dict:
        self.prepare([model], caption_image, device_type)
        return self.materials[model.name]


def _direction_record(source: ListSource, name: str, hit: bool) -> dict:
    """A gallery search's seconds by direction, as metrics.json records them beside its lists (``run.lists.NAME``:
    ``t2i_seconds``, ``i2t_seconds``), when this run computed them."""
    found = source.direction_seconds.get(name)
    if hit or found is None:
        return {}
    return {"t2i_seconds": round(found["t2i"], 3), "i2t_seconds": round(found["i2t"], 3)}


def _no_progress(_desc: str, _total: int) -> Callable[[int], None]:
    return lambda _n: None


def model_lists(model: ModelEmbeddings, caption_image: np.ndarray, depth: int, settings: SearchSettings,
                source: ListSource) -> ModelLists:
    """One model's lists at least ``depth`` deep: from the store when present, else computed (and stored)."""
    device = torch.device(settings.device)
    progress = settings.progress or _no_progress

    def compute(d: int) -> ModelLists:
        update = progress(f"lists {model.name}", len(caption_image))
        if model.distractors is None:
            lists = _lists_storing_scores(model, caption_image, d, settings, source, update)
            if lists is None:
                lists = compute_model_lists(model.text, model.image, caption_image, d, device, settings.chunk_size,
                                            settings.item_chunk_size, update)
        elif settings.slices is not None:  # the store is required (run_config.check_search)
            found: dict = {}
            lists = merged_lists(model, caption_image, d, settings, source.material(model, caption_image, device.type),
                                 settings.slices, update, found)
            source.direction_seconds[model.name] = {"t2i": found["t2i_seconds"], "i2t": found["i2t_seconds"]}
        else:
            stats: dict = {}
            lists = gallery_lists(model.text, model.image, caption_image, model.distractors, d, device,
                                  settings.chunk_size, settings.item_chunk_size, update, settings.precision, stats)
            source.direction_seconds[model.name] = {"t2i": stats["t2i_seconds"], "i2t": stats["i2t_seconds"]}
        return lists

    n_images, n_captions = model.n_items, len(model.text)
    if settings.store_dir is None:
        lists = compute(depth)
        source.records[model.name] = {"hit": False, "stored": False, **_direction_record(source, model.name, False)}
        return lists
    store = ListStore(settings.store_dir)
    material = source.material(model, caption_image, device.type)
    found = store.get_or_compute(material, depth, n_images, n_captions, compute, {"model": model.name})
    source.records[model.name] = {"hit": found.hit, "stored": True, "key": found.key,
                                  **({"with_scores": True} if model.name in source.scored and not found.hit else {}),
                                  "depth": found.lists.depth, "seconds": round(found.seconds, 3),
                                  **_direction_record(source, model.name, found.hit)}
    return found.lists


def _score_shapes(model: ModelEmbeddings, n_query_images: int) -> dict[str, tuple[int, int]]:
    return {"t2i": (len(model.text), len(model.image)), "i2t": (n_query_images, len(model.text))}


def _stores_scores(shapes: dict[str, tuple[int, int]], settings: SearchSettings) -> bool:
    """Whether a model's whole score matrices go to the score store (a store, and under ``max_scores_mb``)."""
    return settings.store_dir is not None and _megabytes(shapes) <= settings.max_scores_mb


def _megabytes(shapes: dict[str, tuple[int, int]]) -> float:
    return 4 * sum(a * b for a, b in shapes.values()) / 2**20


def _lists_storing_scores(model: ModelEmbeddings, caption_image: np.ndarray, depth: int, settings: SearchSettings,
                          source: ListSource, update: Callable[[int], None]) -> ModelLists | None:
    """The model's lists from a pass that also writes its whole score matrices to the score store, when a job of
    this process will read them (``settings.whole_rows``), they are stored (``score_rows``) and not stored yet,
    and the pass sees whole rows (one item tile); else None (the caller computes the lists alone). The matrix is
    the pass's own tiles, the shapes ``score_rows`` computes it in: the same bits either way."""
    query_images = np.unique(np.asarray(caption_image))
    shapes = _score_shapes(model, len(query_images))
    if not (settings.whole_rows and whole_rows_in_pass(len(model.image), settings.item_chunk_size)
            and _stores_scores(shapes, settings)):
        return None
    device = torch.device(settings.device)
    found: dict[str, ModelLists] = {}

    def t2i_blocks() -> Iterator[torch.Tensor]:
        passing = lists_pass(model.text, model.image, caption_image, depth, device, settings.chunk_size,
                             settings.item_chunk_size, update)
        while True:
            try:
                yield next(passing)
            except StopIteration as done:
                found["lists"] = done.value
                return

    try:
        ScoreStore(settings.store_dir).get_or_compute(source.material(model, caption_image, device.type), shapes,
                                                       t2i_blocks, query_images, settings.tile_bytes,
                                                       {"model": model.name})
    except OSError as err:  # the lists need no score matrices: they take a pass of their own
        log.warning("score store: could not write %s's score matrices beside its lists (%s); the lists are "
                    "computed alone", model.name, err)
        return None
    if "lists" not in found:  # the matrices were stored already: the pass never ran
        return None
    source.scored.add(model.name)
    return found["lists"]


def score_rows(model: ModelEmbeddings, caption_image: np.ndarray, query_images: np.ndarray, settings: SearchSettings,
               source: ListSource, orders: bool = False, moments_ddof: int | None = None
               ) -> tuple[dict[str, RowBlocks], dict[str, dict[str, RowBlocks]]]:
    """Per direction, the model's whole score rows by block: from the score store (computed once) when the
    matrices fit under ``max_scores_mb``, else computed afresh for each block; and what the store keeps
    beside them for this job, by name and direction (on the CPU; nothing when the rows are not stored):
    ``order`` (with ``orders``: RRF by source object), each row's order, sorted once; ``moments`` (with
    ``moments_ddof``: DBSF, z-score), each row's mean and sd, computed once."""
    device = torch.device(settings.device)
    shapes = _score_shapes(model, len(query_images))

    def fresh_rows() -> dict[str, RowBlocks]:
        """Rows computed from the embeddings, block by block (built only when something will compute)."""
        image, text = float_rows(model.image, device), float_rows(model.text, device)
        sides = {"t2i": (text, image), "i2t": (image[torch.as_tensor(query_images, device=device)], text)}
        def out(r0: int, r1: int, items: torch.Tensor, into: np.ndarray | None) -> torch.Tensor:
            return torch.empty(r1 - r0, items.shape[0], device=device) if into is None else torch.from_numpy(into[: r1 - r0])

        return {d: (lambda r0, r1, into=None, q=q, items=items: full_rows(q[r0:r1], items, settings.item_chunk_size,
                                                                            out(r0, r1, items, into)))
                for d, (q, items) in sides.items()}

    megabytes = _megabytes(shapes)
    if not _stores_scores(shapes, settings):
        source.records.setdefault(model.name, {})["scores"] = {"stored": False, "mb": round(megabytes)}
        return fresh_rows(), {}

    def t2i_blocks():  # where one item tile holds a row, the list pass's tiles (model_lists.row_tile): the same bits
        rows = fresh_rows()["t2i"]
        n_captions, n_images = shapes["t2i"]
        step = (row_tile(n_captions, settings.chunk_size) if whole_rows_in_pass(n_images, settings.item_chunk_size)
                else max(1, settings.tile_bytes // (4 * n_images)))  # else rows of tile_bytes at most
        return (rows(r0, r1) for r0, r1 in tiles(n_captions, step))

    material = source.material(model, caption_image, device.type)
    started = time.perf_counter()
    store = ScoreStore(settings.store_dir)
    readers, hit = store.get_or_compute(material, shapes, t2i_blocks, query_images, settings.tile_bytes,
                                        {"model": model.name})
    beside = {}  # a GPU sorts or sums a block faster than the disk reads its result: CPU only
    if orders and device.type == "cpu":
        beside["order"] = {d: store.row_orders(readers[d], settings.tile_bytes) for d in DIRECTIONS}
    if moments_ddof is not None and device.type == "cpu":
        beside["moments"] = {d: store.row_moments(readers[d], moments_ddof, settings.tile_bytes) for d in DIRECTIONS}
    hit = hit and model.name not in source.scored  # stored by this run's own list pass: computed here
    source.records.setdefault(model.name, {})["scores"] = {"stored": True, "hit": hit, "mb": round(megabytes),
                                                           "orders": "order" in beside, "moments": "moments" in beside,
                                                           "seconds": round(time.perf_counter() - started, 3)}
    return {d: (lambda r0, r1, into=None, reader=readers[d]: reader(r0, r1, into=into).to(device))
            for d in DIRECTIONS}, beside


def _cut(values: torch.Tensor, length: int | None) -> torch.Tensor:
    """The first ``length`` columns (None = all) as a new int64 (ids) or float32 (scores) tensor."""
    return values[:, :length].to(torch.int64 if not values.is_floating_point() else torch.float32, copy=True)


def list_depth(fusion: FusionConfig, keep_k: int | None, settings: SearchSettings) -> int:
    """How deep each model's lists are searched: the stored depth, ``top_k`` and the saved length, whichever is most."""
    return max(settings.depth, fusion.top_k or 0, keep_k or 0)


def exact_lists(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, depth: int, settings: SearchSettings,
                source: ListSource) -> dict[str, ModelLists]:
    """Every model's exact lists ``depth`` deep (from the list store, or computed once and stored)."""
    if settings.store_dir is not None:
        source.prepare(models, caption_image, torch.device(settings.device).type)
    return {m.name: model_lists(m, caption_image, depth, settings, source) for m in models}


def retrieve(models: Sequence[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig, keep_k: int | None,
             settings: SearchSettings | None = None, source: ListSource | None = None,
             stored: dict[str, ModelLists] | None = None) -> dict[str, dict[str, RankedLists]]:
    """Ranked lists and ranks for each model alone and, with 2+ models and a method, for ``fused``.

    Ranks are exact in each model's full ranking (a fused retriever's in its ``final_top_k`` list). The
    lists returned are cut to ``keep_k`` entries (None = as long as the run has them: ``top_k``, or the
    stored depth for single models and for ``top_k: null``). i2t rows are the images that have captions.
    ``stored``: each model's lists from elsewhere (an approximate index: their ranks are list ranks, 0 past the
    list), fused as they are; None = exact lists (:func:`exact_lists`).
    """
    settings = settings or SearchSettings()
    source = source if source is not None else ListSource()
    caption_image = np.asarray(caption_image, dtype=np.int64)
    n_captions, n_images = len(caption_image), models[0].n_items
    fusing = fusion.method != "none" and len(models) >= 2
    depth = list_depth(fusion, keep_k, settings)
    if stored is None:
        stored = exact_lists(models, caption_image, depth, settings, source)
    single_len = keep_k if keep_k is not None else (fusion.top_k or depth)
    results = {name: {d: RankedLists(ranks=lists[d].ranks, ids=_cut(lists[d].ids, single_len),
                                 scores=_cut(lists[d].scores, single_len))
                      for d in DIRECTIONS} for name, lists in stored.items()}
    if not fusing:
        return results
    weights = [float(m.weight) for m in models]
    cap_img = torch.as_tensor(caption_image)
    query_images = torch.unique(cap_img)
    n_items = {"t2i": n_images, "i2t": n_captions}
    results[FUSED] = {}
    if fusion.top_k is not None:
        for d in DIRECTIONS:
            k = fusion.per_model_k(n_items[d])
            ids = [_cut(stored[m.name][d].ids, k) for m in models]
            scores = [_cut(stored[m.name][d].scores, k) for m in models]
            fused = fuse_in_blocks(ids, scores, fusion, fusion.final_k(n_items[d], len(models)), weights)
            ranks = (t2i_list_ranks(fused.ids, cap_img) if d == "t2i"
                     else i2t_list_ranks(fused.ids, query_images, cap_img))
            results[FUSED][d] = fused.cut(keep_k).with_ranks(ranks)
        return results
    if any(m.distractors is not None for m in models):
        raise FusebenchError("fusion.top_k=null fuses whole rankings, which a gallery with distractors does not hold "
                             "in memory: set fusion.top_k (e.g. 100).")
    i2t_correct = correct_items(caption_image, query_images.numpy())
    sorts = fusion.method in RANK_METHODS and fusion.fuse_on == "source_object"  # the whole-row order of each model
    ddof = fusion.params["ddof"] if fusion.method != "none" and registry.method(fusion.method).moments else None  # rows' mean, sd
    rows, beside = zip(*(score_rows(m, caption_image, query_images.numpy(), settings, source, sorts, ddof)
                         for m in models))

    def kept_beside(what: str, d: str) -> list[RowBlocks] | None:  # every model's, or none
        return [b[what][d] for b in beside] if all(what in b for b in beside) else None

    correct = {"t2i": cap_img[:, None].to(settings.device), "i2t": torch.as_tensor(i2t_correct, device=settings.device)}
    from_store = all(source.records[m.name]["scores"]["stored"] for m in models)
    sides = {d: DenseSide([r[d] for r in rows], n_items[d], correct[d], kept_beside("order", d), kept_beside("moments", d),
                          from_store) for d in DIRECTIONS}
    progress = settings.progress or _no_progress
    keep = keep_k if keep_k is not None else depth
    for d in DIRECTIONS:
        final_k = fusion.final_k(n_items[d], len(models))
        fused, ranks = dense_fuse(sides[d], weights, fusion, keep, final_k, 2 * settings.tile_bytes,
                                  progress(f"fuse {d} (whole rankings)", len(sides[d].correct)))
        results[FUSED][d] = fused.with_ranks(ranks)
    return results
