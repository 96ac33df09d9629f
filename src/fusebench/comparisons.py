"""Per-retriever metrics and paired fused-vs-single comparisons from per-query ranks (pure; no I/O)."""

from __future__ import annotations

import numpy as np

from fusebench.metrics import hits_at_k, mean_of_directions, summarize_ranks
from fusebench.stats import clustered_bootstrap, mcnemar_p, oracle_hits, paired_bootstrap


def retriever_metrics(ranks: dict[str, np.ndarray], ks: list[int]) -> dict:
    """``{"t2i": {...}, "i2t": {...}, "mean": {...}}`` for one retriever."""
    t2i = summarize_ranks(ranks["t2i"], ks)
    i2t = summarize_ranks(ranks["i2t"], ks)
    return {"t2i": t2i, "i2t": i2t, "mean": mean_of_directions(t2i, i2t, ks)}


def oracle_metrics(ranks_by_model: dict[str, dict[str, np.ndarray]], ks: list[int]) -> dict:
    """Recall of 'either single model right' per direction and k: the ceiling of choosing between them."""
    out = {}
    for direction in ("t2i", "i2t"):
        out[direction] = {
            f"R@{k}": float(100.0 * oracle_hits([hits_at_k(r[direction], k) for r in ranks_by_model.values()]).mean())
            for k in ks
        }
    return out


def paired_comparisons(ranks: dict[str, dict[str, np.ndarray]], candidates: list[str], baselines: list[str],
                       clusters: dict[str, np.ndarray], ks: list[int], draws: int, level: float,
                       seed: int) -> list[dict]:
    """Every candidate vs every baseline, per direction and k: gain, query and image-clustered intervals,
    wins/losses and the exact McNemar p-value."""
    rows = []
    for candidate in candidates:
        for baseline in baselines:
            for direction in ("t2i", "i2t"):
                for k in ks:
                    cand = hits_at_k(ranks[candidate][direction], k)
                    base = hits_at_k(ranks[baseline][direction], k)
                    query = paired_bootstrap(cand, base, draws=draws, level=level, seed=seed)
                    image = clustered_bootstrap(cand, base, clusters[direction], draws=draws, level=level, seed=seed)
                    rows.append({
                        "baseline": baseline, "candidate": candidate, "direction": direction, "k": k,
                        "gain": query.gain, "ci_low": query.ci_low, "ci_high": query.ci_high,
                        "wins": query.wins, "losses": query.losses,
                        "cluster_ci_low": image.ci_low, "cluster_ci_high": image.ci_high,
                        "p_value": mcnemar_p(query.wins, query.losses),
                        "baseline_recall": float(100.0 * base.mean()), "candidate_recall": float(100.0 * cand.mean()),
                        "n_queries": query.n, "level": level, "draws": draws,
                    })
    return rows
