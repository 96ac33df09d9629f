"""Exact search over a gallery with distractors: the test split's images, then ``distractors.n`` more, streamed.

``gallery_lists`` gives exactly what ``compute_model_lists(text, np.vstack([image, every distractor row]), ...)``
gives (ids, scores, ranks, both directions), with memory bounded by the tiles whatever the gallery's size. The
gallery is walked tile by tile on the item axis, in the tiles of ``item_chunk_size`` over the whole gallery's index
that call uses (so every block has the same shape, hence the same bits; the tile astride the test/distractor
boundary is assembled once), each distractor tile read once from ``distractors.read`` and multiplied with every
caption chunk in turn:

* t2i: running top-``depth`` heaps for every caption (items still arrive in index order for each caption, so the
  heaps' tie rule holds) and, in the same read of the block (``topk_kernels.offer_rows_count``), the count of
  entries ranked before the caption's target image: its rank is 1 + that count over the whole gallery. The
  target's fp32 score is read from the block of the target's own tile before anything is counted: the first
  tile gives it in passing; captions whose image lies in a later test tile get it from a first pass over those
  tiles (none when the test images fit in one tile).
* i2t: distractors have no captions, so they ask no i2t query and are no i2t item: the image heaps take the
  query columns of the test tiles only, and a rank a list misses is counted as ``compute_model_lists`` does.

On the CPU the numba heaps read each block in place; elsewhere ``torch.topk`` candidates are merged. With
``precision`` bf16 or tf32 the distractor-only tiles take the certified-margin path (:mod:`fusebench.search.margin`),
with the same lists and ranks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fusebench import FusebenchError
from fusebench.search.exact import float_rows, similarity, topk_stable
from fusebench.search.margin import GROUP, MIN_COLUMNS, low_rows, margin_block, resolve_precision
from fusebench.search.model_lists import (
    ModelLists,
    _CpuLists,
    _running_lists,
    _TorchLists,
    i2t_ranks,
    read_target_scores,
    tiles,
)


class GalleryTiles:
    """The gallery's item rows by tile of its index (test images ``0..n_test-1``, then the distractors): a test
    tile is a view of ``image``, a distractor tile one ``distractors.read``; the tile astride the boundary is
    assembled at its first use and kept until ``release``."""

    def __init__(self, image: np.ndarray, distractors, item_chunk: int):
        self.image, self.distractors = image, distractors
        self.n_test = image.shape[0]
        self.n = self.n_test + int(distractors.n)
        self.tiles = tiles(self.n, item_chunk)
        self._astride: np.ndarray | None = None

    def rows(self, t: int) -> np.ndarray:
        c0, c1 = self.tiles[t]
        if c1 <= self.n_test:
            return self.image[c0:c1]
        if c0 >= self.n_test:
            return self.read(c0 - self.n_test, c1 - self.n_test)
        if self._astride is None:
            rows = np.empty((c1 - c0, self.image.shape[1]), dtype=np.float32)
            rows[: self.n_test - c0] = self.image[c0:]
            rows[self.n_test - c0:] = self.read(0, c1 - self.n_test)
            self._astride = rows
        return self._astride

    def release(self, t: int) -> None:
        c0, c1 = self.tiles[t]
        if c0 < self.n_test < c1:
            self._astride = None

    def read(self, start: int, stop: int) -> np.ndarray:
        rows = self.distractors.read(start, stop)
        expected = (stop - start, self.image.shape[1])
        if not (isinstance(rows, np.ndarray) and rows.dtype == np.float32 and rows.shape == expected
                and rows.flags.c_contiguous):
            got = f"{getattr(rows, 'shape', None)} {getattr(rows, 'dtype', type(rows).__name__)}"
            raise ValueError(f"distractor rows {start}:{stop} of {self.distractors.key}: got {got}, "
                             f"expected {expected} float32, C-contiguous")
        return rows

    def slot(self, slot: np.ndarray, t: int) -> np.ndarray | None:
        """The i2t heap of each column of tile ``t`` (-1: none), or None when no column asks a query."""
        c0, c1 = self.tiles[t]
        if c0 >= self.n_test or not (slot[c0:c1] >= 0).any():
            return None
        out = np.full(c1 - c0, -1, dtype=np.int64)
        out[: min(c1, self.n_test) - c0] = slot[c0:c1]
        return out


class _TorchRows(_TorchLists):
    """Every caption's t2i list and rank count on any torch device; distractor tiles also by certified margin."""

    rescored = 0

    def offer_margin(self, text, q_low, items, v_low, precision: str, r0: int, first_item: int,
                     target_score: torch.Tensor, ahead: torch.Tensor) -> None:
        r1 = r0 + text.shape[0]
        values, gained, computed = margin_block(text, q_low, items, v_low, precision, self.vals[r0:r1, -1], self.k,
                                                target_score[r0:r1])
        top_values, ids = topk_stable(values, min(self.k, values.shape[1]))
        self._merge(slice(r0, r1), top_values, ids + first_item)
        ahead[r0:r1] += gained
        self.rescored += computed


