"""The distractor-scaling study's extrapolation (pure; no I/O): a single model's t2i recall@k with M distractors,
predicted from its run with N < M of the same source, with a bootstrap interval.

Galleries of one source and seed nest, so the gallery of M holds the N distractors already searched plus M - N
fresh draws from the same source. A query at rank ``r_N`` with N stays within the top k with M exactly when at
most ``k - r_N`` of the fresh distractors score above its target (a tie ranks after the target). With ``p_q`` the
chance that one fresh distractor outscores query q's target, that number is Binomial(M - N, p_q) ~ Poisson(lambda_q
= (M - N) p_q), so the query is still found with probability ``P(Poisson(lambda_q) <= k - r_N)`` (``exp(-lambda_q)``
at k = r_N), and predicted recall@k is the mean over queries (0 for a query already below k: it can only fall).

**The tail (above each query's threshold).** ``p_q`` is far below 1/N for a query that no distractor beat at
N, so its own list says little about how far below. Each query's saved list at N holds its ``J_q`` highest-scoring
distractors; its threshold ``u_q`` is the lowest of them, its J_q - 1 excesses ``d - u_q`` sum to ``S_q`` (scale
``s_q = S_q / (J_q - 1)``), and the share of all N distractors above ``u_q`` is about J_q / N (a fresh draw lands
above the J-th highest of N with chance J / (N + 1)). With ``x_q = t_q - u_q`` (``t_q``: its target's score), two
models of the tail above the threshold (peaks over thresholds: a scale per query):

* **pooled shape**: one shape for every query of a model, stretched by each query's own scale:
  ``p_q = J_q / N * H(x_q / s_q)``, ``H(z) = mean_{q'} #{excesses of q' above z s_q'} / (J_q' - 1)``. Pooling is
  what lets rare hard distractors seen near a few queries at N predict those every query meets at 10 N; it reads
  the shape from excesses normalised by their own query's scale, which makes it light (too few displacements).
* **exponential per query**: ``p_q = J_q / N * (1 - x_q / S_q)^(J_q - 2)`` (0 past ``S_q``), the unbiased
  estimate of ``J_q / N * exp(-x_q / s)`` from J_q - 1 exponential excesses; blind to distractors rarer than a
  list holds, and heavy where the tail is lighter than exponential.

The prediction is the mean of the two and its interval spans both models' intervals (what the tail's form leaves
unknown is counted). A query whose list holds fewer than ``MIN_TAIL`` distractors (a test split that crowds its
list) has no scale; its threshold is its list's last score ``c_q`` (every distractor not in its list lies below
it), and such queries pool their raw excesses above their own ``c_q`` (both models):
``p_q = mean_{q' thin} #{d - c_q' > t_q - c_q} / N``.

**The interval** is a bootstrap over both samples the prediction rests on. Each draw resamples the test images
(captions of one image together: they share their target and their distractors), each query weighted by its
image's count, and the gallery: half of the N distractors, each kept with chance 1/2, the same ones in every
query's list (a half-sample of N without replacement varies about its own mean as much as the full estimate
varies about its truth, and has no ties), with N replaced by the count kept. Each query's tail is rebuilt from
its list's kept distractors, the shape pooled with the image weights, and each query's outcome drawn with its
chance (the M - N fresh distractors are one random draw too). Per model, the interval is the prediction plus the
draws' ``level`` percentiles about their own mean (a half-sample estimates at N / 2, so its own level is not the
prediction's); the interval spans both models', within [0, 100]. The ranks at N are not resampled: the gallery
of M holds the same N distractors. How often the measured value lies inside: scripts/bench_extrapolation_coverage.py,
on both simulators (docs/galleries.md). Fusions are not extrapolated: adding distractors changes how a fusion
orders the test images themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import pdtr

METHOD = "tail above each query's threshold: mean of pooled-shape and per-query exponential; bootstrap over test " \
    "images and distractors"
# The largest gallery (distractors) a prediction's interval was measured to cover from: docs/galleries.md's coverage
# table (2,000 -> 20,000 and 10,000 -> 100,000, 20 seeds each: 160 of 160 held). From 50,000 -> 500,000 it missed
# (the clustered sim, 3,000 test images: 3 of 5 seeds; 300 images: 6 of 6, the point 9-12 points high), so the
# report prints no prediction from a larger gallery (its checks, against measured values, are still shown).
COVERED_FROM = 10_000
MIN_TAIL = 3  # distractors a query's list needs for a scale (2 excesses above its threshold); fewer: a thin query


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
class Lists:
    """What the tail models read from each query's saved list at N."""

    target: np.ndarray  # (Q,) its target's score (NaN: not in its list)
    scores: np.ndarray  # (Q, L) its distractors' scores, highest first, NaN padding
    item: np.ndarray  # (Q, L) those distractors' indices among the N (0..N-1), -1 padding
    cutoff: np.ndarray  # (Q,) its list's last score (every item not in the list scores at most this)
    filled: np.ndarray  # (Q, L) ``scores`` with 0 for padding (summed by every bootstrap draw's tails)


