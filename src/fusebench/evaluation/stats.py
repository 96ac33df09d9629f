"""Paired statistics for comparing two retrievers on the same queries.

The paired bootstrap resamples queries with replacement and recomputes the difference in hit rate. Only a
query's outcome type matters (candidate-only hit = win, baseline-only hit = loss, else tie), so drawing Q
queries uniformly is exactly a multinomial draw of (wins, losses, ties) counts: the same distribution as
index resampling, at a cost independent of Q. The image-clustered bootstrap resamples images with all their
captions; clusters are grouped by (net wins, size) type, again a multinomial over types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import bdtr  # scipy.special: a third of scipy.stats' import time


@dataclass(frozen=True)
class PairedResult:
    gain: float  # candidate minus baseline, percentage points
    ci_low: float
    ci_high: float
    wins: int  # candidate right, baseline wrong
    losses: int  # baseline right, candidate wrong
    n: int

    def as_dict(self) -> dict:
        return asdict(self)

    def __getitem__(self, key: str):
        """``result["gain"]`` as well as ``result.gain``."""
        return getattr(self, key)


def _as_bool(hits, name: str) -> np.ndarray:
    array = np.asarray(hits)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-query hits, got shape {array.shape}.")
    return array.astype(bool)


def _check_pair(candidate_hits, baseline_hits) -> tuple[np.ndarray, np.ndarray]:
    cand, base = _as_bool(candidate_hits, "candidate_hits"), _as_bool(baseline_hits, "baseline_hits")
    if cand.shape != base.shape:
        raise ValueError(f"paired hits must cover the same queries: {cand.shape[0]} vs {base.shape[0]}.")
    if cand.size == 0:
        raise ValueError("paired comparison needs at least one query.")
    return cand, base


def _percentile_interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}.")
    tail = (1 - level) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return float(low), float(high)


def paired_bootstrap(candidate_hits, baseline_hits, draws: int = 2000, level: float = 0.95,
                     seed: int = 0) -> PairedResult:
    """Gain in points with a percentile interval from ``draws`` paired bootstrap resamples over queries."""
    cand, base = _check_pair(candidate_hits, baseline_hits)
    n = cand.size
    wins = int((cand & ~base).sum())
    losses = int((base & ~cand).sum())
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, [wins / n, losses / n, (n - wins - losses) / n], size=int(draws))
    gains = 100.0 * (counts[:, 0] - counts[:, 1]) / n
    low, high = _percentile_interval(gains, level)
    return PairedResult(gain=100.0 * (wins - losses) / n, ci_low=low, ci_high=high, wins=wins, losses=losses, n=n)


def clustered_bootstrap(candidate_hits, baseline_hits, clusters, draws: int = 2000, level: float = 0.95,
                        seed: int = 0) -> PairedResult:
    """Like :func:`paired_bootstrap` but resampling whole clusters (images with all their captions).

    Each draw takes as many clusters as there are, with replacement; the gain of a draw is
    100 * (wins - losses) / (queries drawn).
    """
    cand, base = _check_pair(candidate_hits, baseline_hits)
    clusters = np.asarray(clusters)
    if clusters.shape != cand.shape:
        raise ValueError("clusters must give one cluster label per query.")
    if clusters.dtype.kind in "iu" and clusters.size and 0 <= clusters.min() and clusters.max() < 4 * clusters.size:
        label = clusters  # image indices: count per index, then drop the indices that hold no query
    else:
        _, label = np.unique(clusters, return_inverse=True)
    net = np.bincount(label, weights=cand.astype(np.int64) - base.astype(np.int64)).astype(np.int64)
    size = np.bincount(label).astype(np.int64)
    net, size = net[size > 0], size[size > 0]
    # distinct (net, size) types in lexicographic order, via one int64 key per cluster
    key = (net - net.min()) * (size.max() + 1) + size
    unique_keys, type_count = np.unique(key, return_counts=True)
    types = np.stack([unique_keys // (size.max() + 1) + net.min(), unique_keys % (size.max() + 1)], axis=1)
    rng = np.random.default_rng(seed)
    n_clusters = size.size
    counts = rng.multinomial(n_clusters, type_count / n_clusters, size=int(draws))
    gains = 100.0 * (counts @ types[:, 0]) / (counts @ types[:, 1])
    low, high = _percentile_interval(gains, level)
    wins = int((cand & ~base).sum())
    losses = int((base & ~cand).sum())
    return PairedResult(gain=100.0 * (wins - losses) / cand.size, ci_low=low, ci_high=high, wins=wins,
                        losses=losses, n=int(cand.size))


def mcnemar_p(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p-value: under no difference, wins ~ Binomial(wins + losses, 1/2), a symmetric
    law, so the two-sided p is twice the smaller tail, capped at 1 (what scipy.stats.binomtest gives)."""
    if wins + losses == 0:
        return 1.0
    return min(1.0, 2.0 * float(bdtr(min(wins, losses), wins + losses, 0.5)))


