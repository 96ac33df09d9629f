"""One gallery searched in slices, merged exactly: the slices' bounds, what a slice's pass keeps, and the merge.

A slice is a run of whole tiles of the gallery's item axis (``gallery_search.pass_tiles``), so that every score
a slice computes comes from a block of the shape the one-process pass multiplies, with the same bits. Each slice
keeps, per caption, its top-k among the slice's items (global ids), the slice's items ranked before the caption's
target (a higher score, or the same at a lower index: the tie rule of :mod:`fusebench.search.exact`) and the
target's fp32 score (read from the target's own tile, whichever slice holds it); and the i2t lists of the query
images in its tiles (whole: distractors are no i2t item, so an image's column lies in one tile).

The merge (:func:`merge_slices`) is then exact: a caption's top-k is the stable merge of the slices' lists in
slice order (each slice's ids lie above the previous slice's, so position order is id order at equal scores),
its rank is 1 + the sum of the slices' counts, and each query image's i2t list is its own slice's; the i2t ranks
are counted as the one-process pass counts them (``model_lists.i2t_ranks``). Memory: the running lists and one
slice's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fusebench import FusebenchError
from fusebench.search.exact import merge_topk

PART_FIELDS = ("t2i_ids", "t2i_scores", "ahead", "target_score", "i2t_images", "i2t_ids", "i2t_scores")


def slice_tiles(n_tiles: int, slices: int) -> list[range]:
    """The tiles of each of ``slices`` slices: as even as whole tiles allow, in order, none empty."""
    if not 1 <= slices <= n_tiles:
        raise ValueError(f"{slices} slices of {n_tiles} tiles")
    return [range(s * n_tiles // slices, (s + 1) * n_tiles // slices) for s in range(slices)]


def check_slices(slices: int, n_items: int, n_tiles: int, item_chunk_size: int) -> None:
    """``gallery.slices`` must leave every slice at least one whole tile."""
    if slices > n_tiles:
        raise FusebenchError(f"gallery.slices={slices} but the gallery's {n_items:,} items in tiles of "
                             f"eval.item_chunk_size={item_chunk_size:,} make {n_tiles} tile(s), and a slice is whole "
                             f"tiles (so every score has the one-process search's bits): valid gallery.slices is "
                             f"1..{n_tiles} (or a smaller eval.item_chunk_size, the same for every job).")


@dataclass
class SlicePart:
    """One slice's pass: ``t2i_ids`` (int32, global ids in ``start..stop-1``), ``t2i_scores`` (float32),
    ``ahead`` (int64, per caption), ``target_score`` (float32, per caption), ``i2t_images`` (int64, the query
    images in the slice, ascending), ``i2t_ids`` (int32) and ``i2t_scores`` (float32), one row per such image."""

    start: int
    stop: int
    t2i_ids: np.ndarray
    t2i_scores: np.ndarray
    ahead: np.ndarray
    target_score: np.ndarray
    i2t_images: np.ndarray
    i2t_ids: np.ndarray
    i2t_scores: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in PART_FIELDS}

    def cut(self, depth: int, n_captions: int) -> SlicePart:
        """The part with lists at most ``depth`` long (a deeper stored slice, asked less deep)."""
        k_t2i, k_i2t = min(depth, self.stop - self.start), min(depth, n_captions)
        return SlicePart(self.start, self.stop, self.t2i_ids[:, :k_t2i], self.t2i_scores[:, :k_t2i], self.ahead,
                         self.target_score, self.i2t_images, self.i2t_ids[:, :k_i2t], self.i2t_scores[:, :k_i2t])


def part_from_pass(found, start: int, stop: int) -> SlicePart:
    """A :class:`SlicePart` from a ``gallery_search.GalleryPass`` over the tiles of items ``start..stop-1``."""
    query = found.query_images
    mine = np.flatnonzero((query >= start) & (query < stop))
    return SlicePart(start, stop, found.t2i_ids.astype(np.int32), found.t2i_scores.astype(np.float32),
                     found.ahead.astype(np.int64), found.target_score.astype(np.float32), query[mine].astype(np.int64),
                     found.i2t_ids[mine].astype(np.int32), found.i2t_scores[mine].astype(np.float32))


def part_problem(arrays: dict[str, np.ndarray], start: int, stop: int, n_captions: int, depth: int,
                 query_images: np.ndarray) -> str | None:
    """What is wrong with a stored slice's arrays for this slice of this corpus (None: nothing)."""
    k_t2i, k_i2t = min(depth, stop - start), min(depth, n_captions)
    mine = query_images[(query_images >= start) & (query_images < stop)]
    ids, images = arrays["t2i_ids"], arrays["i2t_images"]
    expected = {"t2i_ids": (n_captions, k_t2i), "t2i_scores": (n_captions, k_t2i), "ahead": (n_captions,),
                "target_score": (n_captions,), "i2t_images": (mine.size,), "i2t_ids": (mine.size, k_i2t),
                "i2t_scores": (mine.size, k_i2t)}
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            return f"{name} has shape {arrays[name].shape}, expected {shape}"
    if ids.size and (ids.min() < start or ids.max() >= stop):
        return f"t2i ids outside the slice's items {start}..{stop - 1}"
    if not np.array_equal(images, mine):
        return "its i2t query images are not this corpus's in the slice"
    return None


