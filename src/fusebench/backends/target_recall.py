"""``search.target_recall``: an index's search-time setting (IVF ``nprobe``, HNSW ``efSearch``) chosen as the
smallest that reaches a neighbour recall target, as autofaiss chooses it.

* The queries it is chosen on: a seeded sample of the direction's queries (:func:`held_out`: 10% of them, at least
  :data:`MIN_SAMPLE` where there are that many, at most :data:`MAX_SAMPLE`; seed ``search.seed``).
* The measure: mean neighbour recall at the list depth ``k`` (:func:`fusebench.backends.quality.neighbour_recall`)
  of the index's top ``k`` against exact search's top ``k`` on those queries.
* The search (:func:`smallest_reaching`): the smallest value from ``low`` doubling until one reaches the target (or
  ``high`` fails: the target is not reached, one line naming the best recall and where), then bisection between
  the last value that failed and the first that reached it. Recall grows with either setting (IVF-Flat: a
  superset of lists can only add exact neighbours to the top k; IVF-PQ and HNSW: almost always), so this is the
  smallest value a scan of every value would give; ``tried`` keeps each value measured, for the record.

The record (:class:`~fusebench.evaluation.search_record.IndexQuality`'s ``target``): the target, the setting and
value chosen, the sample's size and recall there, and each value tried; the recall on every query is the index
quality's ``neighbour_recall``, as without a target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fusebench import FusebenchError
from fusebench.backends.quality import neighbour_recall

SHARE = 0.1  # the share of a direction's queries the setting is chosen on
MIN_SAMPLE = 300  # at least this many (every query where there are fewer)
MAX_SAMPLE = 1000  # at most this many
MAX_EF_SEARCH = 4096  # HNSW: the largest efSearch tried
# what reaches more when the largest value does not reach the target, per setting (for the message)
MORE = {"nprobe": "a larger search.pq_m, search.nbits or search.refine_factor (IVF-PQ), or search.index=ivf_flat",
        "efSearch": "a larger search.hnsw_m or search.ef_construction"}


@dataclass
class Tuned:
    setting: str  # FAISS's name: nprobe | efSearch
    value: int  # the smallest value reaching the target
    recall: float  # its mean neighbour recall on the sample
    sample: int  # the sample's queries
    tried: dict[int, float]  # every value measured -> its mean neighbour recall on the sample

    def to_json(self, target: float) -> dict:
        return {"target_recall": target, "setting": self.setting, "value": self.value, "sample_queries": self.sample,
                "sample_recall": self.recall, "tried": {str(v): r for v, r in sorted(self.tried.items())}}


def held_out(n_queries: int, seed: int) -> np.ndarray:
    """The sorted query indices the setting is chosen on: 10% of ``n_queries``, at least ``MIN_SAMPLE`` (or all
    when fewer), at most ``MAX_SAMPLE``, drawn without replacement by ``numpy.random.default_rng(seed)``."""
    size = min(n_queries, max(MIN_SAMPLE, min(MAX_SAMPLE, round(SHARE * n_queries))))
    return np.sort(np.random.default_rng(seed).choice(n_queries, size=size, replace=False))


def smallest_reaching(recall_at: Callable[[int], float], low: int, high: int, target: float
                      ) -> tuple[int | None, dict[int, float]]:
    """(the smallest value in ``low..high`` whose ``recall_at`` reaches ``target``, every value measured);
    (None, measured) when ``high`` does not reach it. Doubling from ``low``, then bisection."""
    tried: dict[int, float] = {}

    def reaches(value: int) -> bool:
        if value not in tried:
            tried[value] = recall_at(value)
        return tried[value] >= target

    failed, value = low - 1, low
    while not reaches(value):
        if value >= high:
            return None, tried
        failed, value = value, min(2 * value, high)
    while value - failed > 1:  # failed < answer <= value
        middle = (failed + value) // 2
        if reaches(middle):
            value = middle
        else:
            failed = middle
    return value, tried


def bounds(setting: str, n_lists: int | None, depth: int, n_items: int) -> tuple[int, int]:
    """The values tried: nprobe 1..nlist; efSearch from the list depth to ``MAX_EF_SEARCH`` (at most every item,
    and never below the depth: HNSW returns at most efSearch neighbours)."""
    if setting == "nprobe":
        return 1, n_lists
    return depth, max(depth, min(MAX_EF_SEARCH, n_items))


def choose(search: Callable[[np.ndarray, int], np.ndarray], queries: np.ndarray, exact_ids: np.ndarray, k: int,
           setting: str, low: int, high: int, target: float, seed: int, what: str) -> Tuned:
    """The smallest ``setting`` in ``low..high`` whose lists reach ``target`` on the held-out queries.
    ``search(queries, value)``: the index's top-``k`` ids with the setting at ``value``; ``exact_ids``: exact
    search's lists of every query (at least ``k`` deep). Unreached: a FusebenchError naming the best recall and
    where (``what``: which index, for the message)."""
    sample = held_out(len(queries), seed)
    sample_queries, sample_exact = queries[sample], np.asarray(exact_ids)[sample]

    def recall_at(value: int) -> float:
        return float(neighbour_recall(search(sample_queries, value), sample_exact, k).mean())

    value, tried = smallest_reaching(recall_at, low, high, target)
    if value is None:
        best = max(tried, key=lambda v: (tried[v], -v))
        top = " (every list)" if setting == "nprobe" and best == high else ""
        raise FusebenchError(
            f"search.target_recall={target:g} is not reached by {what}: the best neighbour recall@{k} on its "
            f"{len(sample):,} held-out queries is {tried[best]:.4f}, at {setting}={best}{top} ({setting} tried "
            f"{low}..{high}); valid: search.target_recall at most {np.floor(tried[best] * 1e4) / 1e4:g} here, or "
            f"an index that reaches more ({MORE[setting]}).")
    return Tuned(setting, value, tried[value], len(sample), tried)
