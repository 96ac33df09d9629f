"""CPU selection kernels (numba): running top-k per row and per column of a score block, read in place.

A similarity block ``S`` (queries x items, float32, C order) is offered to two sets of bounded heaps:
one per row (t2i: a caption's best images) and one per column (i2t: an image's best captions). Items
arrive in increasing index order (item blocks left to right, caption blocks top to bottom), so an entry
joins a full heap only when its score is strictly above the heap's worst: an equal score has a larger
index and so ranks after every kept entry. That is exactly the stable rule used everywhere (score
descending, ties by ascending index), with no transposed copy and no sort of the block.

Each heap is a min-heap on "worse": the root is the entry that ranks last. ``finish`` heap-sorts the
kept entries best first. Rows run in parallel; columns run in parallel over column strips.
``offer_rows_count`` also counts, per row, the entries ranked before the row's target (a gallery's exact
ranks, streamed: :mod:`fusebench.search.gallery_search`).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from fusebench.runtime.jit import kernel

# max/min reductions may reorder (scores are finite; -inf sentinels stay valid: no "ninf" flag)
FAST = {"nnan", "nsz", "reassoc"}
COLUMN_STRIP = 64  # columns one thread owns while it walks down the block's rows


@kernel(inline="always")
def _worse(v1, i1, v2, i2) -> bool:
    return v1 < v2 or (v1 == v2 and i1 > i2)


@kernel(inline="always")
def _swap(vals, ids, a, b):
    vals[a], vals[b] = vals[b], vals[a]
    ids[a], ids[b] = ids[b], ids[a]


@kernel(inline="always")
def _sift_down(vals, ids, start, size):
    pos = start
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and _worse(vals[child + 1], ids[child + 1], vals[child], ids[child]):
            child += 1
        if _worse(vals[child], ids[child], vals[pos], ids[pos]):
            _swap(vals, ids, pos, child)
            pos = child
        else:
            break


@kernel(inline="always")
def _offer(vals, ids, count, value, index) -> int:
    """Offer (value, index) to one heap holding ``count`` entries; return the new count."""
    k = vals.shape[0]
    if count < k:
        pos = count
        vals[pos], ids[pos] = value, index
        while pos > 0:  # sift up
            parent = (pos - 1) // 2
            if _worse(vals[pos], ids[pos], vals[parent], ids[parent]):
                _swap(vals, ids, pos, parent)
                pos = parent
            else:
                break
        return count + 1
    if value > vals[0]:
        vals[0], ids[0] = value, index
        _sift_down(vals, ids, 0, k)
    return count


@kernel(inline="always")
def _kth_largest(values, k):
    """The ``k``-th largest (1 <= k <= len(values)) of ``values``, which it reorders: Hoare's quickselect,
    median-of-three pivots.
    After each partition ``values[lo:j+1] >= pivot >= values[i:hi+1]`` and the entries between equal the pivot."""
    lo, hi, target = 0, values.shape[0] - 1, k - 1
    while hi > lo:
        mid = (lo + hi) >> 1
        x, y, z = values[lo], values[mid], values[hi]
        pivot = max(min(x, y), min(max(x, y), z))
        i, j = lo, hi
        while i <= j:
            while values[i] > pivot:
                i += 1
            while values[j] < pivot:
                j -= 1
            if i <= j:
                values[i], values[j] = values[j], values[i]
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            return values[target]
    return values[target]


BISECTION_STEPS = 16  # halvings of the maxima's range: the floor lies within 2^-16 of that range below the k-th
FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


@kernel(inline="always", fastmath=FAST)
def _count_at_least(values, floor) -> int:
    """Entries of ``values`` at or above ``floor`` (vectorised)."""
    count = np.int32(0)
    for j in range(values.shape[0]):
        count += np.int32(values[j] >= floor)
    return count


@kernel(inline="always", fastmath=FAST)
def _floor_below_kth(values, k):
    """A value ``t`` with at least ``k`` entries of ``values`` at or above it, at most the k-th largest and within
    ``2^-BISECTION_STEPS`` of the values' range below it: a bisection of the range whose every step is one
    vectorised count (a quickselect's data-dependent branches cost ~3x more on 2 k entries). ``low`` moves only to a
    middle whose count was checked, so whatever the middle's rounding the result is safe; the middle is taken between
    the ends clamped to float32's finite range, so that infinite values never make it NaN (inf - inf). Near float32's
    largest magnitudes the middle may overflow and the floor stay loose (never wrong)."""
    low = high = values[0]
    for j in range(values.shape[0]):
        low = min(low, values[j])
        high = max(high, values[j])
    for _ in range(BISECTION_STEPS):  # invariant: at least k entries >= low
        middle = (np.float32(0.5) * min(max(low, -FLOAT32_MAX), FLOAT32_MAX)
                  + np.float32(0.5) * min(max(high, -FLOAT32_MAX), FLOAT32_MAX))
        if _count_at_least(values, middle) >= k:
            low = middle
        else:
            high = middle
    return low


@kernel(inline="always", fastmath=FAST)
def _floor_of_kth(values, k, maxima):
    """A value with at least ``k`` entries of ``values`` at or above it, close to the k-th largest: at most the
    k-th largest of the maxima of 2 k interleaved groups (``values[g::2k]``; one vectorised pass), found by
    ``_floor_below_kth``. The k groups with the largest maxima each hold a distinct entry at least that large, so an
    entry below it cannot be in the top k. With groups of g entries about 1 - 2^(-1/g) of the entries pass (136 of
    5,000 for k = 100, against 181 for the sampled guess this replaced, which also needed a counting pass).
    ``maxima``: scratch of 2 k entries (or more). -inf for inputs under 4 k entries."""
    width = values.shape[0]
    groups = 2 * k
    if width < 2 * groups:
        return -np.inf
    maxima = maxima[:groups]
    maxima[:] = values[:groups]
    whole = width // groups
    for g in range(1, whole):
        part = values[g * groups:(g + 1) * groups]
        for j in range(groups):
            maxima[j] = max(maxima[j], part[j])
    tail = values[whole * groups:]
    for j in range(tail.shape[0]):
        maxima[j] = max(maxima[j], tail[j])
    return _floor_below_kth(maxima, k)


@kernel(inline="always")
def _offer_from(row, floor, first_item, vals, ids, count, positions) -> int:
    """Offer the entries of ``row`` at or above ``floor`` to one heap (``vals``, ``ids``, holding ``count``), in
    index order, as items ``first_item + j``; return the new count. Their positions are gathered first in a loop
    without branches (``positions``: scratch of the row's width), so the heap sees only them (~136 of 5,000 for a
    COCO row at k = 100) and the scan pays no mispredicted branch."""
    m = 0
    for j in range(row.shape[0]):
        positions[m] = j
        m += row[j] >= floor
    k = vals.shape[0]
    for t in range(m):
        j = positions[t]
        s = row[j]
        if count < k or s > vals[0]:
            count = _offer(vals, ids, count, s, first_item + j)
    return count


@kernel(inline="always")
def _row_chunks(rows):
    """How many row chunks a parallel kernel splits ``rows`` into (each allocates its scratch once)."""
    return min(rows, 64)


@kernel(parallel=True, cache=True, fastmath=FAST)
def offer_rows(block, first_item, vals, ids, counts):
    """Row heaps: every entry of row r of ``block`` (items ``first_item + j``) is offered to heap r.

    Only entries at or above the row's floor (see ``_floor_of_kth``) can reach the top k: the others are
    skipped (``_offer_from``)."""
    rows, width = block.shape
    k = vals.shape[1]
    chunks = _row_chunks(rows)
    for c in prange(chunks):
        maxima = np.empty(2 * k, dtype=block.dtype)
        positions = np.empty(width, dtype=np.int64)
        for r in range(c * rows // chunks, (c + 1) * rows // chunks):
            row = block[r]
            counts[r] = _offer_from(row, _floor_of_kth(row, k, maxima), first_item, vals[r], ids[r], counts[r],
                                    positions)


@kernel(inline="always", fastmath=FAST)
def _column_floors(block, j0, j1, k, floor):
    """Per column of the strip ``j0:j1``, the k-th largest of the maxima of ``c >= k`` disjoint row chunks
    (about 4 k chunks; single rows below 4 k rows): the k chunks with the largest maxima each hold a distinct
    entry at least that large, so an entry below it cannot be in the column's top k. (The least of k chunk
    maxima, the floor before, let ~900 of 4,096 entries per column through to the heaps.)"""
    rows, width = block.shape[0], j1 - j0
    chunk = max(1, rows // (4 * k))
    n_chunks = rows // chunk
    maxima = np.empty((n_chunks, width), dtype=np.float32)
    for c in range(n_chunks):
        maxima[c, :] = block[c * chunk, j0:j1]
        for r in range(c * chunk + 1, (c + 1) * chunk):
            for j in range(width):
                maxima[c, j] = max(maxima[c, j], block[r, j0 + j])
    for j in range(width):
        floor[j] = _kth_largest(maxima[:, j].copy(), k)


@kernel(parallel=True, cache=True, fastmath=FAST)
def offer_columns(block, first_row, slot, vals, ids, counts, worst):
    """Column heaps: entry (r, j) is offered to heap ``slot[j]`` (skipped when -1) as item ``first_row + r``.

    ``worst[q]`` mirrors the root of a full heap q (-inf until full): an entry must beat it. While some heap
    of a strip is still filling, each column also gets a floor (``_column_floors``); once they are all full,
    the worst entries are the sharper test and the floor's pass is skipped. A strip with no query column is
    not read at all.
    """
    rows, width = block.shape
    n_strips = (width + COLUMN_STRIP - 1) // COLUMN_STRIP
    k = vals.shape[1]
    for strip in prange(n_strips):
        j0 = strip * COLUMN_STRIP
        j1 = min(width, j0 + COLUMN_STRIP)
        asks = False  # a strip whose columns ask no query (captionless images) offers nothing: skip its rows
        for j in range(j0, j1):
            asks |= slot[j] >= 0
        if not asks:
            continue
        floor = np.full(j1 - j0, -np.inf, dtype=np.float32)
        filling = False
        for j in range(j0, j1):
            filling |= slot[j] >= 0 and counts[slot[j]] < k
        if filling and rows >= 2 * k:
            _column_floors(block, j0, j1, k, floor)
        beat = np.empty(j1 - j0, dtype=np.float32)  # worst[slot[j]], +inf for a column without a heap
        for j in range(j0, j1):
            beat[j - j0] = worst[slot[j]] if slot[j] >= 0 else np.inf
        for r in range(rows):
            row = block[r, j0:j1]
            hit = False
            for j in range(j1 - j0):  # vectorised: most rows of a strip offer nothing
                hit |= (row[j] > beat[j]) & (row[j] >= floor[j])
            if not hit:
                continue
            for j in range(j1 - j0):
                s = row[j]
                if s > beat[j] and s >= floor[j]:
                    q = slot[j0 + j]
                    counts[q] = _offer(vals[q], ids[q], counts[q], s, first_row + r)
                    if counts[q] == k:
                        worst[q] = vals[q, 0]
                        beat[j] = worst[q]


@kernel(inline="always", fastmath=FAST)
def _count_above(values, floor, inclusive) -> int:
    """Entries of ``values`` above ``floor`` (or at it, when ``inclusive``). A loop from 0 over a slice: LLVM
    vectorises it, which it does not for a loop over ``range(start, stop)`` of the whole row (5x slower)."""
    count = np.int32(0)
    if inclusive:
        for j in range(values.shape[0]):
            count += np.int32(values[j] >= floor)
    else:
        for j in range(values.shape[0]):
            count += np.int32(values[j] > floor)
    return count


OFFER_CHUNK = 128  # entries a full heap tests at once (vectorised) before it walks them one by one


@kernel(parallel=True, cache=True, fastmath=FAST)
def offer_rows_count(block, first_item, vals, ids, counts, target_score, target_item, ahead):
    """``offer_rows`` and, per row, the entries ranked before the row's target: row r's target is item
    ``target_item[r]`` scored ``target_score[r]``; an entry of item i scoring s is ahead when s > score, or
    s == score and i < item (ties by ascending index). The count is added to ``ahead[r]``.

    The count is one vectorised pass over the row (items past the target, every distractor, take the strict
    test alone); the row then stays in cache for the offers. A full heap tests ``OFFER_CHUNK`` entries at a time
    against its worst and walks only the chunks holding an entry that beats it (late in a stream, few do); a
    heap still filling is offered the entries at or above the row's floor (``_floor_of_kth``, ``_offer_from``)."""
    rows, width = block.shape
    k = vals.shape[1]
    chunks = _row_chunks(rows)
    for c in prange(chunks):
        maxima = np.empty(2 * k, dtype=block.dtype)
        positions = np.empty(width, dtype=np.int64)
        for r in range(c * rows // chunks, (c + 1) * rows // chunks):
            n = counts[r]
            v, h = vals[r], ids[r]
            row = block[r]
            before = min(max(target_item[r] - first_item, 0), width)  # columns left of the target: ties count
            ahead[r] += (_count_above(row[:before], target_score[r], True)
                         + _count_above(row[before:], target_score[r], False))
            if n < k:
                counts[r] = _offer_from(row, _floor_of_kth(row, k, maxima), first_item, v, h, n, positions)
                continue
            for j0 in range(0, width, OFFER_CHUNK):
                j1 = min(j0 + OFFER_CHUNK, width)
                if _count_above(row[j0:j1], v[0], False) == 0:
                    continue
                for j in range(j0, j1):
                    s = row[j]
                    if s > v[0]:
                        n = _offer(v, h, n, s, first_item + j)
            counts[r] = n


@kernel(parallel=True, cache=True)
def finish(vals, ids, counts):
    """Heap-sort each heap in place, best first (score descending, ties by ascending index)."""
    for r in prange(vals.shape[0]):
        v, h = vals[r], ids[r]
        size = counts[r]
        while size > 1:
            size -= 1
            v[0], v[size] = v[size], v[0]
            h[0], h[size] = h[size], h[0]
            _sift_down(v, h, 0, size)


class Heaps:
    """``n`` bounded heaps of ``k`` (score, index) entries; ``lists()`` gives them sorted, best first."""

    def __init__(self, n: int, k: int):
        self.vals = np.full((n, k), -np.inf, dtype=np.float32)
        self.ids = np.full((n, k), -1, dtype=np.int64)
        self.counts = np.zeros(n, dtype=np.int64)
        self.worst = np.full(n, -np.inf, dtype=np.float32)

    def offer_rows(self, block: np.ndarray, first_item: int) -> None:
        offer_rows(block, first_item, self.vals, self.ids, self.counts)

    def offer_columns(self, block: np.ndarray, first_row: int, slot: np.ndarray) -> None:
        if slot.shape != (block.shape[1],) or (slot.size and slot.max() >= self.counts.shape[0]):
            raise ValueError(f"slot must map each of the block's {block.shape[1]} columns to a heap below "
                             f"{self.counts.shape[0]} (or -1)")  # the kernel does not check bounds
        offer_columns(block, first_row, slot, self.vals, self.ids, self.counts, self.worst)

    def lists(self) -> tuple[np.ndarray, np.ndarray]:
        finish(self.vals, self.ids, self.counts)
        return self.vals, self.ids


COMBINE_SUM, COMBINE_MAX, COMBINE_MNZ = 0, 1, 2


@kernel(parallel=True, cache=True)
def fuse_by_id(ids, evidence, column_bits, n_items, final_k, combine, out_ids, out_scores, out_bits):
    """Per row, one entry per distinct id (-1: padding): its evidence combined in entry order (sum in float32,
    max, or the sum times the number of lists holding it), the bits of its lists (``column_bits``: each
    column's model bit) OR-ed; then the first ``final_k``
    entries by combined evidence, descending, ties by first appearance. The list path's exact rule, in one
    pass per row with a scratch slot per item (reset after each row)."""
    rows, width = ids.shape
    n_chunks = min(rows, 64)
    for chunk in prange(n_chunks):
        slot = np.full(n_items, -1, np.int64)
        entry_id = np.empty(width, np.int64)
        total = np.empty(width, np.float32)
        entry_bits = np.empty(width, np.int64)
        for r in range(chunk * rows // n_chunks, (chunk + 1) * rows // n_chunks):
            n = 0
            for j in range(width):
                item = ids[r, j]
                if item < 0:
                    continue
                s = slot[item]
                if s < 0:
                    slot[item] = n
                    entry_id[n] = item
                    total[n] = evidence[r, j]
                    entry_bits[n] = column_bits[j]
                    n += 1
                else:
                    if combine == COMBINE_MAX:
                        total[s] = max(total[s], evidence[r, j])
                    else:
                        total[s] = np.float32(total[s] + evidence[r, j])
                    entry_bits[s] |= column_bits[j]
            for t in range(n):
                slot[entry_id[t]] = -1
                if combine == COMBINE_MNZ:
                    held, b = 0, entry_bits[t]
                    while b:
                        held += b & 1
                        b >>= 1
                    total[t] = np.float32(total[t] * np.float32(held))
            order = np.argsort(-total[:n], kind="mergesort")  # stable: ties keep first appearance
            for t in range(min(n, final_k)):
                e = order[t]
                out_ids[r, t] = entry_id[e]
                out_scores[r, t] = total[e]
                out_bits[r, t] = entry_bits[e]
