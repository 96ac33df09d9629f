"""The distractor-scaling extrapolation (fusebench.evaluation.extrapolation): its pieces against the obvious
loops (each query's tail, both tail models, the thin queries' pool, a bootstrap draw over images and a half of
the gallery), its prediction and interval against the exact expectation in a world of scores where its assumption
holds, and its refusals. Its coverage on the simulators is measured by scripts/bench_extrapolation_coverage.py
(docs/galleries.md); the report's check and labels are in tests/test_scaling.py."""

import numpy as np
import pytest
from helpers.score_world import ScoreWorld
from scipy.stats import poisson

from fusebench.evaluation.extrapolation import (
    MIN_TAIL,
    ScalingError,
    bootstrap_recall,
    found_chance,
    fresh_rates,
    list_scores,
    lists_of,
    predict_recall,
)

CAPTION_IMAGE = np.repeat(np.arange(200), 5)


def _slow_rates(ids, scores, targets, test_images, kept, w, n, needed):
    """Both tail models' p_q the obvious way: per query, its kept distractors from its saved list, its threshold,
    excesses and scale; the pooled shape and the thin pool by double loops (the module docstring's formulas)."""
    q_count = len(ids)
    target = np.full(q_count, np.nan)
    tail, cutoff = [], []
    for q in range(q_count):
        valid = [(int(i), float(s)) for i, s in zip(ids[q], scores[q]) if i >= 0]
        cutoff.append(min(s for _, s in valid))
        for i, s in valid:
            if i == targets[q]:
                target[q] = s
        tail.append(sorted((s for i, s in valid if i >= test_images and kept[i - test_images]), reverse=True))
    full = [len(d) >= MIN_TAIL and sum(x - d[-1] for x in d[:-1]) > 0 for d in tail]
    pooled, exponential = np.full(q_count, np.nan), np.full(q_count, np.nan)
    for q in range(q_count):
        if not needed[q] or np.isnan(target[q]):
            continue
        if full[q]:
            d = tail[q]
            u, total = d[-1], sum(x - d[-1] for x in d[:-1])
            scale = total / (len(d) - 1)
            z = (target[q] - u) / scale
            shape = 0.0
            for p in range(q_count):
                if full[p]:
                    e = tail[p]
                    s_p = sum(x - e[-1] for x in e[:-1]) / (len(e) - 1)
                    shape += w[p] * sum((x - e[-1]) / s_p > z for x in e[:-1]) / (len(e) - 1)
            shape /= sum(w[p] for p in range(q_count) if full[p])
            pooled[q] = min(len(d) / n * shape, 1.0)
            exponential[q] = min(len(d) / n * max(1 - (target[q] - u) / total, 0.0) ** (len(d) - 2), 1.0)
        else:
            margin = target[q] - cutoff[q]
            count = sum(w[p] * sum(x - cutoff[p] > margin for x in tail[p]) for p in range(q_count) if not full[p])
            pooled[q] = exponential[q] = min(count / sum(w[p] for p in range(q_count) if not full[p]) / n, 1.0)
    return pooled, exponential


def _small_lists(seed: int = 0):
    """40 queries of 8 test images, lists 10 deep over 8 test images and 30 distractors: some queries with many
    distractors in their list, some thin (fewer than 3), one whose target is not in its list."""
    rng = np.random.default_rng(seed)
    targets = np.repeat(np.arange(8), 5)
    scores_all = rng.normal(0, 1, (40, 38))
    scores_all[np.arange(40), targets] += rng.uniform(0.5, 3.0, 40)
    scores_all[:12, :8] += 2.5  # test images crowd these lists: thin queries
    order = np.argsort(-scores_all, axis=1, kind="stable")[:, :10]
    ids, scores = order.astype(np.int32), np.take_along_axis(scores_all, order, axis=1)
    ids[39, ids[39] == targets[39]] = -1  # its target is not in its list (padding)
    return targets, ids, scores


