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
from fusebench.search.topk_kernels import FAST, _floor_of_kth, _offer_from, _row_chunks


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


DIGIT_BITS = 11  # the radix sort's digit: three passes over 32-bit keys, 2,048 buckets (8 KB of counts, in L1)


@kernel(cache=True, nogil=True)
def _radix_order(block, r0, r1, out):
    """out[r] for rows r0..r1: column indices best first under (score desc, index asc). Each score becomes a 32-bit
    key whose ascending order is the score's descending one (its negation's bits, order-preserving, -0.0 folded into
    0.0, as ``exact.descending_keys``); a least-significant-digit radix sort of the keys, three passes of 11 bits,
    each stable, so equal scores keep their ascending column order. A pass in which every key has the same digit is
    skipped. Serial and without the GIL: threads call it on their own rows."""
    width = block.shape[1]
    negated = np.empty(width, dtype=np.float32)
    bits = negated.view(np.int32)
    keys, keys2 = np.empty(width, dtype=np.uint32), np.empty(width, dtype=np.uint32)
    index, index2 = np.empty(width, dtype=np.int32), np.empty(width, dtype=np.int32)
    buckets = 1 << DIGIT_BITS
    counts = np.zeros((3, buckets), dtype=np.int64)
    for r in range(r0, r1):
        for j in range(width):
            negated[j] = -block[r, j] + np.float32(0.0)
        counts[:] = 0
        for j in range(width):
            b = bits[j]
            key = np.uint32(np.int64(b ^ 0x7FFFFFFF if b < 0 else b) + 2147483648)  # signed order to unsigned
            keys[j], index[j] = key, j
            counts[0, key & (buckets - 1)] += 1
            counts[1, (key >> DIGIT_BITS) & (buckets - 1)] += 1
            counts[2, key >> (2 * DIGIT_BITS)] += 1
        src_k, src_i, dst_k, dst_i = keys, index, keys2, index2
        for p in range(3):
            shift = p * DIGIT_BITS
            c = counts[p]
            if width == 0 or c[(src_k[0] >> shift) & (buckets - 1)] == width:
                continue  # one digit for every key: the pass moves nothing
            total = 0
            for d in range(buckets):
                n = c[d]
                c[d] = total
                total += n
            for j in range(width):
                key = src_k[j]
                d = (key >> shift) & (buckets - 1)
                dst_k[c[d]], dst_i[c[d]] = key, src_i[j]
                c[d] += 1
            src_k, src_i, dst_k, dst_i = dst_k, dst_i, src_k, src_i
        for j in range(width):
            out[r, j] = src_i[j]


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
def gather_rows(values, order, out):
    """out[r, p] = values[r, order[r, p]] for every row r and position p (``order`` of any integer dtype; ``out``
    shaped as ``order``, of ``values``' dtype: a buffer its caller reuses). Returns ``out``."""
    rows, width = order.shape
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


def row_order(block: np.ndarray, dtype: np.dtype | type = np.int64) -> np.ndarray:
    """Each row's order under (score desc, index asc): column indices best first, as ``dtype`` (uint16 is
    enough up to 65,536 columns). A radix sort per row (``_radix_order``: a few ns an entry on any CPU, where
    numpy's sort of int64 keys took ~22 ns an entry on a CPU its build gives no SIMD sort), on one thread per core;
    the block's memory traffic is its scores read once and the orders written once."""
    rows, width = block.shape
    out = np.empty(block.shape, dtype=dtype)
    if width and width - 1 > np.iinfo(out.dtype).max:
        raise ValueError(f"{width} columns do not fit a {out.dtype} order")
    if width > np.iinfo(np.int32).max:
        raise ValueError(f"{width} columns do not fit the sort's int32 indices")
    _on_threads(lambda r0, r1: _radix_order(block, r0, r1, out), rows, block.size)
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
    """For document fusion over whole rankings, in two reads of each row of a model's scores (the second from
    cache): the entries whose evidence (``affine_evidence``'s float32 operations, never stored) comes before
    (best[r], best_tb[r], index[r]) under (evidence desc, score desc, column asc), as ``count_ahead`` counts them
    with the scores as tiebreak; then every score offered to row r's heap (the model's own top list, as
    ``offer_rows`` keeps it). Returns the counts. The count is a loop without branches or stores, which the
    compiler vectorises (with the heap in the same loop nothing was: ~3x slower). No fastmath here: the evidence
    must round exactly as ``affine_evidence`` and the torch expression of it do."""
    rows, width = block.shape
    k = vals.shape[1]
    w = np.float32(weight)
    out = np.empty(rows, dtype=np.int64)
    chunks = _row_chunks(rows)
    for c in prange(chunks):
        positions = np.empty(width, dtype=np.int64)
        for r in range(c * rows // chunks, (c + 1) * rows // chunks):
            lo, sc = low[r], scale[r]
            fixed = np.float32(flat_value) * w
            b, t, i = best[r], best_tb[r], index[r]
            row = block[r]
            ahead = 0
            if flat[r]:
                for j in range(width):
                    s = row[j]
                    ahead += (fixed > b) | ((fixed == b) & ((s > t) | ((s == t) & (j < i))))
            else:
                for j in range(width):
                    s = row[j]
                    e = ((s - lo) / sc) * w
                    ahead += (e > b) | ((e == b) & ((s > t) | ((s == t) & (j < i))))
            out[r] = ahead
            counts[r] = _offer_from(row, _row_floor(row, k), 0, vals[r], ids[r], counts[r], positions)
    return out
