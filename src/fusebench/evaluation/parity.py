"""An engine's fused lists against fusebench's exact preset of that engine, query by query (pure; no I/O).

Two lists agree at depth k when their first k ids are the same, in order. A query whose lists differ is
*explained* by ties when, at every position where they differ, the engine's item has the same exact-preset fused
score as the item fusebench put there (to float rounding, :data:`RTOL`): the engine ordered tied items its own way,
or summed in another float width. Anything else (an item the exact preset does not rank there) is unexplained: an
engine rule to document, or a bug in the preset.
"""

from __future__ import annotations

import numpy as np

from fusebench.evaluation.search_record import Parity

RTOL = 1e-5  # float rounding: engines sum in float64 or float32, in their own order
ATOL = 1e-9


def identical_at(a_ids: np.ndarray, b_ids: np.ndarray, k: int) -> np.ndarray:
    """Per query: the first ``k`` ids are the same, in order (-1 padding compared like an id)."""
    k = min(k, a_ids.shape[1], b_ids.shape[1])
    return np.all(a_ids[:, :k] == b_ids[:, :k], axis=1)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) + ATOL


def tie_explained(engine_ids: np.ndarray, exact_ids: np.ndarray, exact_scores: np.ndarray, k: int) -> bool:
    """One query: every position < k where the lists differ holds, in the engine's list, an item whose exact-preset
    score equals the exact list's score at that position (both lists cut to ``k``)."""
    score_of = {int(i): float(s) for i, s in zip(exact_ids, exact_scores) if i >= 0}
    for position in range(min(k, len(engine_ids), len(exact_ids))):
        theirs, ours = int(engine_ids[position]), int(exact_ids[position])
        if theirs == ours:
            continue
        if theirs < 0 or ours < 0 or theirs not in score_of:
            return False
        if not _close(score_of[theirs], float(exact_scores[position])):
            return False
    return True


def parity(engine_ids: np.ndarray, exact_ids: np.ndarray, exact_scores: np.ndarray, k: int = 10
           ) -> tuple[Parity, np.ndarray, np.ndarray]:
    """The engine's lists against the exact preset's: the :class:`Parity` block, the queries whose top ``k``
    differ, and for each of those whether ties explain it."""
    same1 = identical_at(engine_ids, exact_ids, 1)
    samek = identical_at(engine_ids, exact_ids, k)
    differ = np.flatnonzero(~samek)
    explained = np.array([tie_explained(engine_ids[q], exact_ids[q], exact_scores[q], k) for q in differ], dtype=bool)
    n = len(engine_ids)
    block = Parity(n_queries=int(n), identical_top1=float(same1.mean()) if n else 1.0,
                   identical_top10=float(samek.mean()) if n else 1.0, differ=int(differ.size),
                   explained=int(explained.sum()))
    return block, differ, explained


def difference_rows(direction: str, differ: np.ndarray, explained: np.ndarray, engine_ids: np.ndarray,
                    engine_scores: np.ndarray, exact_ids: np.ndarray, exact_scores: np.ndarray, k: int = 10
                    ) -> list[dict]:
    """One JSON-ready row per differing query: both top-``k`` lists with their scores and whether ties explain it
    (the run dir's ``engine_differences.jsonl``, for the notebook)."""
    rows = []
    for q, tie in zip(differ.tolist(), explained.tolist()):
        rows.append({"direction": direction, "query": int(q), "explained_by_ties": bool(tie),
                     "engine_ids": engine_ids[q, :k].tolist(), "exact_ids": exact_ids[q, :k].tolist(),
                     "engine_scores": [float(x) for x in engine_scores[q, :k]],
                     "exact_scores": [float(x) for x in exact_scores[q, :k]]})
    return rows
