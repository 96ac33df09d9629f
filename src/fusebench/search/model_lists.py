"""One model's ranked lists, both directions, from its embeddings: the unit the list store keeps.

The similarity matrix (captions x images, fp32) is computed in tiles of ``chunk_size`` caption rows by
``item_chunk_size`` image columns, so memory is bounded by the tile, never by the corpus. Each tile
feeds two sets of running top-``depth`` lists: per caption (t2i, merged across image tiles) and per image
that has captions (i2t, merged across caption tiles; a tile or column strip of captionless images is skipped).
On the CPU the numba heaps of :mod:`fusebench.search.topk_kernels` read the tile in place; on other devices
``torch.topk`` candidates are merged.
Ranks are exact. A caption's t2i rank is counted on each tile that feeds its heap, from the very scores its list
holds (the entries ranked before its target, whose score is read from the first item tile): in the same read of
the tile on the CPU (``topk_kernels.offer_rows_count``), by :func:`count_ahead` on the tile elsewhere. A caption
whose target lies past the first item tile, and every i2t query, gets its list position when a correct item is
listed, else is counted against a recomputed full row (t2i) or column (i2t), in pieces of at most one tile.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
import torch

from fusebench.search.exact import column_target_ranks, float_rows, merge_topk, similarity, target_ranks, topk_stable
from fusebench.search.ranked import RankedLists, i2t_list_ranks, t2i_list_ranks
from fusebench.search.topk_kernels import Heaps, offer_rows_count


@dataclass
class ModelLists:
    """One model's :class:`~fusebench.search.ranked.RankedLists` in each direction (``self["t2i"]``): ``ids``
    (queries, L) int32 item indices best first, ``scores`` (queries, L) float32, ``ranks`` (queries,) int64 exact
    1-based rank of the first correct item in the model's full ranking (an index's: in its list, 0 past it).
    t2i queries are captions in corpus order; i2t queries the images that have captions, in index order."""

    depth: int  # the depth asked for; each direction holds min(depth, items) entries per query
    lists: dict[str, RankedLists]  # direction -> its lists

    @classmethod
    def from_arrays(cls, depth: int, arrays: dict[str, np.ndarray]) -> ModelLists:
        """From the list store's arrays (``t2i_ids``, ``t2i_scores``, ``t2i_ranks``, ``i2t_ids``, ...), without a
        copy."""
        return cls(depth, {d: RankedLists(ids=torch.from_numpy(arrays[f"{d}_ids"]),
                                          scores=torch.from_numpy(arrays[f"{d}_scores"]),
                                          ranks=arrays[f"{d}_ranks"]) for d in ("t2i", "i2t")})

    def arrays(self) -> dict[str, np.ndarray]:
        """The list store's arrays (views, no copy)."""
        return {f"{d}_{field}": (np.asarray(lists.ranks) if field == "ranks" else getattr(lists, field).numpy())
                for d, lists in self.lists.items() for field in ("ids", "scores", "ranks")}

    def __getitem__(self, direction: str) -> RankedLists:
        return self.lists[direction]

    def covers(self, depth: int, n_images: int, n_captions: int) -> bool:
        """True when these lists are at least ``depth`` long (or already hold every item)."""
        return (self["t2i"].ids.shape[1] >= min(depth, n_images)
                and self["i2t"].ids.shape[1] >= min(depth, n_captions))


def read_target_scores(block: torch.Tensor, r0: int, c0: int, target_item: torch.Tensor,
                       target_score: torch.Tensor) -> None:
    """Fill ``target_score`` (NaN: not read yet) for the block's rows whose target item is one of its columns."""
    r1, c1 = r0 + block.shape[0], c0 + block.shape[1]
    items = target_item[r0:r1]
    rows = torch.nonzero((items >= c0) & (items < c1) & torch.isnan(target_score[r0:r1])).flatten()
    if rows.numel():
        target_score[r0 + rows] = block[rows, items[rows] - c0]


def count_ahead(block: torch.Tensor, first_item: int, target_item: torch.Tensor, target_score: torch.Tensor
                ) -> torch.Tensor:
    """Per row, the entries ranked before the row's target: a higher score, or the same at a lower index."""
    items = first_item + torch.arange(block.shape[1], device=block.device)
    score = target_score[:, None]
    return ((block > score) | ((block == score) & (items[None, :] < target_item[:, None]))).sum(dim=1)