def merge_slices(parts: Iterable[SlicePart], depth: int, n_items: int, n_captions: int, query_images: np.ndarray
                 ) -> dict[str, np.ndarray]:
    """The one-process pass's t2i lists and ranks, and i2t lists, from every slice's part (in slice order, read
    one at a time): ``t2i_ids`` (int32), ``t2i_scores``, ``t2i_ranks`` (int64), ``i2t_ids`` (int64; the i2t ranks
    are counted from them), ``i2t_scores``. Parts that are not the slices of ``0..n_items-1`` in order, or whose
    target scores differ (slices computed where fp32 products differ), are refused."""
    k_t2i, k_i2t = min(depth, n_items), min(depth, n_captions)
    values = ids = ahead = target = None
    i2t_ids = np.full((query_images.size, k_i2t), -1, dtype=np.int64)
    i2t_scores = np.full((query_images.size, k_i2t), -np.inf, dtype=np.float32)
    covered = 0
    for part in parts:
        if part.start != covered:
            raise ValueError(f"slice of items {part.start}..{part.stop - 1} after items up to {covered - 1}")
        covered = part.stop
        part_values = torch.from_numpy(np.ascontiguousarray(part.t2i_scores))
        part_ids = torch.from_numpy(part.t2i_ids.astype(np.int64))
        if values is None:
            values, ids = part_values[:, :k_t2i], part_ids[:, :k_t2i]
            ahead, target = part.ahead.astype(np.int64), part.target_score
        else:
            values, ids = merge_topk([(values, ids), (part_values, part_ids)], k_t2i)
            ahead = ahead + part.ahead
            if not np.array_equal(target.view(np.int32), part.target_score.view(np.int32)):
                raise FusebenchError(f"the slice of items {part.start:,}..{part.stop - 1:,} scores the captions' "
                                     "targets with other bits than the first slice: its job ran where fp32 products "
                                     "differ (another device or library); remove its entry (kind slices in fusebench-cache "
                                     "list; fusebench-cache remove KEY) and run it where the others ran.")
        rows = np.searchsorted(query_images, part.i2t_images)
        i2t_ids[rows], i2t_scores[rows] = part.i2t_ids, part.i2t_scores
    if covered != n_items:
        raise ValueError(f"slices cover items 0..{covered - 1} of {n_items}")
    return {"t2i_ids": ids.numpy().astype(np.int32), "t2i_scores": values.numpy().astype(np.float32),
            "t2i_ranks": ahead + 1, "i2t_ids": i2t_ids, "i2t_scores": i2t_scores}
