"""Slow references written the obvious way, one query at a time, for the fast paths to be checked against."""

from __future__ import annotations

import numpy as np
import torch

from fusebench.fusion.combine import weighted_evidence
from fusebench.fusion.config import FusionConfig


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
                   combine="sum", **settings) -> list[tuple[int, float, int]]:
    """Fuse one query's per-model lists (ids with -1 padding, scores) with a dict, model by model, rank by rank.

    Evidence per list comes from the library's normaliser applied to that one list (checked on its own
    against exact numbers), except Borda's points, counted here; accumulation is float32 in model order, as
    the fast path does. ``settings``: further FusionConfig fields (score_map, flat_score, floor, rrf_ranks).
    """
    weights = weights or [1.0] * len(lists)
    params = {"rrf_k": rrf_k, "ddof": ddof, "rrf_weighting": rrf_weighting}  # the method's own (others at defaults)
    config = FusionConfig(method=method, fuse_on=fuse_on, params=params, combine=combine, **settings)
    candidates = {i for ids, _ in lists for i in ids if i >= 0}
    table: dict = {}
    position, offset = 0, 0
    for m, (ids, scores) in enumerate(lists):
        ids_t = torch.tensor([ids])
        scores_t = torch.tensor([scores], dtype=torch.float32)
        if method == "borda":  # n - rank + 1 over the n distinct candidates (ranx's bordafuse)
            plain = np.array([len(candidates) - r for r in range(len(ids))], dtype=np.float32)
        else:
            plain = weighted_evidence(scores_t, ids_t >= 0, config, 1.0, offset=offset)[0].numpy()
        evidence = weighted_evidence(scores_t, ids_t >= 0, config, weights[m], offset=offset)[0].numpy() \
            if method != "borda" else plain * np.float32(weights[m])
        offset += len(ids)
        for item, value, alone in zip(ids, evidence, plain):
            if item < 0:
                continue
            key = item if fuse_on == "source_object" else (m, item)
            if key not in table:
                table[key] = {"sum": np.float32(0.0), "max": np.float32(-np.inf), "parts": [], "position": position,
                              "bits": 0, "item": item}
            entry = table[key]
            entry["sum"] = np.float32(entry["sum"] + np.float32(value))
            entry["max"] = max(entry["max"], np.float32(value))
            entry["parts"].append((float(weights[m]), float(alone)))
            entry["bits"] |= 1 << m
            position += 1
    if method == "borda":  # a list gives each candidate it lacks (n - its length + 1) / 2
        for m, (ids, _) in enumerate(lists):
            held = {i for i in ids if i >= 0}
            for item in candidates - held:
                table[item].setdefault("absent", []).append(weights[m] * (len(candidates) - len(held) + 1) / 2)
    out = []
    for entry in table.values():
        if combine == "max":
            value = entry["max"]
        elif combine == "mnz":  # CombMNZ: times the number of lists holding the item
            value = np.float32(entry["sum"] * bin(entry["bits"]).count("1"))
        elif combine == "mean":  # a list lacking the item counts 0
            value = np.float32(entry["sum"] / np.float32(sum(weights)))
        elif combine in ("geometric", "harmonic"):
            held = [(w, e) for w, e in entry["parts"] if e > 0]
            total_w = sum(w for w, _ in held)
            if combine == "geometric":
                value = float(np.exp(sum(w * np.log(e) for w, e in held) / total_w)) if total_w > 0 else 0.0
            else:
                value = total_w / sum(w / e for w, e in held) if held else 0.0
        else:
            value = entry["sum"]
        value = float(value) + sum(entry.get("absent", []))
        out.append((entry["item"], value, entry["bits"], entry["position"]))
    ranked = sorted(out, key=lambda e: (-e[1], e[3]))[:final_k]
    return [(e[0], e[1], e[2]) for e in ranked]


def integer_embeddings(rng: np.random.Generator, rows: int, dim: int = 6, low: int = -2, high: int = 3) -> np.ndarray:
    """Small-integer vectors: every dot product is exact in fp32, and ties are frequent."""
    array = rng.integers(low, high, size=(rows, dim)).astype(np.float32)
    array[np.abs(array).sum(axis=1) == 0, 0] = 1.0
    return array