def lists_of(targets: np.ndarray, ids: np.ndarray, scores: np.ndarray, test_images: int) -> Lists:
    """:class:`Lists` from saved t2i lists (ids: gallery items, the test images first, then the distractors)."""
    target, distractor = list_scores(targets, ids, scores, test_images)
    ids = np.asarray(ids)
    present = ~np.isnan(distractor)
    order = np.argsort(~present, axis=1, kind="stable")[:, :int(present.sum(axis=1).max(initial=0))]
    kept = np.take_along_axis(present, order, axis=1)
    cutoff = np.where(ids >= 0, np.asarray(scores, dtype=np.float64), np.inf).min(axis=1, initial=np.inf)
    listed = np.where(kept, np.take_along_axis(distractor, order, axis=1), np.nan)
    return Lists(target, listed,
                 np.where(kept, np.take_along_axis(ids, order, axis=1) - test_images, -1).astype(np.int64),
                 np.where(np.isfinite(cutoff), cutoff, np.nan), np.nan_to_num(listed))


@dataclass(frozen=True)
class Tails:
    """Each query's tail from the distractors of its list that are kept (:func:`tails`)."""

    size: np.ndarray  # (Q,) J_q: its list's distractors kept
    threshold: np.ndarray  # (Q,) the lowest of them (NaN: none)
    last: np.ndarray  # (Q,) its column in the list
    total: np.ndarray  # (Q,) S_q: the excesses' sum over the J_q - 1 others
    full: np.ndarray  # (Q,) whether it has a scale (at least MIN_TAIL kept, S_q > 0)


def tails(lists: Lists, kept: np.ndarray) -> tuple[Tails, np.ndarray]:
    """Each query's tail and which of its list's entries are kept (``kept``: per distractor, all True as measured,
    a bootstrap draw's half of the gallery)."""
    present = lists.item >= 0
    entry = present & np.asarray(kept, dtype=bool)[np.where(present, lists.item, 0)]
    q, width = entry.shape
    size = entry.sum(axis=1)
    last = width - 1 - np.argmax(entry[:, ::-1], axis=1) if width else np.zeros(q, dtype=np.int64)
    has = size > 0
    threshold = np.full(q, np.nan)
    threshold[has] = lists.scores[np.flatnonzero(has), last[has]]
    kept_sum = np.einsum("ij,ij->i", lists.filled, entry)
    total = np.where(has, kept_sum - size * np.nan_to_num(threshold), 0.0)
    return Tails(size, threshold, last, total, (size >= MIN_TAIL) & (total > 0)), entry


