"""Per-query ranks of the first correct item, recall@k and median rank. Pure numpy/torch (torch is imported
where a list's ranks are found, so that a report checking recorded numbers against ranks does not load it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def first_hit_ranks(correct: torch.Tensor) -> np.ndarray:
    """1-based position of the first ``True`` in each row of ``correct`` (queries x list positions); 0 if none."""
    import torch

    width = correct.shape[1]
    pos = torch.where(correct, torch.arange(width, device=correct.device)[None, :], torch.full_like(correct, width, dtype=torch.int64))
    first = pos.min(dim=1).values if width else torch.zeros(correct.shape[0], dtype=torch.int64)
    return torch.where(first < width, first + 1, torch.zeros_like(first)).cpu().numpy().astype(np.int64)


def t2i_list_ranks(ids: torch.Tensor, caption_image: torch.Tensor) -> np.ndarray:
    """Ranks for caption queries: the correct item is the caption's one image."""
    return first_hit_ranks(ids == caption_image[:, None])


def i2t_list_ranks(ids: torch.Tensor, query_images: torch.Tensor, caption_image: torch.Tensor) -> np.ndarray:
    """Ranks for image queries: any caption of the image is correct."""
    import torch

    owner = torch.where(ids >= 0, caption_image[ids.clamp(min=0)], torch.full_like(ids, -1))
    return first_hit_ranks(owner == query_images[:, None])


def hits_at_k(ranks: np.ndarray, k: int) -> np.ndarray:
    """Boolean per query: the first correct item is within the top k (rank 0 = absent = miss)."""
    ranks = np.asarray(ranks)
    return (ranks >= 1) & (ranks <= k)


def recall_at_k(ranks: np.ndarray, k: int) -> float:
    """Percent of queries whose first correct item is within the top k."""
    return float(100.0 * hits_at_k(ranks, k).mean()) if len(ranks) else float("nan")


def median_rank(ranks: np.ndarray) -> float | None:
    """Median of the 1-based ranks, absent (0) counted as worse than any listed rank; None if that median is absent."""
    ranks = np.asarray(ranks, dtype=np.float64)
    if ranks.size == 0:
        return None
    value = float(np.median(np.where(ranks >= 1, ranks, np.inf)))
    return value if np.isfinite(value) else None
