import numpy as np
import pytest
from helpers.tiers import fast_first

from fusebench.evaluation.stats import clustered_bootstrap, mcnemar_p, oracle_hits, paired_bootstrap


def _paired_sample(rng, n, p_win, p_loss, p_both=0.5):
    """Per-query hits with P(candidate only) = p_win, P(baseline only) = p_loss: true gain 100 (p_win - p_loss)."""
    u = rng.random(n)
    cand = (u < p_win) | ((u >= p_win + p_loss) & (u < p_win + p_loss + p_both))
    base = ((u >= p_win) & (u < p_win + p_loss)) | ((u >= p_win + p_loss) & (u < p_win + p_loss + p_both))
    return cand, base


def test_gain_wins_losses_exact():
    cand = np.array([1, 1, 0, 0, 1, 1, 0, 1], dtype=bool)
    base = np.array([1, 0, 1, 0, 0, 1, 0, 0], dtype=bool)
    result = paired_bootstrap(cand, base, draws=500, seed=3)
    assert (result.wins, result.losses, result.n) == (3, 1, 8)
    assert result.gain == pytest.approx(25.0)
    assert result.ci_low <= result.gain <= result.ci_high


def test_seeded_and_deterministic():
    rng = np.random.default_rng(0)
    cand, base = _paired_sample(rng, 500, 0.1, 0.05)
    assert paired_bootstrap(cand, base, seed=4) == paired_bootstrap(cand, base, seed=4)


def test_interval_matches_index_resampling_reference():
    """The multinomial shortcut has the distribution of the obvious bootstrap that resamples query indices."""
    rng = np.random.default_rng(1)
    cand, base = _paired_sample(rng, 800, 0.12, 0.07)
    draws = 4000
    idx = np.random.default_rng(9).integers(0, 800, size=(draws, 800))
    slow = 100.0 * (cand[idx].mean(axis=1) - base[idx].mean(axis=1))
    slow_low, slow_high = np.quantile(slow, [0.025, 0.975])
    fast = paired_bootstrap(cand, base, draws=draws, seed=2)
    assert fast.ci_low == pytest.approx(slow_low, abs=0.3)
    assert fast.ci_high == pytest.approx(slow_high, abs=0.3)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("n", fast_first([200, 2000]))
def test_interval_covers_true_gain_about_95_percent(n):
    rng = np.random.default_rng(n)
    p_win, p_loss = 0.10, 0.06
    truth = 100 * (p_win - p_loss)
    replicates = 600
    covered = 0
    for rep in range(replicates):
        cand, base = _paired_sample(rng, n, p_win, p_loss)
        result = paired_bootstrap(cand, base, draws=2000, seed=rep)
        covered += result.ci_low <= truth <= result.ci_high
    # binomial sd of the coverage estimate is ~0.9 points at 600 replicates
    assert 0.92 <= covered / replicates <= 0.975


def test_clustered_equals_paired_distribution_for_singleton_clusters():
    rng = np.random.default_rng(5)
    cand, base = _paired_sample(rng, 1000, 0.1, 0.05)
    a = paired_bootstrap(cand, base, draws=3000, seed=1)
    b = clustered_bootstrap(cand, base, np.arange(1000), draws=3000, seed=1)
    assert (a.gain, a.wins, a.losses) == (b.gain, b.wins, b.losses)
    assert b.ci_low == pytest.approx(a.ci_low, abs=0.4) and b.ci_high == pytest.approx(a.ci_high, abs=0.4)


def test_clustered_matches_cluster_resampling_reference_and_is_wider_when_correlated():
    rng = np.random.default_rng(6)
    n_images, per = 300, 5
    clusters = np.repeat(np.arange(n_images), per)
    # all captions of an image share the outcome: strongly correlated within clusters
    image_outcome = rng.choice(3, size=n_images, p=[0.12, 0.06, 0.82])
    cand = np.repeat(image_outcome == 0, per)
    base = np.repeat(image_outcome == 1, per)
    clustered = clustered_bootstrap(cand, base, clusters, draws=4000, seed=0)
    naive = paired_bootstrap(cand, base, draws=4000, seed=0)
    assert clustered.ci_high - clustered.ci_low > 1.8 * (naive.ci_high - naive.ci_low)
    pick = np.random.default_rng(3).integers(0, n_images, size=(4000, n_images))
    net = (cand.astype(int) - base).reshape(n_images, per).sum(axis=1)
    slow = 100.0 * net[pick].sum(axis=1) / (per * n_images)
    low, high = np.quantile(slow, [0.025, 0.975])
    assert clustered.ci_low == pytest.approx(low, abs=0.5) and clustered.ci_high == pytest.approx(high, abs=0.5)


def test_mcnemar_exact_values():
    assert mcnemar_p(10, 0) == pytest.approx(2 * 0.5**10)
    assert mcnemar_p(5, 5) == pytest.approx(1.0)
    assert mcnemar_p(0, 0) == 1.0


def test_oracle_is_either_right():
    assert oracle_hits([np.array([1, 0, 0, 1]), np.array([0, 0, 1, 1])]).tolist() == [True, False, True, True]


@pytest.mark.parametrize("bad", [
    (np.array([True, False]), np.array([True])),
    (np.array([], dtype=bool), np.array([], dtype=bool)),
    (np.ones((2, 2), dtype=bool), np.ones((2, 2), dtype=bool)),
])
def test_bad_inputs_raise(bad):
    with pytest.raises(ValueError):
        paired_bootstrap(*bad)


def test_result_reads_as_mapping_too():
    result = paired_bootstrap(np.array([1, 0, 1], dtype=bool), np.array([0, 0, 1], dtype=bool), draws=50)
    assert result["gain"] == result.gain and result["wins"] == 1 and result["losses"] == 0
    assert set(result.as_dict()) >= {"gain", "ci_low", "ci_high", "wins", "losses"}
