"""The distractor-scaling extrapolation (fusebench.evaluation.extrapolation): its pieces against the obvious
loops, its prediction against the exact expectation in a world of scores where its assumption holds, its
coverage on the simulator's own distractors (10k -> 100k, 100k -> 1M), a world where the assumption fails (the
report's check catches it: tests/test_scaling.py), and its refusals."""

import numpy as np
import pytest
from helpers.score_world import ScoreWorld, sim_lists
from scipy.stats import poisson

from fusebench.config.schema import SimDatasetConfig
from fusebench.config.specs import SimParams
from fusebench.data.simulated import make_sim_corpus
from fusebench.evaluation.extrapolation import (
    ScalingError,
    bootstrap_recall,
    found_chance,
    fresh_rates,
    list_scores,
    margins,
    predict_recall,
)

CAPTION_IMAGE = np.repeat(np.arange(200), 5)


def test_pooled_rates_equal_the_obvious_double_loop():
    rng = np.random.default_rng(0)
    d = np.sort(rng.normal(size=(40, 9)), axis=1)[:, ::-1].copy()
    d[rng.random(d.shape) < 0.15] = np.nan  # test images in the lists
    d[3] = np.nan
    d[4, 1:] = np.nan  # too few distractors to join
    pool = margins(d)
    targets = rng.normal(0.5, 1.0, 40)
    target_margin = targets - pool.threshold
    weights = rng.integers(0, 4, 40).astype(float)
    n = 1000
    expected = np.full(40, np.nan)
    joined = [q for q in range(40) if np.sum(d[q] > np.nanmin(d[q], initial=np.inf, where=~np.isnan(d[q]))) >= 2]
    for q in range(40):
        if np.isnan(target_margin[q]):
            continue
        rises = {p: d[p][~np.isnan(d[p])] - np.nanmin(d[p]) for p in joined}  # the threshold itself: no margin
        total = sum(weights[p] * np.sum((rises[p] > 0) & (rises[p] > target_margin[q])) for p in joined)
        expected[q] = total / sum(weights[p] for p in joined) / n
    assert set(np.flatnonzero(np.isnan(pool.threshold))) == {3, 4}
    np.testing.assert_allclose(fresh_rates(pool, target_margin, n, weights), expected, rtol=1e-12)
    np.testing.assert_allclose(fresh_rates(pool, target_margin, n), fresh_rates(pool, target_margin, n, np.ones(40)))


def test_each_bootstrap_draw_is_the_weighted_rates_of_its_images():
    """The fast draws (margins summed per stretch) equal fresh_rates and found_chance with each draw's image weights,
    computed the obvious way from the same random numbers."""
    world = ScoreWorld(CAPTION_IMAGE, 200, seed=3, hard=0.0, target_mean=0.3)
    rank_n, ids, scores = world.at(1000)
    target, distractor = list_scores(CAPTION_IMAGE, ids, scores, 200)
    pool = margins(distractor)
    target_margin = np.where(rank_n <= 2, target - pool.threshold, np.nan)
    fast = bootstrap_recall(pool, target_margin, rank_n, CAPTION_IMAGE, 1000, 10000, 2, 25, np.random.default_rng(7))
    rng, slow = np.random.default_rng(7), []
    for _ in range(25):
        per_image = np.bincount(rng.integers(0, 200, 200), minlength=200).astype(float)
        w = per_image[CAPTION_IMAGE]
        chance = found_chance(rank_n, fresh_rates(pool, target_margin, 1000, w), 1000, 10000, 2)
        slow.append(100 * float(w @ (rng.random(len(chance)) < chance)) / w.sum())
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    assert len(set(fast)) > 5


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


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_where_every_query_shares_one_tail_the_prediction_is_the_exact_expectation(seed):
    """Distractor scores N(0, 0.1) for every query: the assumption holds, and each query's chance of losing its
    target to one more distractor is known, so the expected recall at M is exact."""
    world = ScoreWorld(CAPTION_IMAGE, 200, seed=seed, hard=0.0, target_mean=0.32)
    rate = world.true_rate()
    for n, m in ((1000, 10000), (5000, 50000)):
        rank_n, ids, scores = world.at(n)
        p = predict_recall(rank_n, CAPTION_IMAGE, ids, scores, 200, CAPTION_IMAGE, n, m, draws=400)
        expected = 100 * np.mean((rank_n == 1) * np.exp(-(m - n) * rate))
        assert abs(p.value - expected) < 0.35 * (p.high - p.low), (n, m, p, expected)
        assert p.low <= expected <= p.high and p.pooled_queries == len(CAPTION_IMAGE)
    rank_n, ids, scores = world.at(1000)
    p = predict_recall(rank_n, CAPTION_IMAGE, ids, scores, 200, CAPTION_IMAGE, 1000, 10000, draws=400)
    assert p.low <= 100 * np.mean(world.at(10000, depth=1)[0] == 1) <= p.high  # and the measured value


