"""Recall@k and median rank from per-query ranks of the first correct item (pure numpy; the ranks of a list are
found by :mod:`fusebench.search.ranked`)."""

from __future__ import annotations

import numpy as np


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
