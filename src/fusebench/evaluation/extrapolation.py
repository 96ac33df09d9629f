"""The distractor-scaling study's math (pure; no I/O): what a query's ranks at two gallery sizes say, and what
they predict at a larger one.

Galleries nest and distractors come after the test images, so a t2i query's rank with N distractors is its rank
in the test split alone plus ``c_q``, the distractors that score strictly above its target (exact for a single
model: a distractor tied with the target ranks after it). From a run at size 0 and one at size N, ``c_q =
rank_N - rank_0``; the share of the source's distractors that beat the target, ``p_q``, has the Jeffreys
posterior Beta(c_q + 1/2, N - c_q + 1/2). With M distractors the number beating the target is then
beta-binomial, so the query is still found within k with probability
``P(rank_0 + C_M <= k)``; at k = 1, ``[rank_0 == 1] * E[(1 - p)^M] = [rank_0 == 1] * B(a, b + M) / B(a, b)``.
Predicted recall is the mean of that over queries.

The prior matters at 10x: a query no distractor beat at N has the Jeffreys posterior Beta(1/2, N + 1/2), whose
chance of surviving M = 10 N more is about (1 + M/N)^(-1/2) = 0.30, however unlikely a displacement really is;
on a population whose p spans decades the Jeffreys prediction at 10x is less than half the truth (tested).
:func:`fit_prior` fits one Beta(alpha, beta) prior to all the queries' counts (the beta-binomial maximum
likelihood, an empirical-Bayes prior: how displacement rates are spread over this model's queries), and each
query's posterior is Beta(alpha + c, beta + N - c): the same formula with the population's prior. Both are here;
reports use the fitted one and show the Jeffreys one beside it.

Fusions are not extrapolated: adding distractors changes how a fusion orders the test images themselves (its
lists, their normalisation), so its rank is not rank_0 plus a count.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from scipy.special import betaln, gammaln

JEFFREYS = (0.5, 0.5)


class ScalingError(ValueError):
    """Two runs' ranks that cannot be paired for the study; the message says why."""


def displacements(rank_0: np.ndarray, rank_n: np.ndarray) -> np.ndarray:
    """``c_q = rank_N - rank_0``: per query, the distractors that beat its target, from a single model's exact
    ranks (1-based) with no distractors and with N. ScalingError when the ranks cannot be a pair (different query
    counts, a rank below 1, or a rank that fell when distractors were added: not the same queries or model)."""
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


def posterior(counts: np.ndarray, n: int, prior: tuple[float, float] = JEFFREYS) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of the posterior Beta(alpha + c, beta + n - c) of a rate seen ``c`` times in ``n`` draws, from the
    prior Beta(alpha, beta) (default Jeffreys, Beta(1/2, 1/2))."""
    counts = np.asarray(counts, dtype=np.float64)
    if n < 0 or (counts.size and (counts.min() < 0 or counts.max() > n)):
        raise ScalingError(f"counts must lie in [0, {n}]")
    return counts + prior[0], n - counts + prior[1]


def fit_prior(counts: np.ndarray, n: int) -> tuple[float, float]:
    """The Beta(alpha, beta) prior of the queries' displacement rates that makes their ``counts`` out of ``n``
    most likely (beta-binomial maximum likelihood; alpha in [1e-3, 1e3], beta in [1e-3, 1e3 n]: with no count
    above 0 the rates are only known to be small, and beta stops at its bound). The likelihood has a long curved
    ridge (alpha / beta is pinned by the mean count, alpha only loosely), so alpha is profiled on a grid, each
    with its best beta, and the best point refined."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.size == 0 or n < 1:
        return JEFFREYS
    values, weights = np.unique(counts, return_counts=True)
    low_beta, high_beta = np.log(1e-3), np.log(1e3 * n)
    bounds = [(np.log(1e-3), np.log(1e3)), (low_beta, high_beta)]

    def minus_log_likelihood(x) -> float:
        alpha, beta = np.exp(x)
        return -float(weights @ (betaln(values + alpha, n - values + beta) - betaln(alpha, beta)))

    def best_beta(log_alpha: float) -> tuple[float, float]:
        found = minimize_scalar(lambda log_beta: minus_log_likelihood((log_alpha, log_beta)),
                                bounds=(low_beta, high_beta), method="bounded", options={"xatol": 1e-6})
        return float(found.fun), float(found.x)

    profile = [(*best_beta(log_alpha), log_alpha) for log_alpha in np.linspace(*bounds[0], 61)]
    _, log_beta, log_alpha = min(profile)
    found = minimize(minus_log_likelihood, [log_alpha, log_beta], method="Nelder-Mead", bounds=bounds,
                     options={"xatol": 1e-7, "fatol": 1e-9, "maxiter": 2000})
    alpha, beta = np.exp(found.x)
    return float(alpha), float(beta)


def survival(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """``E[(1 - p)^m]`` for p ~ Beta(a, b): the chance that none of m fresh draws beats the target,
    ``B(a, b + m) / B(a, b)``."""
    return np.exp(betaln(a, b + m) - betaln(a, b))


def beta_binomial_cdf(j: int, m: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``P(C <= j)`` for C ~ BetaBinomial(m, a, b) (per element of a and b; 0 where j < 0)."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    total = np.zeros(a.shape)
    for i in range(0, min(j, m) + 1):
        log_choose = gammaln(m + 1) - gammaln(i + 1) - gammaln(m - i + 1)
        total += np.exp(log_choose + betaln(i + a, m - i + b) - betaln(a, b))
    return np.minimum(total, 1.0)


def found_within(rank_0: np.ndarray, counts: np.ndarray, n: int, m: int, k: int,
                 prior: tuple[float, float] = JEFFREYS) -> np.ndarray:
    """Per query, the predicted chance that its target is within the top ``k`` with ``m`` distractors, from its
    rank without distractors and the ``counts`` of ``n`` distractors that beat it (:func:`displacements`)."""
    rank_0 = np.asarray(rank_0, dtype=np.int64)
    a, b = posterior(counts, n, prior)
    out = np.zeros(rank_0.shape)
    for r in np.unique(rank_0[rank_0 <= k]):
        rows = rank_0 == r
        out[rows] = beta_binomial_cdf(int(k - r), m, a[rows], b[rows])  # at r == k: survival(a, b, m)
    return out


def predicted_recall(rank_0: np.ndarray, rank_n: np.ndarray, n: int, m: int, k: int = 1,
                     prior: tuple[float, float] | str = "fitted") -> float:
    """Predicted recall@k (percent) with ``m`` distractors, from one model's exact ranks with none (``rank_0``)
    and with ``n`` (``rank_n``) on the same queries. ``prior``: "fitted" (:func:`fit_prior` on the queries that
    can still be found within k, rank_0 <= k), "jeffreys", or (alpha, beta)."""
    counts = displacements(rank_0, rank_n)
    rank_0 = np.asarray(rank_0, dtype=np.int64)
    if prior == "fitted":
        prior = fit_prior(counts[rank_0 <= k], n)
    elif prior == "jeffreys":
        prior = JEFFREYS
    return float(100.0 * found_within(rank_0, counts, n, m, k, prior).mean())