def survival(values: np.ndarray, weights: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Per point, the summed weight of the values strictly above it."""
    order = np.argsort(points, kind="stable")
    below = np.searchsorted(points[order], values, side="left")  # points strictly below each value
    summed = np.bincount(below, weights=weights, minlength=len(points) + 1)
    out = np.empty(len(points))
    out[order] = np.cumsum(summed[::-1])[::-1][1:]
    return out


def fresh_rates(lists: Lists, kept: np.ndarray, query_weights: np.ndarray, n: float,
                needed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pooled shape, exponential): ``p_q`` of each ``needed`` query under each tail model (NaN elsewhere; the
    module docstring's formulas) from the ``kept`` distractors (per distractor), the pooled sums weighted by
    ``query_weights``; ``n``: the distractors kept (those lists are the top of)."""
    t, entry = tails(lists, kept)
    w = np.asarray(query_weights, dtype=np.float64)
    pooled, exponential = np.full(len(w), np.nan), np.full(len(w), np.nan)
    known = needed & ~np.isnan(lists.target)
    ask = known & t.full
    rows = np.arange(len(w))
    if ask.any():
        x = lists.target[ask] - t.threshold[ask]
        scale = np.where(t.full, t.total / np.maximum(t.size - 1, 1), np.nan)
        point = x / scale[ask]
        mask = entry & t.full[:, None]
        mask[rows, t.last] = False  # the threshold itself: no excess
        with np.errstate(invalid="ignore"):
            mask &= lists.scores - t.threshold[:, None] > point.min() * scale[:, None]  # none lower counts
        r, c = np.nonzero(mask)
        z = (lists.scores[r, c] - t.threshold[r]) / scale[r]
        share = t.size[ask] / n
        pooled[ask] = share * survival(z, w[r] / (t.size[r] - 1), point) / max(float(w[t.full].sum()), 1e-300)
        exponential[ask] = share * np.clip(1.0 - x / t.total[ask], 0.0, None) ** (t.size[ask] - 2)
    ask = known & ~t.full
    if ask.any():
        margin = lists.target[ask] - lists.cutoff[ask]
        mask = entry & ~t.full[:, None]
        with np.errstate(invalid="ignore"):
            mask &= lists.scores - lists.cutoff[:, None] > margin.min()
        r, c = np.nonzero(mask)
        rate = survival(lists.scores[r, c] - lists.cutoff[r], w[r], margin)
        pooled[ask] = exponential[ask] = rate / max(float(w[~t.full].sum()), 1e-300) / n
    return np.minimum(pooled, 1.0), np.minimum(exponential, 1.0)


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

    value: float  # the mean of the two tail models' predictions
    low: float
    high: float
    pooled_queries: int  # queries with a scale (their excesses make the pooled shape)
    margins: int  # excesses in the pooled shape
    pooled_shape: float = float("nan")  # each model's own prediction
    exponential: float = float("nan")


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
    lists = lists_of(targets, ids, scores, test_images)
    within = rank_n <= k
    lost = within & np.isnan(lists.target)
    if lost.any():
        raise ScalingError(f"{int(lost.sum())} queries within the top {k} have no target in their saved list "
                           "(eval.save_topk must be at least k)")
    if lists.item.size and int(lists.item.max()) >= n:
        raise ScalingError(f"a saved list holds distractor {int(lists.item.max()) + 1:,} of a gallery of {n:,}: "
                           "not this run's lists")
    everything = np.ones(n, dtype=bool)
    t, _ = tails(lists, everything)
    if not t.full.any():
        raise ScalingError(f"no query's saved list holds {MIN_TAIL} distractors (raise eval.save_topk)")
    rates = fresh_rates(lists, everything, np.ones(len(rank_n)), n, within)
    points = [100.0 * float(found_chance(rank_n, r, n, m, k).mean()) for r in rates]
    values = bootstrap_recall(lists, rank_n, clusters, n, m, k, draws, np.random.default_rng(seed))
    tail = (1.0 - level) / 2.0
    spread = [np.quantile(v - v.mean(), [tail, 1.0 - tail]) for v in values]
    low = max(min(p + s[0] for p, s in zip(points, spread)), 0.0)  # a recall: within [0, 100]
    high = min(max(p + s[1] for p, s in zip(points, spread)), 100.0)
    return Prediction(float(np.mean(points)), float(low), float(high), int(t.full.sum()),
                      int((t.size[t.full] - 1).sum()), points[0], points[1])


def bootstrap_recall(lists: Lists, rank_n: np.ndarray, clusters: np.ndarray, n: int, m: int, k: int, draws: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``draws`` bootstrap values of predicted recall@k (percent) under each tail model (pooled shape,
    exponential). Per draw, in this order from ``rng``: the test images (``clusters``) drawn with replacement
    (``integers``: each query weighted by its image's count), each of the ``n`` distractors kept with chance 1/2
    (``random``: its copy in every list), :func:`fresh_rates` with those weights and the count kept for n, then
    one uniform per query: its outcome under each model (found when below its chance)."""
    units, cluster = np.unique(np.asarray(clusters), return_inverse=True)
    within = np.asarray(rank_n) <= k
    values = np.empty((2, draws))
    for i in range(draws):
        per_unit = np.bincount(rng.integers(0, len(units), len(units)), minlength=len(units)).astype(np.float64)
        w = per_unit[cluster]
        kept = rng.random(n) < 0.5
        rates = fresh_rates(lists, kept, w, max(float(kept.sum()), 1.0), within)
        uniform = rng.random(len(w))
        for j, r in enumerate(rates):
            values[j, i] = 100.0 * float(w[uniform < found_chance(rank_n, r, n, m, k)].sum()) / float(w.sum())
    return values[0], values[1]
