"""Whole-row kernels (numba) for fusion over whole rankings (``fusion.top_k: null``, :mod:`fusebench.fusion.whole_rankings`)
and the score store's derived matrices: row moments, stable row orders and ranks, scatter and gather by a
stored order, affine evidence, and the matrix-free document pass that counts the entries ahead of a winner
while it keeps the model's top list (the heaps of :mod:`fusebench.search.topk_kernels`).

Same conventions as the selection kernels: scores descending, ties by ascending index; float32 in and out,
float64 where a sum must not depend on the order of its terms.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import prange

from fusebench.runtime.jit import kernel
from fusebench.search.topk_kernels import FAST, _floor_of_kth, _offer


@kernel(parallel=True, cache=True)
def row_mean_std(block, ddof):
    """Per row: mean and standard deviation (``ddof`` 0 or 1; 0 when undefined) of every entry, accumulated in
    float64 and rounded once to float32, as ``fusion.normalisers.row_moments`` does for lists."""
    rows, width = block.shape
    mean = np.empty(rows, dtype=np.float32)
    std = np.empty(rows, dtype=np.float32)
    for r in prange(rows):
        total = 0.0
        for j in range(width):
            total += np.float64(block[r, j])
        m = total / max(width, 1)
        sq = 0.0
        for j in range(width):
            d = np.float64(block[r, j]) - m
            sq += d * d
        denom = width - ddof
        mean[r] = np.float32(m)
        std[r] = np.float32(np.sqrt(sq / max(denom, 1))) if denom > 0 else np.float32(0.0)
    return mean, std


@kernel(parallel=True, cache=True)
def count_ahead(values, tiebreak, use_tiebreak, best, best_tb, index):
    """Per row r: entries that come before (best[r], best_tb[r], index[r]) under the order (value desc,
    tiebreak desc when ``use_tiebreak``, column index asc). One pass over each row."""
    rows, width = values.shape
    out = np.empty(rows, dtype=np.int64)
    for r in prange(rows):
        b, t, i = best[r], best_tb[r], index[r]
        count = 0
        for j in range(width):
            v = values[r, j]
            if v > b:
                count += 1
            elif v == b:
                if use_tiebreak:
                    tb = tiebreak[r, j]
                    count += (tb > t) or (tb == t and j < i)
                else:
                    count += j < i
        out[r] = count
    return out


@kernel(cache=True, nogil=True)
def _descending_keys(block, r0, r1, keys):
    """keys[i] for rows r0..r1 of ``block``: int64 keys whose ascending order is (score desc, index asc),
    order-preserving bits of -score above the column index (as ``topk.descending_keys``). Serial and
    without the GIL: threads call it on their own rows."""
    width = block.shape[1]
    negated = np.empty(width, dtype=np.float32)
    bits = negated.view(np.int32)
    for i in range(r1 - r0):
        for j in range(width):
            negated[j] = -block[r0 + i, j] + np.float32(0.0)
        for j in range(width):
            b = bits[j]
            ordered = b ^ 0x7FFFFFFF if b < 0 else b
            keys[i, j] = (np.int64(ordered) << 32) | j


@kernel(cache=True, nogil=True)
def _column_indices(keys, out, r0):
    """out[r0 + i, p] = the column index in sorted key keys[i, p] (its low 32 bits), in ``out``'s dtype."""
    rows, width = keys.shape
    for i in range(rows):
        for p in range(width):
            out[r0 + i, p] = keys[i, p] & 0xFFFFFFFF


@kernel(parallel=True, cache=True)
def scatter_by_order(order, by_rank, out, accumulate):
    """out[r, order[r, p]] (+)= by_rank[p]: each column gets the value of its position in row r's order
    (column indices best first; any integer dtype, so a stored uint16 order is read as it is)."""
    rows, width = order.shape
    for r in prange(rows):
        for p in range(width):
            j = order[r, p]
            if accumulate:
                out[r, j] += by_rank[p]
            else:
                out[r, j] = by_rank[p]


@kernel(parallel=True, cache=True)
def gather_rows(values, order):
    """values[r, order[r, p]] for every row r and position p (``order`` of any integer dtype)."""
    rows, width = order.shape
    out = np.empty(order.shape, dtype=values.dtype)
    for r in prange(rows):
        for p in range(width):
            out[r, p] = values[r, order[r, p]]
    return out