def test_both_tail_models_equal_the_obvious_loops_as_measured_and_in_a_draw():
    targets, ids, scores = _small_lists()
    lists = lists_of(targets, ids, scores, 8)
    rng = np.random.default_rng(1)
    needed = rng.random(40) < 0.8
    for kept, w in ((np.ones(30, dtype=bool), np.ones(40)), (rng.random(30) < 0.5, rng.integers(0, 4, 40) * 1.0)):
        fast = fresh_rates(lists, kept, w, 30.0, needed)
        slow = _slow_rates(ids, scores, targets, 8, kept, w, 30.0, needed)
        for f, s in zip(fast, slow):
            np.testing.assert_allclose(f, s, rtol=1e-10, atol=1e-15)
        assert np.isnan(fast[0][~needed]).all() and np.isnan(fast[0][39])
    thin = [q for q in range(40) if (ids[q] >= 8).sum() < MIN_TAIL]
    assert 3 <= len(thin) < 30  # both kinds of query are exercised


def test_lists_keep_each_querys_distractors_in_order_and_its_cutoff():
    ids = np.array([[3, 7, 1, 9, -1], [9, 8, 2, 5, 6]])
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.0], [0.6, 0.5, 0.4, 0.3, 0.2]])
    lists = lists_of(np.array([1, 0]), ids, scores, 5)
    np.testing.assert_allclose(lists.scores, [[0.8, 0.6, np.nan, np.nan], [0.6, 0.5, 0.3, 0.2]])
    np.testing.assert_array_equal(lists.item, [[2, 4, -1, -1], [4, 3, 0, 1]])
    np.testing.assert_allclose(lists.cutoff, [0.6, 0.2])
    assert lists.target[0] == pytest.approx(0.7) and np.isnan(lists.target[1])


def test_each_bootstrap_draw_is_the_rates_of_its_images_and_its_half_of_the_gallery():
    """The draws equal the obvious loops fed the same random numbers: the images drawn with replacement, each
    distractor kept with chance 1/2 (the same in every list), then one uniform per query for both models."""
    targets, ids, scores = _small_lists(2)
    lists = lists_of(targets, ids, scores, 8)
    rank_n = 1 + (scores > np.where(ids == targets[:, None], scores, -np.inf).max(axis=1)[:, None]).sum(axis=1)
    rank_n[39] = 12
    fast = bootstrap_recall(lists, rank_n, targets, 30, 300, 1, 15, np.random.default_rng(7))
    rng, slow = np.random.default_rng(7), ([], [])
    for _ in range(15):
        w = np.bincount(rng.integers(0, 8, 8), minlength=8).astype(float)[targets]
        kept = rng.random(30) < 0.5
        rates = _slow_rates(ids, scores, targets, 8, kept, w, max(kept.sum(), 1), rank_n <= 1)
        uniform = rng.random(40)
        for out, r in zip(slow, rates):
            chance = [poisson.cdf(1 - rank_n[q], 270 * r[q]) if rank_n[q] <= 1 and not np.isnan(r[q]) else 0.0
                      for q in range(40)]
            out.append(100 * sum(w[q] for q in range(40) if uniform[q] < chance[q]) / w.sum())
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f, s, rtol=1e-12)
    assert len(set(fast[0])) > 5


def test_found_chance_is_the_poisson_count_of_fresh_distractors_above_the_target():
    rank = np.array([1, 1, 2, 3, 4, 1])
    rates = np.array([1e-5, 0.0, 1e-5, 2e-5, 1e-5, np.nan])
    got = found_chance(rank, rates, 1000, 101000, 3)
    lam = 100000 * rates
    np.testing.assert_allclose(got[:4], [poisson.cdf(2, lam[0]), 1.0, poisson.cdf(1, lam[2]), np.exp(-lam[3])])
    assert got[4] == 0 and got[5] == 0  # already below k; no rate
    np.testing.assert_allclose(found_chance(rank[:1], rates[:1], 1000, 101000, 1), np.exp(-lam[:1]))


