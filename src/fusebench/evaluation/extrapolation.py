"""The distractor-scaling study's extrapolation (pure; no I/O): a single model's t2i recall@k with M distractors,
predicted from its run with N < M of the same source, with a bootstrap interval.

Galleries of one source and seed nest, so the gallery of M holds the N distractors already searched plus M - N
fresh draws from the same source. A query at rank ``r_N`` with N stays within the top k with M exactly when at
most ``k - r_N`` of the fresh distractors score above its target (a tie ranks after the target). With ``p_q`` the
chance that one fresh distractor outscores query q's target, that number is Binomial(M - N, p_q) ~ Poisson(lambda_q
= (M - N) p_q), so the query is still found with probability ``P(Poisson(lambda_q) <= k - r_N)`` (``exp(-lambda_q)``
at k = r_N), and predicted recall@k is the mean over queries (0 for a query already below k: it can only fall).

**The tail model (pooled margins).** ``p_q`` is far below 1/N for a query that no distractor beat at N, so its own
list says little about it; the queries' lists together do. Each query's list at N holds its J highest-scoring
distractors (the distractors among the saved ``eval.save_topk`` positions). Its threshold ``u_q`` is the lowest of
them, and its margins are how far the others rise above it (``d - u_q``: J - 1 margins, a known share (J - 1) / N
of all N distractors). The assumption: above each query's own threshold, the distractor scores of every query of
one model follow one distribution of margins (a shifted common tail: how far above the bulk the hard distractors
of a source reach). Then the chance that one distractor rises more than ``t_q - u_q`` above query q's threshold
(``t_q``: its target's score) is the number of margins above that, averaged over the queries, divided by N:

    p_q = mean_{q'} #{margins of q' > t_q - u_q} / N

Pooling is what lets rare hard distractors (near-copies of some test image's scene) seen near a few queries at N
predict the displacements they cause for every query at 10 N. Beyond the largest margin pooled, p_q is 0.

**The interval** is a bootstrap over test images (captions of one image share their target and their
distractors): each draw resamples the images, recomputes the pooled margins from the drawn queries' lists, draws
each drawn query's outcome (found or not, with its chance: the fresh distractors are one random draw too) and
takes the mean; the percentile interval at ``level``. It holds what the test split, the tail estimate and the
fresh draw leave unknown; the measured value on the same queries lies inside it when the tail assumption holds
(tests/test_extrapolation.py checks that on both simulators, 10k -> 100k and 100k -> 1M). Fusions are not
extrapolated: adding distractors changes how a fusion orders the test images themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import pdtr

METHOD = "pooled-margin tail, bootstrap over test images"
MIN_MARGINS = 2  # a query's list must hold at least this many distractors above its threshold to join the pool


class ScalingError(ValueError):
    """Runs whose lists or ranks cannot be used for the study; the message says why."""


def displacements(rank_0: np.ndarray, rank_n: np.ndarray) -> np.ndarray:
    """``c_q = rank_N - rank_0``: per query, the distractors that beat its target, from a single model's exact
    ranks (1-based) at a smaller and a larger gallery of one source. ScalingError when the ranks cannot be a pair
    (different query counts, a rank below 1, or a rank that fell as distractors were added: not the same queries
    and model over nested galleries)."""
    rank_0, rank_n = np.asarray(rank_0, dtype=np.int64), np.asarray(rank_n, dtype=np.int64)
    if rank_0.ndim != 1 or rank_0.shape != rank_n.shape:
        raise ScalingError(f"ranks of {rank_0.shape} and {rank_n.shape} queries are not one query set")
    if rank_0.size and min(rank_0.min(), rank_n.min()) < 1:
        raise ScalingError("a rank below 1 (a query whose target was not ranked): exact ranks are needed")
    fell = np.flatnonzero(rank_n < rank_0)
    if fell.size:
        raise ScalingError(f"{fell.size} queries rank better with distractors than without (first: query "
                           f"{int(fell[0])}, {int(rank_0[fell[0]])} -> {int(rank_n[fell[0]])}): not the same model "
                           "and queries over nested galleries")
    return rank_n - rank_0


def list_scores(targets: np.ndarray, ids: np.ndarray, scores: np.ndarray,
                test_images: int) -> tuple[np.ndarray, np.ndarray]:
    """From saved t2i lists (``ids``, ``scores``: (Q, depth), -1 padding): each query's target score (NaN where
    its target is not in its list) and its distractors' scores in list order (items ``>= test_images``; NaN
    elsewhere)."""
    ids, scores = np.asarray(ids), np.asarray(scores, dtype=np.float64)
    if ids.shape != scores.shape or ids.ndim != 2 or len(ids) != len(targets):
        raise ScalingError(f"lists of shape {ids.shape} / {scores.shape} do not hold one row per query "
                           f"({len(targets)} queries)")
    hit = ids == np.asarray(targets)[:, None]
    target = np.where(hit.any(axis=1), np.where(hit, scores, -np.inf).max(axis=1), np.nan)
    return target, np.where(ids >= test_images, scores, np.nan)


@dataclass(frozen=True)
class Margins:
    """Each query's threshold and the pooled margins above the thresholds (:func:`margins`)."""

    threshold: np.ndarray  # (Q,) the lowest distractor score in each query's list (NaN: too few to join)
    values: np.ndarray  # every pooled margin, ascending
    owner: np.ndarray  # the query each margin belongs to


