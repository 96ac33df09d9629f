"""Per-list evidence: small, named, pure normalisers (one model's ranked list -> each hit's evidence).

Rank methods (RRF, ISR, Borda) give evidence by list position; score methods map each row affinely
(:class:`RowAffine`: DBSF, min-max, z-score, L2, the raw score), optionally after an engine's score map.
:mod:`fusebench.fusion.combine` applies them with the model weights and combines the lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fusebench.search.row_kernels import row_mean_std


def _row_mean_std(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int,
                  moments: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation (``ddof`` 0 or 1) of each row's valid entries (``None``: all); sd 0 when
    undefined. Accumulated in float64 and rounded once to float32, so a row's statistics do not depend on
    the order of its entries (a ranked list and the unsorted row it came from give the same values).
    ``moments``: whole rows' (mean, sd) already computed the same way (the score store's), (B, 2)."""
    if moments is not None:
        return moments[:, :1], moments[:, 1:2]
    if valid is None and scores.device.type == "cpu":
        mean, std = row_mean_std(scores.contiguous().numpy(), ddof)  # whole rows: one pass per moment
        return torch.from_numpy(mean)[:, None], torch.from_numpy(std)[:, None]
    if valid is None:
        valid = torch.ones_like(scores, dtype=torch.bool)
    wide = scores.to(torch.float64)
    count = valid.sum(dim=1, keepdim=True).to(torch.float64)
    mean = wide.masked_fill(~valid, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)
    sq = ((wide - mean) ** 2).masked_fill_(~valid, 0.0).sum(dim=1, keepdim=True)
    denom = count - ddof
    std = torch.sqrt(sq / denom.clamp(min=1)).masked_fill_(denom <= 0, 0.0)
    return mean.to(scores.dtype), std.to(scores.dtype)


