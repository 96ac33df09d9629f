"""How close an index's lists are to exact search, per query: neighbour recall at the list depth (the share of
exact search's top items the index returned) and top-1 agreement. Pure functions over id arrays (-1 = no item:
it never counts), and :func:`with_quality`, which fills both into an :class:`~fusebench.backends.faiss_index.AnnLists`'s
costs (means over each direction's queries).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fusebench.evaluation.search_record import IndexQuality

if TYPE_CHECKING:
    from fusebench.backends.faiss_index import AnnLists
    from fusebench.search.model_lists import ModelLists

BLOCK = 1024  # query rows compared at once (a block x depth x depth boolean array)


def neighbour_recall(index_ids: np.ndarray, exact_ids: np.ndarray, depth: int) -> np.ndarray:
    """Per query (float64): the share of exact search's top-min(depth, row length) ids (its valid ones, >= 0) that
    are among the index's top ``depth``; 1.0 for a query with no exact id to find. -1 never counts."""
    index_ids, exact_ids = np.asarray(index_ids), np.asarray(exact_ids)
    if len(index_ids) != len(exact_ids):
        raise ValueError(f"{len(index_ids)} index rows against {len(exact_ids)} exact rows")
    index_top = index_ids[:, :depth]
    exact_top = exact_ids[:, :min(depth, exact_ids.shape[1])]
    out = np.ones(len(exact_ids), dtype=np.float64)
    for start in range(0, len(exact_ids), BLOCK):
        exact, found = exact_top[start:start + BLOCK], index_top[start:start + BLOCK]
        valid = exact >= 0
        hit = (exact[:, :, None] == found[:, None, :]).any(axis=2) & valid
        wanted = valid.sum(axis=1)
        out[start:start + BLOCK] = np.where(wanted > 0, hit.sum(axis=1) / np.maximum(wanted, 1), 1.0)
    return out


def top1_agreement(index_ids: np.ndarray, exact_ids: np.ndarray) -> np.ndarray:
    """Per query (bool): the index's first id is exact search's first id (a -1 never agrees)."""
    index_ids, exact_ids = np.asarray(index_ids), np.asarray(exact_ids)
    if index_ids.shape[1] == 0 or exact_ids.shape[1] == 0:
        return np.zeros(len(exact_ids), dtype=bool)
    return (index_ids[:, 0] == exact_ids[:, 0]) & (exact_ids[:, 0] >= 0)


def with_quality(ann: AnnLists, exact: ModelLists) -> dict[str, IndexQuality]:
    """``ann.costs`` with each direction's mean neighbour recall (at that direction's list depth) and top-1
    agreement against ``exact``'s lists (the same queries, at least as deep)."""
    out = {}
    for direction, cost in ann.costs.items():
        index_ids, exact_ids = ann.lists[direction].ids.numpy(), exact[direction].ids.numpy()
        depth = cost.depth or index_ids.shape[1]
        recall = neighbour_recall(index_ids, exact_ids, depth)
        agree = top1_agreement(index_ids, exact_ids)
        out[direction] = replace(cost, neighbour_recall=float(recall.mean()) if recall.size else float("nan"),
                                 top1_agreement=float(agree.mean()) if agree.size else float("nan"))
    return out