def _targets_past_the_first_tile(block: Callable, gallery: GalleryTiles, chunks: list[tuple[int, int]],
                                 target_item: torch.Tensor, target_score: torch.Tensor, walk: range) -> None:
    """The fp32 scores of targets in a test tile other than the first one the pass walks (``walk``: the tiles'
    indices), from the blocks of their own tiles (the same shapes as the pass's, so the same bits), before the pass
    counts any tile; the first tile's come in passing. A slice's pass reads its targets' tiles outside it here."""
    width = gallery.tiles[0][1]
    for r0, r1 in chunks:
        for t in torch.unique(target_item[r0:r1] // width).tolist():
            if t != walk.start:
                items = float_rows(gallery.rows(t), target_item.device)
                read_target_scores(block(r0, r1, items), r0, gallery.tiles[t][0], target_item, target_score)
                if t not in walk:  # a slice's pass: the tile astride the boundary is not kept for it
                    gallery.release(t)


def _row_lists(n: int, k: int, device: torch.device, precision: str):
    """The numba heaps for fp32 on the CPU; torch lists elsewhere and for the certified-margin path."""
    return _CpuLists(n, k) if device.type == "cpu" and precision == "fp32" else _TorchRows(n, k, device)


class _Progress:
    """``update`` in caption rows: each (tile, chunk) block is its rows over the number of tiles."""

    def __init__(self, update: Callable[[int], None] | None, parts: int):
        self.update, self.parts, self.done, self.told = update, parts, 0, 0

    def __call__(self, rows: int) -> None:
        self.done += rows
        now = self.done // self.parts
        if self.update is not None and now > self.told:
            self.update(now - self.told)
        self.told = max(self.told, now)


def gallery_lists(text, image, caption_image: np.ndarray, distractors, depth: int, device: torch.device | str = "cpu",
                  chunk_size: int = 4096, item_chunk_size: int = 16384, progress: Callable[[int], None] | None = None,
                  precision: str | None = None, stats: dict | None = None) -> ModelLists:
    """Top-``depth`` lists and exact ranks of one model over the test images and ``distractors`` (a
    ``DistractorRows``), both directions (see the module docstring). ``precision``: fp32, or bf16 / tf32 for the
    certified-margin path on distractor tiles (None: bf16 on CUDA, fp32 elsewhere). ``stats``, when given, gets
    the precision, the entries rescored in fp32, and the seconds by direction: ``i2t_seconds``, the work only i2t
    needs (the image heaps' columns and the i2t lists and ranks; the similarity blocks are t2i's), and
    ``t2i_seconds``, the rest: what a t2i-only search would take (the device synchronised around i2t's parts)."""
    started = _clock(device)
    found = gallery_pass(text, image, caption_image, distractors, depth, device, chunk_size, item_chunk_size,
                         progress, precision)
    mark = _clock(device)
    ranks = i2t_ranks(found.i2t_ids, found.text, float_rows(found.image, found.text.device),
                      torch.as_tensor(found.query_images, device=found.text.device), found.target_item,
                      found.tile_entries)
    i2t_seconds = found.i2t_seconds + _clock(device) - mark
    if stats is not None:
        stats.update(precision=found.precision, entries=found.entries, rescored=found.rescored,
                     t2i_seconds=_clock(device) - started - i2t_seconds, i2t_seconds=i2t_seconds)
    return ModelLists.from_arrays(depth, {
        "t2i_ids": found.t2i_ids.astype(np.int32), "t2i_scores": found.t2i_scores.astype(np.float32),
        "t2i_ranks": found.ahead + 1,
        "i2t_ids": found.i2t_ids.astype(np.int32), "i2t_scores": found.i2t_scores.astype(np.float32),
        "i2t_ranks": ranks,
    })


@dataclass
class GalleryPass:
    """What one pass over some tiles of the gallery found: each caption's top-k among those tiles' items
    (``t2i_*``, global item ids), the items among them ranked before its target (``ahead``) and its target's fp32
    score; each query image's top-k captions (``i2t_*``: every query image's row, complete for the query images in
    the walked tiles, empty (-inf, -1) for the others); the inputs the i2t ranks are counted on."""

    t2i_ids: np.ndarray
    t2i_scores: np.ndarray
    ahead: np.ndarray
    target_score: np.ndarray
    i2t_ids: np.ndarray
    i2t_scores: np.ndarray
    query_images: np.ndarray
    text: torch.Tensor
    image: np.ndarray
    target_item: torch.Tensor
    tile_entries: int
    precision: str
    entries: int
    rescored: int
    i2t_seconds: float


def pass_tiles(n_items: int, item_chunk_size: int) -> list[tuple[int, int]]:
    """The gallery's tiles of items, as every pass over it walks them (a slice is a run of whole tiles)."""
    return tiles(n_items, min(item_chunk_size, n_items))


def gallery_pass(text, image, caption_image: np.ndarray, distractors, depth: int, device: torch.device | str = "cpu",
                 chunk_size: int = 4096, item_chunk_size: int = 16384, progress: Callable[[int], None] | None = None,
                 precision: str | None = None, walk: range | None = None) -> GalleryPass:
    """The streamed pass of :func:`gallery_lists` over the tiles ``walk`` (None: every tile), in the tiles and
    caption chunks of the whole gallery's pass, so every score has the same bits; the t2i lists are
    ``min(depth, items walked)`` long."""
    i2t_seconds = 0.0
    device = torch.device(device)
    precision = resolve_precision(precision, device)
    image_np = np.ascontiguousarray(image, dtype=np.float32)
    if int(distractors.dim) != image_np.shape[1]:
        raise FusebenchError(f"distractor rows ({distractors.key}) have {distractors.dim} dimensions; this model's "
                             f"test images have {image_np.shape[1]}")
    text = float_rows(text, device)
    n_captions, n_test = text.shape[0], image_np.shape[0]
    cap_img = np.asarray(caption_image, dtype=np.int64)
    if cap_img.shape != (n_captions,) or (cap_img.size and (cap_img.min() < 0 or cap_img.max() >= n_test)):
        raise ValueError(f"caption_image must give each of the {n_captions} captions a test image below {n_test}")
    n_items = n_test + int(distractors.n)
    chunk, item_chunk = min(chunk_size, n_captions), min(item_chunk_size, n_items)
    gallery = GalleryTiles(image_np, distractors, item_chunk)
    walk = range(len(gallery.tiles)) if walk is None else walk
    walked = gallery.tiles[walk.stop - 1][1] - gallery.tiles[walk.start][0]
    chunks = tiles(n_captions, chunk)
    k_t2i, k_i2t = min(depth, walked), min(depth, n_captions)
    query_images_np = np.unique(cap_img)
    slot = np.full(n_test, -1, dtype=np.int64)
    slot[query_images_np] = np.arange(query_images_np.size)
    rows = _row_lists(n_captions, k_t2i, device, precision)
    columns = _running_lists(query_images_np.size, k_i2t, device)
    target_item = torch.as_tensor(cap_img, device=device)
    target_score = torch.full((n_captions,), math.nan, device=device)
    ahead = torch.zeros(n_captions, dtype=torch.int64, device=device)
    buffer = torch.empty(chunk * item_chunk, dtype=torch.float32, device=device)

    def block(r0: int, r1: int, items: torch.Tensor) -> torch.Tensor:
        return similarity(text[r0:r1], items, out=buffer[: (r1 - r0) * items.shape[0]].view(r1 - r0, items.shape[0]))

    _targets_past_the_first_tile(block, gallery, chunks, target_item, target_score, walk)
    q_low = None if precision == "fp32" else low_rows(text, precision)
    report = _Progress(progress, len(walk))
    for t in walk:
        c0, c1 = gallery.tiles[t]
        items = float_rows(gallery.rows(t), device)
        v_low = low_rows(items, precision) if q_low is not None and c0 >= n_test else None
        tile_slot = gallery.slot(slot, t)
        for r0, r1 in chunks:
            if v_low is not None and r1 - r0 >= GROUP and c1 - c0 >= 2 * MIN_COLUMNS:
                rows.offer_margin(text[r0:r1], q_low.rows(r0, r1), items, v_low, precision, r0, c0, target_score,
                                  ahead)
            else:
                scores = block(r0, r1, items)
                if c0 < n_test:
                    read_target_scores(scores, r0, c0, target_item, target_score)
                rows.offer_rows_counting(scores, r0, c0, target_item, target_score, ahead)
                if tile_slot is not None:
                    mark = _clock(device)
                    columns.offer_columns(scores, r0, tile_slot)
                    i2t_seconds += _clock(device) - mark
            report(r1 - r0)
        del items, v_low
        gallery.release(t)
    buffer.set_()  # the tiles' memory back before the i2t ranks
    if bool(torch.isnan(target_score).any()):  # every target is a test image, in a tile already read
        raise RuntimeError("gallery_lists: a target score was never read")
    t2i_scores, t2i_ids = rows.lists()
    mark = _clock(device)
    i2t_scores, i2t_ids = columns.lists()
    i2t_seconds += _clock(device) - mark
    return GalleryPass(t2i_ids=t2i_ids, t2i_scores=t2i_scores, ahead=ahead.cpu().numpy(),
                       target_score=target_score.cpu().numpy(), i2t_ids=i2t_ids, i2t_scores=i2t_scores,
                       query_images=query_images_np, text=text, image=image_np, target_item=target_item,
                       tile_entries=chunk * item_chunk, precision=precision, entries=n_captions * walked,
                       rescored=int(getattr(rows, "rescored", 0)), i2t_seconds=i2t_seconds)


def _clock(device) -> float:
    """``time.perf_counter()`` once ``device``'s queued work is done (CUDA runs asynchronously)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