def test_the_interval_follows_the_bootstrap_draws_and_level():
    world = ScoreWorld(CAPTION_IMAGE, 200, seed=2, hard=0.0, target_mean=0.32)
    rank_n, ids, scores = world.at(1000)
    args = (rank_n, CAPTION_IMAGE, ids, scores, 200, CAPTION_IMAGE, 1000, 10000)
    wide, narrow = predict_recall(*args, draws=300, level=0.95), predict_recall(*args, draws=300, level=0.5)
    assert wide.value == narrow.value and wide.low < narrow.low < narrow.high < wide.high
    assert predict_recall(*args, draws=300, seed=5) == predict_recall(*args, draws=300, seed=5)


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
    with pytest.raises(ScalingError, match="fewer than 3 distractors"):
        thin = ids.copy()
        thin[0, 2:] = -1
        predict_recall(**{**base, "ids": thin})
    with pytest.raises(ScalingError, match="raise eval.save_topk"):
        predict_recall(**{**base, "ids": ids[:, :2], "scores": scores[:, :2]})
    with pytest.raises(ScalingError, match="one row per query"):
        predict_recall(**{**base, "ids": ids[:5]})


SIM_MODEL = SimParams(dim=128, image_noise=0.22, text_noise=0.22, seed=1, score_scale=0.3, score_shift=0.0)


CLUSTERED = dict(structure="clustered", caption_noise=1.65, shared_caption_noise=0.36)  # dataset=sim_clustered's
KNOWN_MISS = pytest.mark.xfail(strict=True, reason=(
    "the pooled-margin tail under-predicts 10k -> 100k on the clustered sim by 5-7 points (measured 58.5, "
    "predicted 51.3 [47, 56]): its hard distractors score relative to their own image's target, not to the "
    "query's threshold (docs/galleries.md); a sweep's own check then withholds the prediction past it"))


@pytest.mark.slow  # 1,000,000 simulated distractors searched exactly (~20-50 s per structure)
@pytest.mark.parametrize("structure, n, m", [
    ("isotropic", 10000, 100000), ("isotropic", 100000, 1000000),
    pytest.param("clustered", 10000, 100000, marks=KNOWN_MISS), ("clustered", 100000, 1000000)])
def test_on_the_simulator_each_measured_size_lies_inside_the_interval_predicted_from_the_last(structure, n, m):
    lists = _sim_lists(structure)
    targets = np.asarray(_sim_corpus(structure).caption_image)
    rank_n, ids, scores = lists[n]
    p = predict_recall(rank_n, targets, ids, scores, 300, targets, n, m)
    measured = 100 * np.mean(lists[m][0] == 1)
    assert measured < 100 * np.mean(rank_n == 1) - 10  # a real fall, not a flat line any interval covers
    assert p.low <= measured <= p.high, (structure, n, m, p, measured)


def _sim_corpus(structure: str):
    return make_sim_corpus(SimDatasetConfig(n_images=300, n_captions=1500,
                                            **(CLUSTERED if structure == "clustered" else {})))


_LISTS: dict = {}


def _sim_lists(structure: str) -> dict:
    """The sim model's lists 50 deep (as experiment=distractor_scaling saves them) at 10k, 100k and 1M, once per
    structure."""
    if structure not in _LISTS:
        _LISTS[structure] = sim_lists(_sim_corpus(structure), SIM_MODEL, [10000, 100000, 1000000], depth=50)
    return _LISTS[structure]