class _TorchLists:
    """Running top-k lists on any torch device: ``topk_stable`` candidates per tile, merged in index order."""

    def __init__(self, n: int, k: int, device: torch.device):
        self.k = k
        self.vals = torch.full((n, k), float("-inf"), device=device)
        self.ids = torch.full((n, k), -1, dtype=torch.int64, device=device)

    def _merge(self, rows, values: torch.Tensor, ids: torch.Tensor) -> None:
        merged = merge_topk([(self.vals[rows], self.ids[rows]), (values, ids)], self.k)
        self.vals[rows], self.ids[rows] = merged

    def offer_rows(self, block: torch.Tensor, first_item: int) -> None:
        values, ids = topk_stable(block, min(self.k, block.shape[1]))
        self._merge(slice(None), values, ids + first_item)

    def offer_columns(self, block: torch.Tensor, first_row: int, slot: np.ndarray) -> None:
        columns = np.flatnonzero(slot >= 0)
        if columns.size:
            cols = torch.as_tensor(columns, device=block.device)
            values, ids = topk_stable(block[:, cols].T, min(self.k, block.shape[0]))
            self._merge(torch.as_tensor(slot[columns], device=block.device), values, ids + first_row)

    def offer_rows_counting(self, block: torch.Tensor, r0: int, first_item: int, target_item: torch.Tensor,
                            target_score: torch.Tensor, ahead: torch.Tensor) -> None:
        """The block's rows are heaps (and entries of the target arrays) ``r0..r0 + len(block)``: offered, and
        the entries ranked before each row's target added to ``ahead``."""
        r1 = r0 + block.shape[0]
        values, ids = topk_stable(block, min(self.k, block.shape[1]))
        self._merge(slice(r0, r1), values, ids + first_item)
        ahead[r0:r1] += count_ahead(block, first_item, target_item[r0:r1], target_score[r0:r1])

    def lists(self) -> tuple[np.ndarray, np.ndarray]:
        return self.vals.cpu().numpy(), self.ids.cpu().numpy()


class _CpuLists(Heaps):
    def offer_rows(self, block: torch.Tensor, first_item: int) -> None:
        super().offer_rows(block.numpy(), first_item)

    def offer_rows_counting(self, block: torch.Tensor, r0: int, first_item: int, target_item: torch.Tensor,
                            target_score: torch.Tensor, ahead: torch.Tensor) -> None:
        """As ``_TorchLists.offer_rows_counting``, in one read of the block (the fused numba kernel)."""
        r1 = r0 + block.shape[0]
        offer_rows_count(block.numpy(), first_item, self.vals[r0:r1], self.ids[r0:r1], self.counts[r0:r1],
                         target_score[r0:r1].numpy(), target_item[r0:r1].numpy(), ahead[r0:r1].numpy())

    def offer_columns(self, block: torch.Tensor, first_row: int, slot: np.ndarray) -> None:
        super().offer_columns(block.numpy(), first_row, slot)


def _running_lists(n: int, k: int, device: torch.device):
    return _CpuLists(n, k) if device.type == "cpu" else _TorchLists(n, k, device)


def tiles(n: int, size: int):
    """(start, stop) pairs covering range(n) in steps of ``size``."""
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def full_rows(text: torch.Tensor, image: torch.Tensor, item_chunk: int, out: torch.Tensor) -> torch.Tensor:
    """``text @ image.T`` assembled from image tiles into ``out`` (rows x items): the same tile shapes as
    the pass that built the lists."""
    if image.shape[0] <= item_chunk:  # one tile: write it in place
        return similarity(text, image, out=out)
    for c0, c1 in tiles(image.shape[0], item_chunk):
        out[:, c0:c1] = similarity(text, image[c0:c1])
    return out