def test_list_scores_take_the_target_and_the_distractors_from_a_saved_list():
    ids = np.array([[3, 7, 1, -1], [9, 8, 2, 5]])
    scores = np.array([[0.9, 0.8, 0.7, 0.0], [0.6, 0.5, 0.4, 0.3]], dtype=np.float32)
    target, distractor = list_scores(np.array([1, 0]), ids, scores, 5)
    assert target[0] == pytest.approx(0.7) and np.isnan(target[1])
    np.testing.assert_allclose(distractor, [[np.nan, 0.8, np.nan, np.nan], [0.6, 0.5, np.nan, 0.3]], rtol=1e-6)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_where_every_query_shares_one_tail_the_interval_holds_the_exact_expectation():
    """Distractor scores N(0, 0.1) for every query (the tail assumption holds: one shape, one scale), so each
    query's chance of losing its target to one more distractor is known and the expected recall at M is exact.
    The interval holds it in most of a handful of seeds, and the point prediction is close to it."""
    held, errors = 0, []
    for seed in range(5):
        world = ScoreWorld(CAPTION_IMAGE, 200, seed=seed, hard=0.0, target_mean=0.32)
        rank_n, ids, scores = world.at(1000, depth=40)
        p = predict_recall(rank_n, CAPTION_IMAGE, ids, scores, 200, CAPTION_IMAGE, 1000, 10000, draws=200)
        expected = 100 * np.mean((rank_n == 1) * np.exp(-9000 * world.true_rate()))
        held += p.low <= expected <= p.high
        errors.append(p.value - expected)
        assert p.low < p.value < p.high and p.pooled_queries == len(CAPTION_IMAGE)
    assert held >= 4, errors
    assert abs(np.mean(errors)) < 2.5, errors  # points; the interval is ~15 points wide here (1,000 queries
    #   whose R@1 falls from ~45 to ~20), the two models ~3 points above and ~5 below the expectation


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_interval_follows_the_bootstrap_draws_and_level():
    world = ScoreWorld(CAPTION_IMAGE, 200, seed=2, hard=0.0, target_mean=0.32)
    rank_n, ids, scores = world.at(1000)
    args = (rank_n, CAPTION_IMAGE, ids, scores, 200, CAPTION_IMAGE, 1000, 10000)
    wide, narrow = predict_recall(*args, draws=300, level=0.95), predict_recall(*args, draws=300, level=0.5)
    assert wide.value == narrow.value and wide.low < narrow.low < narrow.high < wide.high
    assert wide.value == pytest.approx((wide.pooled_shape + wide.exponential) / 2)
    assert wide.low <= min(wide.pooled_shape, wide.exponential) <= max(wide.pooled_shape, wide.exponential) <= wide.high
    assert predict_recall(*args, draws=300, seed=5) == predict_recall(*args, draws=300, seed=5)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_what_cannot_be_predicted_is_refused():
    world = ScoreWorld(CAPTION_IMAGE, 200, seed=0, hard=0.0)
    rank_n, ids, scores = world.at(1000)
    base = dict(rank_n=rank_n, targets=CAPTION_IMAGE, ids=ids, scores=scores, test_images=200,
                clusters=CAPTION_IMAGE, n=1000, m=10000)
    with pytest.raises(ScalingError, match="from 1,000 to 1,000"):
        predict_recall(**{**base, "m": 1000})
    with pytest.raises(ScalingError, match="from 0 to"):
        predict_recall(**{**base, "n": 0})
    with pytest.raises(ScalingError, match="no target in their saved list"):
        predict_recall(**{**base, "ids": np.where(ids == CAPTION_IMAGE[:, None], -1, ids)})
    with pytest.raises(ScalingError, match="raise eval.save_topk"):
        predict_recall(**{**base, "ids": ids[:, :2], "scores": scores[:, :2]})
    with pytest.raises(ScalingError, match="one row per query"):
        predict_recall(**{**base, "ids": ids[:5]})
    with pytest.raises(ScalingError, match="of a gallery of 500: not this run's lists"):
        predict_recall(**{**base, "n": 500})
    thin = ids.copy()
    thin[0, 2:] = -1  # a query whose list holds fewer than 3 distractors: predicted from the thin queries' pool
    assert predict_recall(**{**base, "ids": thin}, draws=50).value > 0
