"""Exact search of a gallery cut into ``gallery.slices`` slices: a slice job (``gallery.slice=N``) computes its
slice of every model and stores it (:mod:`fusebench.stores.slice_lists`); the merge (a run with ``gallery.slices`` and
no ``gallery.slice``) reads every slice, computes here any slice not stored (logged, with the command that runs them
as jobs), and merges them into the one-process pass's lists and ranks, bit for bit (:mod:`fusebench.search.slices`).
A slice job reads only its own tiles of the gallery's rows (and the tiles holding its captions' targets: test
images), so its memory is bounded by the tiles and its lists; the merge holds the running lists and one slice's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from fusebench.encoders.base import ModelEmbeddings
from fusebench.search.exact import float_rows
from fusebench.search.gallery_search import gallery_pass, pass_tiles
from fusebench.search.margin import resolve_precision
from fusebench.search.model_lists import ModelLists, i2t_ranks
from fusebench.search.slices import SlicePart, check_slices, merge_slices, part_from_pass, part_problem, slice_tiles
from fusebench.stores.slice_lists import SliceResult, SliceStore, slice_material

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slicing:
    """The slices of one model's gallery: each slice's tiles and item bounds."""

    n_items: int
    tiles: list[tuple[int, int]]
    walks: list[range]

    @classmethod
    def of(cls, model: ModelEmbeddings, slices: int, item_chunk_size: int) -> Slicing:
        n_items = model.n_items
        tiles = pass_tiles(n_items, item_chunk_size)
        check_slices(slices, n_items, len(tiles), item_chunk_size)
        return cls(n_items, tiles, slice_tiles(len(tiles), slices))

    def bounds(self, index: int) -> tuple[int, int]:
        walk = self.walks[index]
        return self.tiles[walk.start][0], self.tiles[walk.stop - 1][1]


def model_slice(model: ModelEmbeddings, caption_image: np.ndarray, depth: int, settings, list_material: dict,
                slicing: Slicing, index: int, progress: Callable[[int], None] | None = None) -> SliceResult:
    """Slice ``index`` of ``model`` at least ``depth`` deep: from the slice store, else computed and stored."""
    device = torch.device(settings.device)
    precision = resolve_precision(settings.precision, device)
    start, stop = slicing.bounds(index)
    material = slice_material(list_material, len(slicing.walks), index, start, stop, settings.chunk_size,
                              settings.item_chunk_size, precision)
    query_images = np.unique(np.asarray(caption_image))
    n_captions = len(caption_image)

    def compute(d: int) -> tuple[dict[str, np.ndarray], dict]:
        started = time.perf_counter()
        found = gallery_pass(model.text, model.image, caption_image, model.distractors, d, device, settings.chunk_size,
                             settings.item_chunk_size, progress, settings.precision, slicing.walks[index])
        seconds = time.perf_counter() - started
        part = part_from_pass(found, start, stop)
        return part.arrays(), {"start": start, "stop": stop, "t2i_seconds": round(seconds - found.i2t_seconds, 3),
                               "i2t_seconds": round(found.i2t_seconds, 3)}

    def check(arrays: dict[str, np.ndarray], stored_depth: int) -> str | None:
        return part_problem(arrays, start, stop, n_captions, stored_depth, query_images)

    return SliceStore(settings.store_dir).get_or_compute(material, depth, check, compute,
                                                         {"model": model.name, "slice": index})


def _share(progress: Callable[[int], None] | None, parts: int) -> Callable[[int], None] | None:
    """``progress`` fed 1/``parts`` of what it is told (a bar over captions, told by each of ``parts`` passes)."""
    if progress is None:
        return None
    told = {"done": 0, "shown": 0}

    def update(rows: int) -> None:
        told["done"] += rows
        now = told["done"] // parts
        if now > told["shown"]:
            progress(now - told["shown"])
            told["shown"] = now

    return update


def _part(found: SliceResult, start: int, stop: int, depth: int, n_captions: int) -> SlicePart:
    return SlicePart(start, stop, **found.arrays).cut(depth, n_captions)


def merged_lists(model: ModelEmbeddings, caption_image: np.ndarray, depth: int, settings, list_material: dict,
                 slices: int, progress: Callable[[int], None] | None = None, record: dict | None = None) -> ModelLists:
    """``model``'s lists and ranks over its gallery, merged from its ``slices`` stored slices (each missing one
    computed here first): what :func:`fusebench.search.gallery_search.gallery_lists` gives, bit for bit.
    ``record`` gets, per slice, whether it was read or computed here, and the slices' summed seconds."""
    device = torch.device(settings.device)
    slicing = Slicing.of(model, slices, settings.item_chunk_size)
    n_captions = len(caption_image)
    query_images = np.unique(np.asarray(caption_image))
    seconds = {"t2i": 0.0, "i2t": 0.0}
    computed: list[int] = []

    share = _share(progress, slices)  # each slice computed here walks every caption: a slice's share of the bar

    def parts() -> Iterator[SlicePart]:
        for index in range(slices):
            found = model_slice(model, caption_image, depth, settings, list_material, slicing, index, share)
            if not found.hit:
                computed.append(index)
            for direction in seconds:
                seconds[direction] += float(found.meta.get(f"{direction}_seconds", 0.0))
            yield _part(found, *slicing.bounds(index), depth, n_captions)

    merged = merge_slices(parts(), depth, slicing.n_items, n_captions, query_images)
    if computed:
        log.warning("gallery slices: %s of %d for model %s were not in the slice store and were computed in this "
                    "process; run them as parallel jobs with fusebench -m 'gallery.slice=range(0,%d)' "
                    "gallery.slices=%d ... (finished slices are read, not computed again)",
                    ", ".join(map(str, computed)), slices, model.name, slices, slices)
    text = float_rows(model.text, device)
    target_item = torch.as_tensor(np.asarray(caption_image, dtype=np.int64), device=device)
    chunk, item_chunk = min(settings.chunk_size, n_captions), min(settings.item_chunk_size, slicing.n_items)
    ranks = i2t_ranks(merged["i2t_ids"], text, float_rows(np.ascontiguousarray(model.image, dtype=np.float32),
                                                          device),
                      torch.as_tensor(query_images, device=device), target_item, chunk * item_chunk)
    if record is not None:
        record.update(slices=slices, computed_here=computed, t2i_seconds=seconds["t2i"],
                      i2t_seconds=seconds["i2t"])
    return ModelLists.from_arrays(depth, {
        "t2i_ids": merged["t2i_ids"], "t2i_scores": merged["t2i_scores"], "t2i_ranks": merged["t2i_ranks"],
        "i2t_ids": merged["i2t_ids"].astype(np.int32), "i2t_scores": merged["i2t_scores"].astype(np.float32),
        "i2t_ranks": ranks,
    })