def margins(distractor_scores: np.ndarray) -> Margins:
    """The pool: per query with at least ``MIN_MARGINS`` + 1 distractors in its list, its threshold (the lowest)
    and the margins of the others above it (strictly above: a distractor tied with the threshold adds none)."""
    d = np.asarray(distractor_scores, dtype=np.float64)
    present = ~np.isnan(d)
    threshold = np.where(present.any(axis=1), np.nanmin(np.where(present, d, np.inf), axis=1), np.nan)
    above = present & (d > threshold[:, None])
    joins = above.sum(axis=1) >= MIN_MARGINS
    threshold = np.where(joins, threshold, np.nan)
    rows, cols = np.nonzero(above & joins[:, None])
    values = d[rows, cols] - threshold[rows]
    order = np.argsort(values, kind="stable")
    return Margins(threshold, values[order], rows[order])


def fresh_rates(pool: Margins, target_margin: np.ndarray, n: int, weights: np.ndarray | None = None) -> np.ndarray:
    """``p_q`` per query: the (weighted) mean over the pooled queries of their margins above ``target_margin[q]``,
    divided by ``n`` (the distractors each list was the top of). NaN where the target margin is NaN."""
    w = np.ones(len(pool.threshold)) if weights is None else np.asarray(weights, dtype=np.float64)
    joined = ~np.isnan(pool.threshold)
    total = float(w[joined].sum())
    tail = np.concatenate([np.cumsum(w[pool.owner][::-1])[::-1], [0.0]])  # weight of margins at or past position i
    known = ~np.isnan(target_margin)
    position = np.searchsorted(pool.values, np.where(known, target_margin, 0.0), side="right")  # strictly above
    return np.where(known, tail[position] / max(total, 1e-300) / n, np.nan)


def found_chance(rank_n: np.ndarray, rates: np.ndarray, n: int, m: int, k: int) -> np.ndarray:
    """Per query, the chance that its target is within the top ``k`` with ``m`` distractors: at most ``k - r_N``
    of the ``m - n`` fresh ones above it, each with chance ``rates[q]`` (Poisson). 0 for queries already below k."""
    rank_n = np.asarray(rank_n, dtype=np.int64)
    out = np.zeros(rank_n.shape)
    can = (rank_n <= k) & ~np.isnan(rates)
    out[can] = pdtr(k - rank_n[can], (m - n) * rates[can])  # the Poisson CDF
    return out


@dataclass(frozen=True)
class Prediction:
    """Predicted recall@k (percent) with its bootstrap interval, and what it rests on."""

    value: float
    low: float
    high: float
    pooled_queries: int  # queries whose lists joined the pool
    margins: int  # margins pooled


