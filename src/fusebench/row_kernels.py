"""Whole-row kernels (numba) for fusion over whole rankings (``fusion.top_k: null``, :mod:`fusebench.dense`)
and the score store's derived matrices: row moments, stable row orders and ranks, scatter and gather by a
stored order, affine evidence, and the matrix-free document pass that counts the entries ahead of a winner
while it keeps the model's top list (the heaps of :mod:`fusebench.kernels`).

Same conventions as the selection kernels: scores descending, ties by ascending index; float32 in and out,
float64 where a sum must not depend on the order of its terms.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit, prange

from fusebench.kernels import FAST, _floor_of_kth, _offer


@njit(parallel=True, cache=True)
def row_mean_std(block, ddof):
    """Per row: mean and standard deviation (``ddof`` 0 or 1; 0 when undefined) of every entry, accumulated in
    float64 and rounded once to float32, as ``evidence._row_mean_std`` does for lists."""
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


@njit(parallel=True, cache=True)
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


@njit(parallel=True, cache=True)
def _descending_keys(block, keys):
    """int64 keys whose ascending order is (score desc, index asc): order-preserving bits of -score above
    the column index (as ``search.descending_keys``)."""
    rows, width = block.shape
    for r in prange(rows):
        negated = np.empty(width, dtype=np.float32)
        for j in range(width):
            negated[j] = -block[r, j] + np.float32(0.0)
        bits = negated.view(np.int32)
        for j in range(width):
            b = bits[j]
            ordered = b ^ 0x7FFFFFFF if b < 0 else b
            keys[r, j] = (np.int64(ordered) << 32) | j


@njit(parallel=True, cache=True)
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


@njit(parallel=True, cache=True)
def gather_rows(values, order):
    """values[r, order[r, p]] for every row r and position p (``order`` of any integer dtype)."""
    rows, width = order.shape
    out = np.empty(order.shape, dtype=values.dtype)
    for r in prange(rows):
        for p in range(width):
            out[r, p] = values[r, order[r, p]]
    return out


def row_order(block: np.ndarray) -> np.ndarray:
    """Each row's order under (score desc, index asc): column indices best first (int64). numba builds the
    keys, numpy's vectorised int64 sort orders them (single-threaded, but it releases the GIL: the rows are
    sorted in one slice per core), the index is their low 32 bits."""
    keys = np.empty(block.shape, dtype=np.int64)
    _descending_keys(block, keys)
    _sort_rows_threaded(keys)
    keys &= 0xFFFFFFFF
    return keys


def _sort_rows_threaded(keys: np.ndarray, min_entries: int = 1 << 20) -> None:
    """Sort each row of ``keys`` in place, slices of rows on parallel threads when the block is large."""
    workers = min(os.cpu_count() or 1, len(keys), max(1, keys.size // min_entries))
    if workers <= 1:
        keys.sort(axis=1)
        return
    bounds = np.linspace(0, len(keys), workers + 1).astype(int)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda r: keys[r[0]:r[1]].sort(axis=1), zip(bounds[:-1], bounds[1:])))


def stable_ranks(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the 1-based rank of every entry under (score desc, index asc) and the order itself."""
    order = row_order(block)
    ranks = np.empty(block.shape, dtype=np.int64)
    scatter_by_order(order, np.arange(1, block.shape[1] + 1, dtype=np.int64), ranks, False)
    return ranks, order


@njit(parallel=True, cache=True)
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


@njit(cache=True, fastmath=FAST)
def _row_floor(row, k):
    """``_floor_of_kth`` compiled on its own with fast reductions (its caller must not take fastmath)."""
    return _floor_of_kth(row, k)


@njit(parallel=True, cache=True)
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