def t2i_ranks(ids: np.ndarray, text: torch.Tensor, image: torch.Tensor, cap_img: torch.Tensor,
              tile_entries: int, item_chunk: int, counted: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Exact t2i ranks: ``counted`` (rows, entries ranked before each row's target) where the pass counted them,
    else the list position when the target is listed, else counted on the recomputed row."""
    ranks = t2i_list_ranks(torch.from_numpy(ids), cap_img.cpu())
    if counted is not None:
        rows, ahead = counted
        ranks[rows] = ahead + 1
    missing = np.flatnonzero(ranks == 0)
    step = max(1, tile_entries // image.shape[0])
    for start in range(0, missing.size, step):
        rows = torch.as_tensor(missing[start:start + step], device=text.device)
        scores = full_rows(text[rows], image, item_chunk,
                           torch.empty(len(rows), image.shape[0], device=text.device))
        ranks[missing[start:start + step]] = target_ranks(scores, cap_img[rows]).cpu().numpy()
    return ranks


def i2t_ranks(ids: np.ndarray, text: torch.Tensor, image: torch.Tensor, query_images: torch.Tensor,
              cap_img: torch.Tensor, tile_entries: int) -> np.ndarray:
    """Exact i2t ranks: list position when a correct caption is listed, else counted on the recomputed column."""
    ranks = i2t_list_ranks(torch.from_numpy(ids), query_images.cpu(), cap_img.cpu())
    missing = np.flatnonzero(ranks == 0)
    step = max(1, tile_entries // text.shape[0])
    for start in range(0, missing.size, step):
        rows = torch.as_tensor(missing[start:start + step], device=text.device)
        columns = similarity(text, image[query_images[rows]])
        ranks[missing[start:start + step]] = column_target_ranks(columns, cap_img, query_images[rows]).cpu().numpy()
    return ranks


def _counted(counted: torch.Tensor, ahead: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    rows = torch.nonzero(counted).flatten()
    return rows.cpu().numpy(), ahead[rows].cpu().numpy()


def compute_model_lists(text, image, caption_image: np.ndarray, depth: int, device: torch.device | str = "cpu",
                        chunk_size: int = 4096, item_chunk_size: int = 16384,
                        progress: Callable[[int], None] | None = None, ranks: bool = True) -> ModelLists:
    """Top-``depth`` lists and exact ranks of one model, both directions (see the module docstring); ``ranks``
    False: the lists alone (ranks None; ``fusebench.library.search`` without positives)."""
    passing = lists_pass(text, image, caption_image, depth, device, chunk_size, item_chunk_size, progress, ranks)
    while True:
        try:
            next(passing)
        except StopIteration as done:
            return done.value


def whole_rows_in_pass(n_images: int, item_chunk_size: int) -> bool:
    """Whether :func:`lists_pass` yields whole score rows: one item tile holds every image."""
    return 0 < n_images <= item_chunk_size


def row_tile(n_captions: int, chunk_size: int) -> int:
    """The caption rows of each similarity tile of :func:`lists_pass` (and of a whole score matrix computed for
    the score store: the same matmul shapes, so the same bits)."""
    return min(chunk_size, n_captions)


def lists_pass(text, image, caption_image: np.ndarray, depth: int, device: torch.device | str = "cpu",
               chunk_size: int = 4096, item_chunk_size: int = 16384, progress: Callable[[int], None] | None = None,
               ranks: bool = True) -> Generator[torch.Tensor, None, ModelLists]:
    """:func:`compute_model_lists` as a generator that returns its lists and, where one item tile holds every
    image (:func:`whole_rows_in_pass`), yields each caption tile's whole score rows in order once the lists have
    read them (the pass's own buffer: valid until the generator resumes), so that one pass can also write a
    model's whole score matrix (``backends.retrieval``)."""
    device = torch.device(device)
    text, image = float_rows(text, device), float_rows(image, device)
    n_captions, n_images = text.shape[0], image.shape[0]
    k_t2i, k_i2t = min(depth, n_images), min(depth, n_captions)
    cap_img = torch.as_tensor(np.asarray(caption_image), dtype=torch.int64, device=device)
    query_images_np = np.unique(np.asarray(caption_image))
    slot = np.full(n_images, -1, dtype=np.int64)
    slot[query_images_np] = np.arange(query_images_np.size)
    chunk, item_chunk = row_tile(n_captions, chunk_size), min(item_chunk_size, n_images)
    buffer = torch.empty(chunk * item_chunk, dtype=torch.float32, device=device)
    columns = _running_lists(query_images_np.size, k_i2t, device)
    t2i_ids = np.empty((n_captions, k_t2i), dtype=np.int32)
    t2i_scores = np.empty((n_captions, k_t2i), dtype=np.float32)
    item_tiles = tiles(n_images, item_chunk)
    asks = [bool((slot[c0:c1] >= 0).any()) for c0, c1 in item_tiles]  # a tile of captionless images asks no i2t query
    # t2i ranks counted in the pass for the captions whose target is in the first item tile (where its score is read)
    counted = cap_img < (item_tiles[0][1] if item_tiles else 0)
    target_score = torch.full((n_captions,), float("nan"), device=device)
    ahead = torch.zeros(n_captions, dtype=torch.int64, device=device)
    for r0, r1 in tiles(n_captions, chunk):
        rows = _running_lists(r1 - r0, k_t2i, device)
        for (c0, c1), tile_asks in zip(item_tiles, asks):
            block = similarity(text[r0:r1], image[c0:c1], out=buffer[: (r1 - r0) * (c1 - c0)].view(r1 - r0, c1 - c0))
            if not ranks:
                rows.offer_rows(block, c0)
            else:
                if c0 == 0:
                    read_target_scores(block, r0, c0, cap_img, target_score)
                    # a row whose target's score comes later compares with +inf; its count is discarded (_counted)
                    row_score = torch.where(counted[r0:r1], target_score[r0:r1], float("inf"))
                rows.offer_rows_counting(block, 0, c0, cap_img[r0:r1], row_score, ahead[r0:r1])
            if tile_asks:
                columns.offer_columns(block, r0, slot[c0:c1])
        t2i_scores[r0:r1], t2i_ids[r0:r1] = rows.lists()
        if progress is not None:
            progress(r1 - r0)
        if len(item_tiles) == 1:
            yield block
    del buffer
    i2t_scores, i2t_ids = columns.lists()
    query_images = torch.as_tensor(query_images_np, device=device)
    tile_entries = chunk * item_chunk
    return ModelLists.from_arrays(depth, {
        "t2i_ids": t2i_ids, "t2i_scores": t2i_scores,
        "t2i_ranks": (t2i_ranks(t2i_ids, text, image, cap_img, tile_entries, item_chunk, _counted(counted, ahead))
                      if ranks else None),
        "i2t_ids": i2t_ids.astype(np.int32), "i2t_scores": i2t_scores.astype(np.float32),
        "i2t_ranks": i2t_ranks(i2t_ids, text, image, query_images, cap_img, tile_entries) if ranks else None,
    })
