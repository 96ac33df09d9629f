"""L2 normalisation of embedding rows of any finite scale in one parallel pass (numba), bit for bit what numpy
computes for rows of ordinary scale.

``check_matrix`` used ``np.isfinite(x).all(1)``, ``np.linalg.norm(x, axis=1)`` and ``x / norms``: four
passes over the matrix and two temporaries as large as it (0.15 s per model of a COCO-size corpus, paid by
every job of a sweep). Here one pass per row sums the squares in numpy's own order (its pairwise summation:
eight accumulators over blocks of at most 128, halves above that, all in float32), takes the float32 square
root and divides, so the normalised rows, and every score and rank computed from them, are unchanged.

That float32 sum is only trusted where it is accurate: finite, and at least ``width * 2**-125`` (so squares
that fell into float32's subnormal range cost it less than one rounding). Every other row (entries so large
that their squares overflow float32, e.g. 1e20 or 3e38; so small that they underflow, e.g. 1e-20 or 1e-30;
float64 entries beyond float32's range; and rows holding NaN, inf or only zeros) is redone from the input as
given, in float64 after dividing by its largest magnitude: its direction is then correct to float32 rounding
(numpy itself gives NaN, zeros or imprecise rows there), and only a row of zeros has norm 0. Those rows are not
numpy's bits; ordinary embeddings never reach that path.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from fusebench.runtime.jit import kernel

PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE: the longest run summed by eight accumulators without splitting
SUBNORMAL_SAFE = 2.0 ** -125  # per entry: a float32 sum of squares below width * this may have lost more than
# one rounding to squares and partial sums in the subnormal range (each off by up to 2**-150)


@kernel(inline="always")
def _block_sum_squares(row, start, n):
    """numpy's pairwise-sum leaf (n <= PAIRWISE_BLOCK): eight accumulators, combined in pairs, then the rest."""
    if n < 8:
        total = np.float32(0.0)
        for i in range(start, start + n):
            total += row[i] * row[i]
        return total
    r0, r1, r2, r3 = row[start] * row[start], row[start + 1] * row[start + 1], \
        row[start + 2] * row[start + 2], row[start + 3] * row[start + 3]
    r4, r5, r6, r7 = row[start + 4] * row[start + 4], row[start + 5] * row[start + 5], \
        row[start + 6] * row[start + 6], row[start + 7] * row[start + 7]
    i = 8
    while i < n - n % 8:
        j = start + i
        r0 += row[j] * row[j]
        r1 += row[j + 1] * row[j + 1]
        r2 += row[j + 2] * row[j + 2]
        r3 += row[j + 3] * row[j + 3]
        r4 += row[j + 4] * row[j + 4]
        r5 += row[j + 5] * row[j + 5]
        r6 += row[j + 6] * row[j + 6]
        r7 += row[j + 7] * row[j + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        total += row[start + i] * row[start + i]
        i += 1
    return total


@kernel(inline="always")
def _sum_squares(row):
    """Sum of ``row ** 2`` in float32, in the order of numpy's pairwise sum: a run longer than PAIRWISE_BLOCK
    is split at half its length (rounded down to a multiple of 8) and its halves' sums added, left first.
    numpy recurses; here an explicit stack walks the same tree (numba's cache does not take recursion)."""
    starts = np.empty(64, dtype=np.int64)  # depth <= log2(width): 64 levels hold any array
    lengths = np.empty(64, dtype=np.int64)
    left = np.empty(64, dtype=np.float32)  # a node's left-half sum, kept while its right half is summed
    done_left = np.zeros(64, dtype=np.bool_)
    top = 0
    starts[0], lengths[0] = 0, row.shape[0]
    total = np.float32(0.0)
    while True:
        n = lengths[top]
        if n > PAIRWISE_BLOCK:  # descend into the left half
            half = n // 2 - (n // 2) % 8
            starts[top + 1], lengths[top + 1] = starts[top], half
            done_left[top + 1] = False
            top += 1
            continue
        total = _block_sum_squares(row, starts[top], n)
        while top > 0:  # hand the finished sum up: a left half waits for its right, a right half completes
            parent = top - 1
            if not done_left[top]:
                left[parent] = total
                half = lengths[parent] // 2 - (lengths[parent] // 2) % 8
                starts[top], lengths[top] = starts[parent] + half, lengths[parent] - half
                done_left[top] = True
                break
            total = left[parent] + total
            top = parent
        else:
            return total


@kernel(parallel=True, cache=True)
def _normalise(array, out, norms, trusted):
    rows, width = array.shape
    smallest = np.float32(width) * np.float32(SUBNORMAL_SAFE)
    for r in prange(rows):
        row = array[r]
        squares = _sum_squares(row)
        trusted[r] = np.isfinite(squares) and squares >= smallest
        if not trusted[r]:  # redone from the input by _rescaled, which writes this row's out and norms
            continue
        norm = np.sqrt(squares)
        norms[r] = norm
        for j in range(width):
            out[r, j] = row[j] / norm


def _rescaled(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(directions as float32, L2 norms, all entries finite) of ``rows`` (any numeric dtype) in float64, each row
    divided by its largest magnitude first, so no square overflows or underflows; a row of zeros has norm 0 and
    NaN directions, a row with NaN or inf has NaN norm (its directions are not used)."""
    x = np.asarray(rows, dtype=np.promote_types(rows.dtype, np.float64))  # float64, or a wider float as given
    finite = np.isfinite(x).all(axis=1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        largest = np.where(finite, np.abs(np.where(np.isfinite(x), x, 0)).max(axis=1, initial=0), np.nan)
        unit = x / largest[:, None]  # entries within [-1, 1], the largest +-1: the sum of squares is in [1, width]
        length = np.sqrt(np.einsum("ij,ij->i", unit, unit))
        norms = np.where(largest == 0, 0.0, largest * length).astype(np.float64)  # inf beyond float64's range
        return (unit / length[:, None]).astype(np.float32), norms, finite


def l2_normalise_rows(array: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(array / norms[:, None], norms, finite)`` for a 2-D numeric array: the rows divided by their L2 norms
    as float32, the norms (float64; exactly ``np.linalg.norm`` of the float32 rows for every row the float32 sum
    serves, see the module docstring), and whether each row's entries are all finite. The input is not
    modified; a zero row comes out as NaN with norm 0, and a row with NaN or inf as NaN with norm NaN (callers
    reject both)."""
    source = array
    with np.errstate(over="ignore"):  # float64 entries beyond float32's range: their rows are redone from source
        array = np.ascontiguousarray(array, dtype=np.float32)
    out = np.empty_like(array)
    norms = np.empty(array.shape[0], dtype=np.float32)
    trusted = np.empty(array.shape[0], dtype=np.bool_)
    _normalise(array, out, norms, trusted)
    norms = norms.astype(np.float64)
    finite = np.ones(array.shape[0], dtype=np.bool_)
    redo = np.flatnonzero(~trusted)
    if redo.size:
        out[redo], norms[redo], finite[redo] = _rescaled(np.asarray(source)[redo])
    return out, norms, finite
