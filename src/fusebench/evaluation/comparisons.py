"""Per-retriever results and paired comparisons from per-query ranks, as run-record types (pure; no I/O)."""

from __future__ import annotations

import numpy as np

from fusebench import DIRECTIONS
from fusebench.evaluation.metrics import hits_at_k, median_rank, recall_at_k
from fusebench.evaluation.record import Comparison, DirectionMetrics, RetrieverResult
from fusebench.evaluation.stats import (
    clustered_bootstrap_values,
    mcnemar_p,
    oracle_hits,
    paired_bootstrap_values,
)


def direction_metrics(ranks: np.ndarray, ks: list[int]) -> DirectionMetrics:
    """Recall@k, median rank and query count of one direction's per-query ranks."""
    return DirectionMetrics({k: recall_at_k(ranks, k) for k in ks}, median_rank(ranks), int(len(ranks)))


def retriever_result(name: str, ranks: dict[str, np.ndarray], ks: list[int], spec: dict,
                     embedding: dict | None = None) -> RetrieverResult:
    """One retriever's record from its per-query ranks (``{"t2i": ..., "i2t": ...}``)."""
    t2i, i2t = direction_metrics(ranks["t2i"], ks), direction_metrics(ranks["i2t"], ks)
    mean = {k: (t2i.recall[k] + i2t.recall[k]) / 2 for k in ks}  # the form some published tables report
    return RetrieverResult(name, t2i, i2t, mean, spec, embedding or None)


def oracle_metrics(ranks_by_model: dict[str, dict[str, np.ndarray]], ks: list[int]) -> dict:
    """Recall of 'either single model right' per direction and k: the ceiling of choosing between them."""
    out = {}
    for direction in DIRECTIONS:
        out[direction] = {
            f"R@{k}": float(100.0 * oracle_hits([hits_at_k(r[direction], k) for r in ranks_by_model.values()]).mean())
            for k in ks
        }
    return out


def compare(candidate: str, baseline: str, candidate_ranks: dict[str, np.ndarray], baseline_ranks: dict[str, np.ndarray],
            clusters: dict[str, np.ndarray], ks: list[int], draws: int, level: float, seed: int,
            directions: tuple[str, ...] = DIRECTIONS) -> list[Comparison]:
    """One candidate's per-query ranks against one baseline's (``{"t2i": ranks, "i2t": ranks}``), per direction
    and k: gain, interval over queries and over ``clusters`` (the query's image), wins/losses, exact McNemar p.
    A direction whose query counts differ (different corpora) is left out. The one comparison path: the run
    and the sweep report both call it."""
    rows = []
    for direction in directions:
        if len(candidate_ranks[direction]) != len(baseline_ranks[direction]):
            continue
        for k in ks:
            cand, base = hits_at_k(candidate_ranks[direction], k), hits_at_k(baseline_ranks[direction], k)
            rows.append(_paired(candidate, baseline, direction, cand, base, clusters[direction], draws, level, seed,
                                k=k))
    return rows


def paired_comparisons(ranks: dict[str, dict[str, np.ndarray]], candidates: list[str], baselines: list[str],
                       clusters: dict[str, np.ndarray], ks: list[int], draws: int, level: float,
                       seed: int) -> list[Comparison]:
    """Every candidate vs every baseline of one run (:func:`compare`)."""
    return [row for candidate in candidates for baseline in baselines
            for row in compare(candidate, baseline, ranks[candidate], ranks[baseline], clusters, ks, draws, level, seed)]


def format_p(p: float | None) -> str:
    """A p-value in two significant digits, however small (0.0019, 4.7e-05), never rounded to 0.00."""
    return "-" if p is None else f"{p:.2g}"


def level_label(level: float) -> str:
    """An interval's coverage as a label: 0.95 -> '95%', 0.9 -> '90%', 0.995 -> '99.5%'."""
    return f"{100 * level:.4g}%"


def compare_values(candidate: str, baseline: str, metric: str, direction: str, candidate_values: np.ndarray,
                   baseline_values: np.ndarray, clusters: np.ndarray, draws: int, level: float,
                   seed: int) -> Comparison:
    """One candidate against one baseline on per-query values of ``metric`` (an extra-positive metric such as
    "eccv mAP@R"): gain of the means, intervals over queries and over ``clusters``, queries won/lost (higher
    value), and the exact sign test's p on them (McNemar's test for 0/1 values)."""
    return _paired(candidate, baseline, direction, candidate_values, baseline_values, clusters, draws, level, seed,
                   metric=metric)


def _paired(candidate: str, baseline: str, direction: str, cand: np.ndarray, base: np.ndarray, clusters: np.ndarray,
            draws: int, level: float, seed: int, k: int = 0, metric: str = "") -> Comparison:
    """The comparison of two retrievers' per-query outcomes (0/1 hits take the exact multinomial path)."""
    query = paired_bootstrap_values(cand, base, draws=draws, level=level, seed=seed)
    image = clustered_bootstrap_values(cand, base, clusters, draws=draws, level=level, seed=seed)
    return Comparison(candidate=candidate, baseline=baseline, direction=direction, k=k, gain=query.gain,
                      ci_low=query.ci_low, ci_high=query.ci_high, wins=query.wins, losses=query.losses,
                      cluster_ci_low=image.ci_low, cluster_ci_high=image.ci_high,
                      p_value=mcnemar_p(query.wins, query.losses), baseline_recall=float(100.0 * np.mean(base)),
                      candidate_recall=float(100.0 * np.mean(cand)), n_queries=query.n, level=level, draws=draws,
                      metric=metric)