@kernel(parallel=True, cache=True)
def gather_transposed(rows, columns, out, start):
    """out[q, start + i] = rows[i, columns[q]]: the transpose of some columns of a row slab, copied in 64 x 64
    tiles so that both sides stay in cache (a plain strided transpose costs ~9 ns an entry here)."""
    n, m = rows.shape[0], columns.shape[0]
    tile = 64
    for t in prange((m + tile - 1) // tile):
        q0 = t * tile
        q1 = min(m, q0 + tile)
        for i0 in range(0, n, tile):
            i1 = min(n, i0 + tile)
            for q in range(q0, q1):
                c = columns[q]
                for i in range(i0, i1):
                    out[q, start + i] = rows[i, c]


GROUP_ENTRIES = 1 << 17  # keys sorted at a time per thread: 1 MB of int64, inside one core's cache


def row_order(block: np.ndarray, dtype: np.dtype | type = np.int64) -> np.ndarray:
    """Each row's order under (score desc, index asc): column indices best first, as ``dtype`` (uint16 is
    enough up to 65,536 columns). Rows are ordered a small group at a time, on one thread per core: numba
    builds the group's int64 keys, numpy's vectorised sort orders them (it releases the GIL), numba writes
    their low bits, the indices, into the result. The keys stay in the core's cache, so the block's memory
    traffic is its scores read once and the orders written once."""
    rows, width = block.shape
    out = np.empty(block.shape, dtype=dtype)
    if width and width - 1 > np.iinfo(out.dtype).max:
        raise ValueError(f"{width} columns do not fit a {out.dtype} order")
    group = max(1, GROUP_ENTRIES // max(1, width))

    def order_rows(r0: int, r1: int) -> None:
        keys = np.empty((min(group, r1 - r0), width), dtype=np.int64)
        for g0 in range(r0, r1, group):
            g1 = min(r1, g0 + group)
            _descending_keys(block, g0, g1, keys[: g1 - g0])
            keys[: g1 - g0].sort(axis=1)
            _column_indices(keys[: g1 - g0], out, g0)

    _on_threads(order_rows, rows, block.size)
    return out


def _on_threads(work, rows: int, entries: int, min_entries: int = 1 << 20) -> None:
    """``work(r0, r1)`` over slices of the rows, one per core when the block is large enough to pay."""
    workers = min(os.cpu_count() or 1, rows, max(1, entries // min_entries))
    if workers <= 1:
        work(0, rows)
        return
    bounds = np.linspace(0, rows, workers + 1).astype(int)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda r: work(*r), zip(bounds[:-1], bounds[1:])))


def stable_ranks(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the 1-based rank of every entry under (score desc, index asc) and the order itself."""
    order = row_order(block)
    ranks = np.empty(block.shape, dtype=np.int64)
    scatter_by_order(order, np.arange(1, block.shape[1] + 1, dtype=np.int64), ranks, False)
    return ranks, order


@kernel(parallel=True, cache=True)
def affine_evidence(block, low, scale, flat, flat_value, weight, out, accumulate):
    """out (+)= weight * ((s - low[r]) / scale[r]), or weight * flat_value on flat rows: the float32 operations
    of ``fusion.affine_evidence`` followed by the weight, in one pass (``accumulate``: add to ``out``)."""
    rows, width = block.shape
    w = np.float32(weight)
    for r in prange(rows):
        lo, sc = low[r], scale[r]
        fixed = np.float32(flat_value) * w
        for j in range(width):
            e = fixed if flat[r] else ((block[r, j] - lo) / sc) * w
            if accumulate:
                out[r, j] += e
            else:
                out[r, j] = e


@kernel(cache=True, fastmath=FAST)
def _row_floor(row, k):
    """``_floor_of_kth`` compiled on its own with fast reductions (its caller must not take fastmath)."""
    return _floor_of_kth(row, k, np.empty(2 * k, dtype=row.dtype))


@kernel(parallel=True, cache=True)
def affine_count_top(block, low, scale, flat, flat_value, weight, best, best_tb, index, vals, ids, counts):
    """For document fusion over whole rankings, in one pass over each row of a model's scores: the entries
    whose evidence (``affine_evidence``'s float32 operations, never stored) comes before (best[r],
    best_tb[r], index[r]) under (evidence desc, score desc, column asc), as ``count_ahead`` counts them with
    the scores as tiebreak; and every score offered to row r's heap (the model's own top list, as
    ``offer_rows`` keeps it). Returns the counts. No fastmath here: the evidence must round exactly as
    ``affine_evidence`` and the torch expression of it do."""
    rows, width = block.shape
    k = vals.shape[1]
    w = np.float32(weight)
    out = np.empty(rows, dtype=np.int64)
    for r in prange(rows):
        lo, sc, is_flat = low[r], scale[r], flat[r]
        fixed = np.float32(flat_value) * w
        b, t, i = best[r], best_tb[r], index[r]
        n = counts[r]
        v, h = vals[r], ids[r]
        row = block[r]
        floor = _row_floor(row, k)
        ahead = 0
        for j in range(width):
            s = row[j]
            e = fixed if is_flat else ((s - lo) / sc) * w
            if e > b:
                ahead += 1
            elif e == b:
                ahead += (s > t) or (s == t and j < i)
            if s >= floor and (n < k or s > v[0]):
                n = _offer(v, h, n, s, j)
        out[r] = ahead
        counts[r] = n
    return out
