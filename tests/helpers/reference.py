"""Slow references written the obvious way, one query at a time, for the fast paths to be checked against."""

from __future__ import annotations

import numpy as np
import torch

from fusebench.fusion import FusionConfig, weighted_evidence


def stable_order(row_scores) -> list[int]:
    """Item indices by descending score, ties by ascending index."""
    return sorted(range(len(row_scores)), key=lambda j: (-row_scores[j], j))


def t2i_rank(row_scores, target: int) -> int:
    return stable_order(row_scores).index(target) + 1


def i2t_rank(column_scores, correct: set[int]) -> int:
    for position, caption in enumerate(stable_order(column_scores), start=1):
        if caption in correct:
            return position
    raise AssertionError("no correct caption")


def fuse_one_query(lists: list[tuple[list[int], list[float]]], method: str, fuse_on: str, final_k: int,
                   weights=None, rrf_k=60.0, ddof=0, rrf_weighting="multiply",
                   combine="sum") -> list[tuple[int, float, int]]:
    """Fuse one query's per-model lists (ids with -1 padding, scores) with a dict, model by model, rank by rank.

    Evidence per list comes from the library's normaliser applied to that one list (checked on its own
    against exact numbers); accumulation is float32 in model order, as the fast path does.
    """
    weights = weights or [1.0] * len(lists)
    table: dict = {}
    position = 0
    for m, (ids, scores) in enumerate(lists):
        ids_t = torch.tensor([ids])
        scores_t = torch.tensor([scores], dtype=torch.float32)
        config = FusionConfig(method=method, fuse_on=fuse_on, rrf_k=rrf_k, ddof=ddof, rrf_weighting=rrf_weighting,
                              combine=combine)
        evidence = weighted_evidence(scores_t, ids_t >= 0, config, weights[m])[0].numpy()
        for item, value in zip(ids, evidence):
            if item < 0:
                continue
            key = item if fuse_on == "source_object" else (m, item)
            if key not in table:
                table[key] = [np.float32(-np.inf if combine == "max" else 0.0), position, 0, item]
            if combine == "max":
                table[key][0] = max(table[key][0], np.float32(value))
            else:
                table[key][0] = np.float32(table[key][0] + np.float32(value))
            table[key][2] |= 1 << m
            position += 1
    if combine == "mnz":  # CombMNZ: times the number of lists holding the item
        for entry in table.values():
            entry[0] = np.float32(entry[0] * bin(entry[2]).count("1"))
    ranked = sorted(table.values(), key=lambda e: (-e[0], e[1]))[:final_k]
    return [(e[3], float(e[0]), e[2]) for e in ranked]


def integer_embeddings(rng: np.random.Generator, rows: int, dim: int = 6, low: int = -2, high: int = 3) -> np.ndarray:
    """Small-integer vectors: every dot product is exact in fp32, and ties are frequent."""
    array = rng.integers(low, high, size=(rows, dim)).astype(np.float32)
    array[np.abs(array).sum(axis=1) == 0, 0] = 1.0
    return array