def _ranks(scores: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """1-based list positions (plus ``offset``: the entries of the lists before this one, LanceDB's ranks)."""
    return torch.arange(1 + offset, scores.shape[1] + 1 + offset, device=scores.device, dtype=scores.dtype)


def isr_evidence(scores: torch.Tensor, valid: torch.Tensor | None, offset: int = 0, **_) -> torch.Tensor:
    """Inverse square rank (Mourao et al. 2015): 1 / rank^2, rank 1-based by list position."""
    return (1.0 / _ranks(scores, offset) ** 2).expand_as(scores).clone()


def rrf_evidence(scores: torch.Tensor, valid: torch.Tensor, rrf_k: float, offset: int = 0, **_) -> torch.Tensor:
    """1 / (rrf_k + rank), rank 1-based by list position."""
    return (1.0 / (rrf_k + _ranks(scores, offset))).expand_as(scores).clone()


def borda_evidence(scores: torch.Tensor, valid: torch.Tensor | None, candidates: torch.Tensor | None = None,
                   **_) -> torch.Tensor:
    """Borda points (Aslam and Montague 2001, as ranx's bordafuse): n - rank + 1, where n is the number of
    distinct items in all the query's lists (``candidates``, (B, 1); None: this list's length). An item a list
    lacks gets (n - that list's length + 1) / 2 from it: :func:`borda_absent_points`."""
    n = torch.full((scores.shape[0], 1), scores.shape[1], dtype=scores.dtype, device=scores.device) \
        if candidates is None else candidates.to(scores.dtype)
    return n - _ranks(scores) + 1


def borda_absent_points(valid: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """(B, 1): the points a list gives each candidate it does not hold, (n - its length + 1) / 2."""
    return (candidates - valid.sum(dim=1, keepdim=True) + 1).to(torch.float32) / 2


def map_scores(scores: torch.Tensor, score_map: str) -> torch.Tensor:
    """An engine's own score for a cosine ``s`` (monotone, so lists keep their order)."""
    if score_map == "cosine01":  # Lucene's cosine (Elasticsearch, OpenSearch), Milvus' COSINE normalisation
        return (1 + scores) * 0.5
    if score_map == "atan":  # Milvus' IP normalisation
        return 0.5 + torch.atan(scores) / math.pi
    return scores


@dataclass
class RowAffine:
    """A score normaliser's per-row parameters: evidence = (s - low) / scale, or ``flat_value`` on flat rows."""

    low: torch.Tensor  # (B, 1)
    scale: torch.Tensor  # (B, 1), 1 on flat rows
    flat: torch.Tensor  # (B, 1) bool
    flat_value: float


def dbsf_rows(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, moments=None, **_) -> RowAffine:
    """Distribution-based score fusion: (s - (mean - 3 sd)) / (6 sd) over this list; 0.5 where sd = 0. No clipping."""
    mean, std = _row_mean_std(scores, valid, ddof, moments)
    flat = std <= 0
    return RowAffine(mean - 3 * std, (6 * std).masked_fill_(flat, 1.0), flat, 0.5)


def minmax_rows(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> RowAffine:
    """(s - min) / (max - min) over this list; 0.5 where max = min."""
    if valid is None:
        low, high = scores.amin(dim=1, keepdim=True), scores.amax(dim=1, keepdim=True)
    else:
        big = torch.finfo(scores.dtype).max
        low = torch.where(valid, scores, torch.full_like(scores, big)).amin(dim=1, keepdim=True)
        high = torch.where(valid, scores, torch.full_like(scores, -big)).amax(dim=1, keepdim=True)
    span = high - low
    flat = span <= 0
    return RowAffine(low, span.masked_fill(flat, 1.0), flat, 0.5)


def zscore_rows(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, moments=None, **_) -> RowAffine:
    """(s - mean) / sd over this list; 0 where sd = 0."""
    mean, std = _row_mean_std(scores, valid, ddof, moments)
    flat = std <= 0
    return RowAffine(mean, std.masked_fill(flat, 1.0), flat, 0.0)


def l2_rows(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> RowAffine:
    """s / sqrt(sum of the list's s^2) (Elasticsearch ``l2_norm``, OpenSearch ``l2``); 0 where that norm is 0."""
    wide = scores.to(torch.float64)
    if valid is not None:
        wide = wide.masked_fill(~valid, 0.0)
    norm = torch.sqrt((wide * wide).sum(dim=1, keepdim=True)).to(scores.dtype)
    flat = norm <= 0
    return RowAffine(torch.zeros_like(norm), norm.masked_fill(flat, 1.0), flat, 0.0)


def sum_rows(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> RowAffine:
    """The raw cosine score (CombSUM): (s - 0) / 1."""
    zeros = torch.zeros(scores.shape[0], 1, dtype=scores.dtype, device=scores.device)
    return RowAffine(zeros, torch.ones_like(zeros), torch.zeros_like(zeros, dtype=torch.bool), 0.0)


MOMENT_METHODS = ("dbsf", "zscore")  # the normalisers that take each row's mean and sd
AFFINE = {"dbsf": dbsf_rows, "minmax": minmax_rows, "zscore": zscore_rows, "l2": l2_rows, "sum": sum_rows}


def affine_evidence(scores: torch.Tensor, rows: RowAffine) -> torch.Tensor:
    return ((scores - rows.low) / rows.scale).masked_fill_(rows.flat, rows.flat_value)


def dbsf_evidence(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, **_) -> torch.Tensor:
    return affine_evidence(scores, dbsf_rows(scores, valid, ddof))


def minmax_evidence(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> torch.Tensor:
    return affine_evidence(scores, minmax_rows(scores, valid))


def zscore_evidence(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, **_) -> torch.Tensor:
    return affine_evidence(scores, zscore_rows(scores, valid, ddof))


def sum_evidence(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> torch.Tensor:
    return scores.clone()


def l2_evidence(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> torch.Tensor:
    return affine_evidence(scores, l2_rows(scores, valid))


EVIDENCE = {
    "rrf": rrf_evidence,
    "isr": isr_evidence,
    "borda": borda_evidence,
    "l2": l2_evidence,
    "dbsf": dbsf_evidence,
    "minmax": minmax_evidence,
    "zscore": zscore_evidence,
    "sum": sum_evidence,
}