def oracle_hits(hits_by_model: list[np.ndarray]) -> np.ndarray:
    """'Either model right': the ceiling a perfect chooser between the models would reach."""
    return np.logical_or.reduce([np.asarray(h, dtype=bool) for h in hits_by_model])


def holm_adjust(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1), in the input order."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out.tolist()


def _value_pair(candidate_values, baseline_values) -> tuple[np.ndarray, np.ndarray]:
    cand, base = np.asarray(candidate_values, dtype=np.float64), np.asarray(baseline_values, dtype=np.float64)
    if cand.ndim != 1 or cand.shape != base.shape or cand.size == 0:
        raise ValueError(f"paired values must be 1-D over the same queries: {cand.shape} vs {base.shape}.")
    return cand, base


def _is_hits(values: np.ndarray) -> bool:
    return bool(np.isin(values, (0.0, 1.0)).all())


def paired_bootstrap_values(candidate_values, baseline_values, draws: int = 2000, level: float = 0.95,
                            seed: int = 0, block: int = 64) -> PairedResult:
    """:func:`paired_bootstrap` for per-query values in [0, 1] (mAP@R, R-Precision): the gain of the means in
    points, a percentile interval over ``draws`` resamples of queries (``block`` draws at a time, so memory
    stays draws-independent), and wins/losses counted as queries where one value is higher. 0/1 values take
    the multinomial fast path of :func:`paired_bootstrap`."""
    cand, base = _value_pair(candidate_values, baseline_values)
    if _is_hits(cand) and _is_hits(base):
        return paired_bootstrap(cand.astype(bool), base.astype(bool), draws=draws, level=level, seed=seed)
    diff, n = cand - base, cand.size
    rng = np.random.default_rng(seed)
    gains = np.concatenate([100.0 * diff[rng.integers(0, n, size=(min(block, draws - d), n))].mean(axis=1)
                            for d in range(0, int(draws), block)])
    low, high = _percentile_interval(gains, level)
    return PairedResult(gain=float(100.0 * diff.mean()), ci_low=low, ci_high=high, wins=int((diff > 0).sum()),
                        losses=int((diff < 0).sum()), n=n)


def clustered_bootstrap_values(candidate_values, baseline_values, clusters, draws: int = 2000, level: float = 0.95,
                               seed: int = 0, block: int = 64) -> PairedResult:
    """:func:`clustered_bootstrap` for per-query values: whole clusters (an image with its captions) resampled;
    a draw's gain is 100 x (sum of the drawn clusters' differences) / (queries drawn)."""
    cand, base = _value_pair(candidate_values, baseline_values)
    if _is_hits(cand) and _is_hits(base):
        return clustered_bootstrap(cand.astype(bool), base.astype(bool), clusters, draws=draws, level=level, seed=seed)
    _, label = np.unique(np.asarray(clusters), return_inverse=True)
    diff = cand - base
    net, size = np.bincount(label, weights=diff), np.bincount(label).astype(np.float64)
    rng = np.random.default_rng(seed)
    m = net.size
    gains = []
    for d in range(0, int(draws), block):
        pick = rng.integers(0, m, size=(min(block, draws - d), m))
        gains.append(100.0 * net[pick].sum(axis=1) / size[pick].sum(axis=1))
    low, high = _percentile_interval(np.concatenate(gains), level)
    return PairedResult(gain=float(100.0 * diff.mean()), ci_low=low, ci_high=high, wins=int((diff > 0).sum()),
                        losses=int((diff < 0).sum()), n=int(cand.size))
