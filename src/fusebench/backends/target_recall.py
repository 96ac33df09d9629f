"""``search.target_recall``: an index's search-time setting (IVF ``nprobe``, HNSW ``efSearch``) chosen as the
smallest that reaches a neighbour recall target, as autofaiss chooses it, on queries outside every reported metric.

* The queries it is chosen on (:class:`TuningQueries`, gathered by the app before the search): the dataset's other
  split (Karpathy's ``val`` for COCO and Flickr, a fresh ``val`` draw of a sim corpus: ``search.tune_queries:
  split``), or, where the dataset has none (a manifest, arrays handed to the API), a seeded sample of the test
  images with their captions held out of every reported metric (``held_out``; the record gives its size).
  ``search.tune_images`` images: their captions ask the t2i tuning queries, the images themselves the i2t ones.
* The measure: neighbour recall at the list depth ``k`` (:func:`fusebench.backends.quality.neighbour_recall`) of
  the index's top ``k`` against exact search's top ``k`` over the same items (:func:`exact_top`), per query.
* The rule: a value reaches the target when the one-sided 95% lower bound of its mean recall over the tuning
  queries (:func:`lower_bound`: mean - 1.645 sd / sqrt(n)) does, so that the reported queries, a different sample
  of the same kind, reach it too rather than falling just under it (the recall on every reported query is the
  index quality's ``neighbour_recall``, printed beside the target).
* The search (:func:`smallest_reaching`): the smallest value from ``low`` doubling until one reaches the target (or
  ``high`` fails: the target is not reached, one line naming the best recall and where), then bisection between
  the last value that failed and the first that reached it. Recall grows with either setting (IVF-Flat: a
  superset of lists can only add exact neighbours to the top k; IVF-PQ and HNSW: almost always), so this is the
  smallest value a scan of every value would give; ``tried`` keeps each value measured, for the record.

The record (:class:`~fusebench.evaluation.search_record.IndexQuality`'s ``target``, :meth:`Tuned.to_json`): the
target, the setting and value chosen, where the tuning queries came from and how many, their recall and its lower
bound, each value tried, and the seconds the tuning took (its exact reference search and every trial search).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from fusebench import FusebenchError
from fusebench.backends.quality import neighbour_recall
from fusebench.evaluation.search_record import tuning_words
from fusebench.search.exact import float_rows, merge_topk, similarity, topk_stable

Z_ONE_SIDED_95 = 1.6449  # the standard normal's 95th percentile
MAX_EF_SEARCH = 4096  # HNSW: the largest efSearch tried
EXACT_BLOCK = 16384  # items per block of the tuning queries' exact search
# what reaches more when the largest value does not reach the target, per setting (for the message)
MORE = {"nprobe": "a larger search.pq_m, search.nbits or search.refine_factor (IVF-PQ), or search.index=ivf_flat",
        "efSearch": "a larger search.hnsw_m or search.ef_construction"}


@dataclass
class TuningQueries:
    """The queries a search-time setting is chosen on, outside every reported metric: each model's rows per
    direction (unit rows of that model, like its test queries) and where they come from."""

    source: str  # split | held_out (evaluation.search_record.TUNING_SOURCES)
    split: str  # the dataset's split the queries come from (held_out: the test split's name, "test")
    n_images: int  # their images (the i2t queries)
    n_captions: int  # their captions (the t2i queries)
    rows: dict[str, dict[str, np.ndarray]]  # model -> direction -> query rows

    def describe(self) -> dict:
        return {"source": self.source, "split": self.split, "images": self.n_images, "captions": self.n_captions}

    def words(self, direction: str) -> str:
        """'1,000 captions of the dataset's val split' (what a direction's tuning queries are)."""
        return tuning_words(self.describe(), direction)


@dataclass
class Tuned:
    setting: str  # FAISS's name: nprobe | efSearch
    value: int  # the smallest value reaching the target
    recall: float  # its mean neighbour recall on the tuning queries
    low: float  # its one-sided 95% lower bound (what reached the target)
    sample: int  # the tuning queries
    tried: dict[int, tuple[float, float]]  # every value measured -> (mean recall, lower bound)
    seconds: float  # the tuning's searches: exact reference and every value tried
    queries: dict  # TuningQueries.describe()

    def to_json(self, target: float) -> dict:
        return {"target_recall": target, "setting": self.setting, "value": self.value, "queries": self.queries,
                "sample_queries": self.sample, "sample_recall": self.recall, "sample_recall_low": self.low,
                "rule": "smallest value whose one-sided 95% lower bound of the mean recall reaches the target",
                "seconds": round(self.seconds, 3),
                "tried": {str(v): {"recall": r, "low": lo} for v, (r, lo) in sorted(self.tried.items())}}


def lower_bound(per_query: np.ndarray) -> float:
    """The one-sided 95% normal lower bound of the mean of ``per_query`` (mean - 1.645 sd / sqrt(n), sd with
    n - 1); the mean itself for a single value."""
    values = np.asarray(per_query, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return mean
    return mean - Z_ONE_SIDED_95 * float(values.std(ddof=1)) / math.sqrt(len(values))


def exact_top(queries: np.ndarray, blocks: Iterable[tuple[int, np.ndarray]], k: int,
              update: Callable[[int], None] | None = None) -> np.ndarray:
    """Exact search's top ``k`` item ids of each query row (int64, -1 past the items), over items given as
    ``(first id, rows)`` blocks in ascending id order: cosine on unit rows, ties to the lower id (the exact
    path's rule). ``update(rows)`` after each block (a progress bar over the items)."""
    q = float_rows(queries)
    best: tuple | None = None
    for first, rows in blocks:
        values, ids = topk_stable(similarity(q, float_rows(rows)), min(k, len(rows)))
        found = (values, ids + first)
        best = found if best is None else merge_topk([best, found], k)
        if update is not None:
            update(len(rows))
    if best is None:
        return np.full((len(queries), k), -1, dtype=np.int64)
    ids = best[1].numpy().astype(np.int64)
    return ids if ids.shape[1] == k else np.hstack([ids, np.full((len(ids), k - ids.shape[1]), -1, np.int64)])


def array_blocks(items: np.ndarray, size: int = EXACT_BLOCK):
    """``items`` as :func:`exact_top`'s blocks."""
    for start in range(0, len(items), size):
        yield start, items[start:start + size]


def most_tries(low: int, high: int) -> int:
    """The most values :func:`smallest_reaching` measures in ``low..high`` (doubling, then bisecting the last
    doubling's interval): the total of a progress bar over its tries, which ends early when it stops sooner."""
    doublings = max(0, math.ceil(math.log2(max(high, 1) / max(low, 1))))
    return doublings + 1 + math.ceil(math.log2(max(1, high - low + 1)))


def smallest_reaching(reaches: Callable[[int], bool], low: int, high: int) -> int | None:
    """The smallest value in ``low..high`` for which ``reaches`` holds (monotone), or None when ``high`` does not:
    doubling from ``low``, then bisection."""
    failed, value = low - 1, low
    while not reaches(value):
        if value >= high:
            return None
        failed, value = value, min(2 * value, high)
    while value - failed > 1:  # failed < answer <= value
        middle = (failed + value) // 2
        if reaches(middle):
            value = middle
        else:
            failed = middle
    return value


def bounds(setting: str, n_lists: int | None, depth: int, n_items: int) -> tuple[int, int]:
    """The values tried: nprobe 1..nlist; efSearch from the list depth to ``MAX_EF_SEARCH`` (at most every item,
    and never below the depth: HNSW returns at most efSearch neighbours)."""
    if setting == "nprobe":
        return 1, n_lists
    return depth, max(depth, min(MAX_EF_SEARCH, n_items))


def choose(search: Callable[[np.ndarray, int], np.ndarray], queries: np.ndarray, exact_ids: np.ndarray, k: int,
           setting: str, low: int, high: int, target: float, what: str, source: dict,
           exact_seconds: float = 0.0, update: Callable[[int], None] | None = None) -> Tuned:
    """The smallest ``setting`` in ``low..high`` whose lists reach ``target`` on the tuning ``queries`` (the lower
    bound rule above). ``search(queries, value)``: the index's top-``k`` ids with the setting at ``value``;
    ``exact_ids``: exact search's lists of those queries (at least ``k`` deep; ``exact_seconds`` it took).
    ``update(1)`` after each value measured (a bar of :func:`most_tries` steps).
    Unreached: a FusebenchError naming the best recall and where (``what``: which index, for the message)."""
    started = time.perf_counter()
    tried: dict[int, tuple[float, float]] = {}

    def reaches(value: int) -> bool:
        if value not in tried:
            per_query = neighbour_recall(search(queries, value), exact_ids, k)
            tried[value] = (float(per_query.mean()), lower_bound(per_query))
            if update is not None:
                update(1)
        return tried[value][1] >= target

    value = smallest_reaching(reaches, low, high)
    if value is None:
        best = max(tried, key=lambda v: (tried[v][1], -v))
        top = " (every list)" if setting == "nprobe" and best == high else ""
        raise FusebenchError(
            f"search.target_recall={target:g} is not reached by {what}: on its {len(queries):,} tuning queries the "
            f"best neighbour recall@{k} is {tried[best][0]:.4f} (one-sided 95% lower bound {tried[best][1]:.4f}), "
            f"at {setting}={best}{top} ({setting} tried {low}..{high}); valid: search.target_recall at most "
            f"{np.floor(tried[best][1] * 1e4) / 1e4:g} here, or an index that reaches more ({MORE[setting]}).")
    seconds = exact_seconds + time.perf_counter() - started
    return Tuned(setting, value, tried[value][0], tried[value][1], len(queries), tried, seconds, source)
