"""What the fusion methods share (each method is its own module in :mod:`fusebench.fusion.methods`): each row's
moments, list positions, the engines' score maps, and the per-row affine map the score normalisers produce.
:mod:`fusebench.fusion.combine` applies a method's evidence with the model weights and combines the lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fusebench.search.row_kernels import row_mean_std


def row_moments(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int,
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


def affine_evidence(scores: torch.Tensor, rows: RowAffine) -> torch.Tensor:
    """The affine map applied: (s - low) / scale, ``flat_value`` on flat rows."""
    return ((scores - rows.low) / rows.scale).masked_fill_(rows.flat, rows.flat_value)
