"""Exact similarity search: stable top-k and ranks of known targets, on any torch device.

Ordering rule everywhere: descending score, ties broken by ascending item index (what a stable descending
sort gives). ``rank`` is 1-based. All functions are pure over tensors.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from fusebench.runtime import state


def float_rows(array, device: torch.device | str = "cpu") -> torch.Tensor:
    """An embedding matrix as a float32 tensor on ``device``, sharing a float32 array's memory on the CPU. A
    read-only array (the normalised rows that jobs of one process share) is only ever read through it: torch
    would warn that it cannot mark the tensor read-only."""
    array = np.asarray(array, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(array).to(device)


def similarity(queries: torch.Tensor, items: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``queries @ items.T`` in full fp32 (no TF32: ranks are of fp32 scores); every similarity block of
    the evaluator goes through here, counted in the process state (a job records how many it computed)."""
    state.current().similarity_blocks += 1
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return torch.matmul(queries, items.T, out=out)
    finally:
        torch.set_float32_matmul_precision(previous)


def stable_sort_desc(values: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort descending; equal values keep their original (ascending index) order."""
    order = torch.sort(values, dim=dim, descending=True, stable=True).indices
    return values.gather(dim, order), order


def descending_keys(values: torch.Tensor, tiebreak: torch.Tensor) -> torch.Tensor:
    """int64 keys whose ascending order is (value descending, tiebreak ascending).

    The float32 value is negated (+0.0 folds -0.0 into 0.0), its bits mapped to an int32 of the same
    order, and placed above the 32-bit tiebreak. ``tiebreak`` must lie in [0, 2**32).
    """
    negated = (-values.to(torch.float32)) + 0.0
    bits = negated.view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    return (ordered << 32) | tiebreak.to(torch.int64)


def decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`descending_keys`: (values, tiebreaks)."""
    ordered = (keys >> 32).to(torch.int32)
    bits = torch.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return -bits.view(torch.float32), keys & 0xFFFFFFFF


def sort_rows(keys: torch.Tensor) -> torch.Tensor:
    """Sort each row of an int64 tensor ascending; numpy's vectorised sort on the CPU (several times
    faster than torch's there), torch's elsewhere."""
    if keys.device.type == "cpu":
        return torch.from_numpy(np.sort(keys.numpy(), axis=1))
    return torch.sort(keys, dim=1).values


def sort_desc_with_tiebreak(values: torch.Tensor, tiebreak: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: values sorted descending, ties by ascending ``tiebreak`` (default: the position), and the
    tiebreaks in that order. One sort of unique int64 keys."""
    if tiebreak is None:
        positions = torch.arange(values.shape[1], device=values.device).expand_as(values)
        order = sort_rows(descending_keys(values, positions)) & 0xFFFFFFFF
        return values.gather(1, order), order
    return decode_keys(sort_rows(descending_keys(values, tiebreak)))


def _top_candidates(scores: torch.Tensor, m: int, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Some ``m`` largest entries per row, in no particular order (ties picked arbitrarily).

    On the CPU, numpy's introselect (``argpartition``) over blocks of rows that stay in cache is two to
    three times faster than ``torch.topk`` at these list lengths; elsewhere ``torch.topk``.
    """
    if scores.device.type != "cpu":
        return torch.topk(scores, m, dim=1, largest=True, sorted=False)
    array = scores.numpy()
    rows, n = array.shape
    cut = n - m
    idx = np.empty((rows, m), dtype=np.int64)
    for r in range(0, rows, block):
        idx[r:r + block] = np.argpartition(np.ascontiguousarray(array[r:r + block]), cut, axis=1)[:, cut:]
    idx = torch.from_numpy(idx)
    return scores.gather(1, idx), idx


def topk_stable(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` entries of each row under a stable descending sort: (values, column indices).

    A selection routine picks an arbitrary member of a group of tied values; this takes k + 1 candidates,
    orders them by (score desc, index asc), and redoes with a full stable sort the rare rows where the
    (k+1)-th value equals the k-th (a tie straddling the cut, where the smallest tied indices must win).
    """
    n = scores.shape[1]
    k = min(k, n)
    if k == n:
        return stable_sort_desc(scores, dim=1)
    values, idx = _top_candidates(scores, k + 1)
    values, idx = sort_desc_with_tiebreak(values, idx)
    values, idx = values.to(scores.device), idx.to(scores.device)
    straddle = torch.nonzero(values[:, k - 1] == values[:, k]).flatten()
    values, idx = values[:, :k].contiguous(), idx[:, :k].contiguous()
    if straddle.numel():
        full_vals, full_idx = stable_sort_desc(scores[straddle], dim=1)
        values[straddle] = full_vals[:, :k]
        idx[straddle] = full_idx[:, :k]
    return values, idx


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """1-based rank of column ``targets[r]`` in row ``r`` under the stable descending order (int64)."""
    target_scores = scores.gather(1, targets[:, None])
    greater = (scores > target_scores).sum(dim=1)
    at_least = (scores >= target_scores).sum(dim=1)
    ranks = greater + 1
    tied_rows = torch.nonzero(at_least - greater > 1).flatten()
    if tied_rows.numel():
        cols = torch.arange(scores.shape[1], device=scores.device)
        sub = scores[tied_rows]
        ties_before = ((sub == target_scores[tied_rows]) & (cols[None, :] < targets[tied_rows, None])).sum(dim=1)
        ranks[tied_rows] += ties_before
    return ranks


def merge_topk(chunks: list[tuple[torch.Tensor, torch.Tensor]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge per-chunk top-k lists (values, global ids), given in ascending-id chunk order, into one top-k.

    Each chunk's list is already ordered (score desc, id asc) and every id of chunk j is below every id of
    chunk j+1, so a stable sort of the concatenation keeps the global tie rule.
    """
    values = torch.cat([v for v, _ in chunks], dim=1)
    ids = torch.cat([i for _, i in chunks], dim=1)
    values, order = sort_desc_with_tiebreak(values)
    return values[:, :k], ids.gather(1, order[:, :k])


def column_target_ranks(scores: torch.Tensor, owner: torch.Tensor, column_items: torch.Tensor) -> torch.Tensor:
    """For each column j of ``scores`` (rows = items), the 1-based rank of the first row whose ``owner``
    equals ``column_items[j]`` under the stable descending order of that column (i2t: any caption of the
    image is correct). Every column must have at least one correct row."""
    correct = owner[:, None] == column_items[None, :]
    neg_inf = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
    best = torch.where(correct, scores, neg_inf).amax(dim=0)
    rows = torch.arange(scores.shape[0], device=scores.device)[:, None]
    first_best = torch.where(correct & (scores == best), rows, scores.shape[0]).amin(dim=0)
    ahead = (scores > best) | ((scores == best) & (rows < first_best))
    return 1 + ahead.sum(dim=0)