def predict_recall(rank_n: np.ndarray, targets: np.ndarray, ids: np.ndarray, scores: np.ndarray, test_images: int,
                   clusters: np.ndarray, n: int, m: int, k: int = 1, draws: int = 1000, level: float = 0.95,
                   seed: int = 0) -> Prediction:
    """Recall@k (percent) of one model's t2i queries with ``m`` distractors, from its run with ``n`` (``rank_n``:
    exact ranks; ``ids``/``scores``: its saved lists; ``targets``: each query's target item; ``clusters``: each
    query's test image, the bootstrap's unit). ScalingError when it cannot be predicted (m <= n, no list holds
    enough distractors, a query within k whose target is not in its list)."""
    rank_n = np.asarray(rank_n, dtype=np.int64)
    if not 0 < n < m:
        raise ScalingError(f"a prediction goes from a gallery with distractors to a larger one (from {n:,} to {m:,})")
    target, distractor = list_scores(targets, ids, scores, test_images)
    within = rank_n <= k
    lost = within & np.isnan(target)
    if lost.any():
        raise ScalingError(f"{int(lost.sum())} queries within the top {k} have no target in their saved list "
                           "(eval.save_topk must be at least k)")
    pool = margins(distractor)
    if pool.values.size == 0:
        raise ScalingError(f"no query's saved list holds {MIN_MARGINS + 1} distractors (raise eval.save_topk)")
    thin = within & np.isnan(pool.threshold)
    if thin.any():
        raise ScalingError(f"{int(thin.sum())} queries within the top {k} hold fewer than {MIN_MARGINS + 1} "
                           "distractors in their saved lists, so their margins are unknown (raise eval.save_topk)")
    target_margin = np.where(within, target - pool.threshold, np.nan)
    margins_pooled = int(pool.values.size)
    counted = pool.values > np.nanmin(target_margin, initial=np.inf)  # no other margin is above any target's
    pool = Margins(pool.threshold, pool.values[counted], pool.owner[counted])
    value = 100.0 * float(found_chance(rank_n, fresh_rates(pool, target_margin, n), n, m, k).mean())
    values = bootstrap_recall(pool, target_margin, rank_n, clusters, n, m, k, draws, np.random.default_rng(seed))
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return Prediction(value, float(low), float(high), int((~np.isnan(pool.threshold)).sum()), margins_pooled)


def bootstrap_recall(pool: Margins, target_margin: np.ndarray, rank_n: np.ndarray, clusters: np.ndarray, n: int,
                     m: int, k: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """``draws`` bootstrap values of predicted recall@k (percent): per draw, the test images (``clusters``) drawn
    with replacement, each query weighted by its image's count; :func:`fresh_rates` with those weights (the pool's
    margins summed per stretch between the sorted target margins, once per draw); then each query's outcome drawn
    with its chance. Equal, draw for draw, to calling :func:`fresh_rates` and :func:`found_chance` with the weights
    (tested)."""
    units, cluster = np.unique(np.asarray(clusters), return_inverse=True)
    known = ~np.isnan(target_margin)
    position = np.searchsorted(pool.values, np.where(known, target_margin, 0.0), side="right")
    starts, stretch = np.unique(position, return_inverse=True)  # pool positions where some query's count starts
    owner_unit = cluster[pool.owner]
    joined_per_unit = np.bincount(cluster[~np.isnan(pool.threshold)], minlength=len(units)).astype(np.float64)
    values = np.empty(draws)
    for i in range(draws):
        per_unit = np.bincount(rng.integers(0, len(units), len(units)), minlength=len(units)).astype(np.float64)
        w = per_unit[cluster]
        margin_w = per_unit[owner_unit]
        sums = np.add.reduceat(margin_w, np.minimum(starts, max(len(margin_w) - 1, 0))) if margin_w.size else \
            np.zeros(len(starts))
        sums[starts >= len(margin_w)] = 0.0  # a stretch starting past the last margin holds none
        above = np.cumsum(sums[::-1])[::-1]  # weight of the margins at or past each start
        rates = np.where(known, above[stretch] / max(float(per_unit @ joined_per_unit), 1e-300) / n, np.nan)
        chance = found_chance(rank_n, rates, n, m, k)
        found = rng.random(len(chance)) < chance  # and one draw of the fresh distractors' outcome per query
        values[i] = 100.0 * float(w @ found) / float(w.sum())
    return values
