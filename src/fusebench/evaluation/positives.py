"""Extra positives for COCO 5k: ECCV Caption (Chun et al., ECCV 2022) and CxC (Parekh et al., EACL 2021).

COCO's test split counts a retrieved image as wrong unless the caption was written for it, although other
images often fit the caption as well (false negatives). ECCV Caption had machines and humans verify extra
image-caption matches for a subset of the 5k test queries; CxC collected human similarity ratings. Both ship
in the ``eccv-caption`` package (MIT): ``eccv_caption/data/{eccv,cxc}_{caption_to_image,image_to_caption}.json``
keyed by COCO caption ids and COCO image ids, and ``coco_test_ids.npy``, the 25,000 captions of their gallery
(Karpathy's test split has 25,010: ten images have a sixth caption, left out of these galleries here).

The per-query values follow ``eccv_caption.Metrics`` exactly: R@k is 1 when any positive is within the first
k; R-Precision is the fraction of positives among the first R (R = the query's number of positives); mAP@R
(Musgrave et al. 2020) averages, over r = 1..R, the precision at r where the r-th item is a positive (0 where
it is not). Files are read from the installed package without importing it.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fusebench import DIRECTIONS, FusebenchError
from fusebench.config.schema import DATASET_KINDS, POSITIVE_SETS
from fusebench.data.corpus import Corpus
from fusebench.evaluation.comparisons import compare_values
from fusebench.evaluation.subrecords import PositiveCounts
from fusebench.runtime.checks import config_keys

WHY_IDS = ("needs COCO ids: Karpathy's dataset_coco.json gives them (cocoid per image, sentids per caption; "
           "CLIP_benchmark's coco_test_karpathy.json has no caption ids), or a manifest with integer image ids and "
           "'caption_ids' on every line")


def data_dir() -> Path:
    """The ``eccv_caption/data`` folder of the installed package."""
    spec = importlib.util.find_spec("eccv_caption")
    if spec is None or not spec.submodule_search_locations:
        raise FusebenchError("eval.positives needs the eccv-caption package, which ships the ECCV Caption and CxC "
                             "positives: pip install 'fusebench[positives]' (in a checkout: pip install -e '.[positives]').")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


@dataclass(frozen=True)
class Positives:
    """One extra-positive set on a corpus, in the corpus's index space."""

    name: str
    t2i_queries: np.ndarray  # caption indices that are queries of this set
    t2i_sets: list[np.ndarray]  # per t2i query: its positive image indices
    i2t_queries: np.ndarray  # image indices that are queries of this set
    i2t_sets: list[np.ndarray]  # per i2t query: its positive caption indices
    caption_gallery: np.ndarray  # (n_captions,) bool: the captions i2t may retrieve in this set's gallery
    left_out: int  # corpus captions outside that gallery (the sixth captions)
    skipped: int  # queries of the data file absent from a corpus marked non-standard
    unreachable: int = 0  # positives outside the gallery: counted in R (as eccv_caption does), never retrieved

    def summary(self) -> PositiveCounts:
        return PositiveCounts(t2i_queries=int(len(self.t2i_queries)), i2t_queries=int(len(self.i2t_queries)),
                              captions_left_out=self.left_out, queries_not_in_corpus=self.skipped,
                              positives_outside_gallery=self.unreachable)

    def depth(self, direction: str, ks: list[int]) -> int:
        """List length the metrics read: the largest R (ECCV) or k (CxC), plus, for i2t, the captions that
        are filtered out of the gallery."""
        sets = self.t2i_sets if direction == "t2i" else self.i2t_sets
        largest = max((len(s) for s in sets), default=1) if self.name == "eccv" else max(ks)
        return largest + (self.left_out if direction == "i2t" else 0)


def _read(path: Path) -> dict[int, list[int]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise FusebenchError(f"{path}: cannot be read as the eccv-caption data file ({err}); reinstall eccv-caption.") from None
    return {int(k): [int(v) for v in values] for k, values in data.items()}


def _subset_advice(corpus: Corpus) -> str:
    """What to do about ids the data files have and the corpus lacks, for the dataset kind that loaded it: only
    a kind that takes dataset.allow_nonstandard is told to set it."""
    if corpus.kind in DATASET_KINDS and "allow_nonstandard" in config_keys(DATASET_KINDS.get(corpus.kind).params):
        return ("Karpathy's dataset_coco.json test split has every id; a deliberate subset must be marked "
                "non-standard (dataset.allow_nonstandard=true).")
    return ("The corpus must be that whole split (its 5,000 images and their captions) under COCO's ids: the integer "
            "COCO image id as image_id (cocoid in Karpathy's dataset_coco.json) and COCO's caption annotation ids "
            "as caption_ids (its sentids); otherwise leave eval.positives empty.")


def _image_keys(corpus: Corpus) -> dict[int, int]:
    keys = {}
    for index, image_id in enumerate(corpus.image_ids):
        if not str(image_id).isdigit():
            raise FusebenchError(f"eval.positives {WHY_IDS}; image id {image_id!r} of {corpus.name} is not a COCO id.")
        keys[int(image_id)] = index
    return keys


def load_positives(name: str, corpus: Corpus, folder: Path | None = None) -> Positives:
    """The ``name`` set (eccv or cxc) mapped onto ``corpus``. An id of the data files that the corpus lacks is an
    error naming the file and the id, unless the corpus is marked non-standard (a documented subset): then its
    queries are left out and counted."""
    if name not in POSITIVE_SETS:
        raise FusebenchError(f"eval.positives: {name!r} is not valid; valid: {', '.join(POSITIVE_SETS)}.")
    if corpus.caption_ids is None:
        raise FusebenchError(f"eval.positives={name} {WHY_IDS}; the corpus {corpus.name!r} has none.")
    folder = folder or data_dir()
    images = _image_keys(corpus)
    captions = {int(c): i for i, c in enumerate(corpus.caption_ids)}
    subset = bool(corpus.meta.get("nonstandard"))
    gallery_ids = {int(c) for c in np.load(folder / "coco_test_ids.npy")}
    gallery = np.array([int(c) in gallery_ids for c in corpus.caption_ids], dtype=bool)
    skipped = unreachable = 0
    sides = {}
    for direction, file, query_index, item_index in (("t2i", "caption_to_image", captions, images),
                                                     ("i2t", "image_to_caption", images, captions)):
        path = folder / f"{name}_{file}.json"
        query_kind, item_kind = ("caption", "image") if direction == "t2i" else ("image", "caption")
        queries, sets = [], []
        for query_id, positive_ids in _read(path).items():
            # ECCV lists two caption ids outside the 25,000-caption gallery as positives: eccv_caption counts them
            # in R though no list can hold them; so do we (index -2 never matches a list entry)
            outside = {i for i in positive_ids if direction == "i2t" and i not in gallery_ids and i not in item_index}
            missing = ([(query_kind, query_id)] if query_id not in query_index else []) + \
                [(item_kind, i) for i in positive_ids if i not in item_index and i not in outside]
            if missing and not subset:
                kind, missing_id = missing[0]
                raise FusebenchError(f"{path}: {kind} id {missing_id} is not in the corpus {corpus.name!r}; "
                                     f"{name} positives are for the COCO 5k test split. {_subset_advice(corpus)}")
            if query_id not in query_index:
                skipped += 1
                continue
            kept = [item_index[i] if i in item_index else -2 for i in positive_ids if i in item_index or i in outside]
            unreachable += len(outside)
            if not any(k >= 0 for k in kept):
                skipped += 1
                continue
            queries.append(query_index[query_id])
            sets.append(np.asarray(sorted(kept), dtype=np.int64))
        order = np.argsort(queries, kind="stable")
        sides[direction] = (np.asarray(queries, dtype=np.int64)[order], [sets[i] for i in order])
    return Positives(name, *sides["t2i"], *sides["i2t"], caption_gallery=gallery, left_out=int((~gallery).sum()),
                     skipped=skipped, unreachable=unreachable)


def positive_matrix(lists: np.ndarray, sets: list[np.ndarray], keep: np.ndarray | None, depth: int) -> np.ndarray:
    """(queries, depth) bool: whether each of the first ``depth`` retrieved items is a positive of the query.
    ``lists`` are ranked item indices (-1 padding); ``keep`` (items,) bool drops items outside the gallery
    first, keeping the order of the rest."""
    lists = np.asarray(lists)
    if keep is not None:
        inside = (lists >= 0) & keep[np.clip(lists, 0, None)]
        order = np.argsort(~inside, axis=1, kind="stable")  # the kept items first, in rank order
        lists = np.where(np.take_along_axis(inside, order, 1), np.take_along_axis(lists, order, 1), -1)
    lists = lists[:, :depth]
    out = np.zeros((len(sets), depth), dtype=bool)
    for row, positives in enumerate(sets):
        width = min(depth, lists.shape[1])
        out[row, :width] = np.isin(lists[row, :width], positives) & (lists[row, :width] >= 0)
    return out


def recall_values(hits: np.ndarray, k: int) -> np.ndarray:
    """Per query, 1.0 when a positive is within the first k."""
    return hits[:, :k].any(axis=1).astype(np.float64)


def r_precision_values(hits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per query, the fraction of its R positives among its first R items."""
    within = np.arange(hits.shape[1])[None, :] < counts[:, None]
    return (hits & within).sum(axis=1) / counts


def map_at_r_values(hits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per query, mAP@R: the mean over r = 1..R of precision@r where the r-th item is a positive, else 0."""
    r = np.arange(1, hits.shape[1] + 1)[None, :]
    within = r <= counts[:, None]
    precision = np.cumsum(hits & within, axis=1) / r
    return np.where(hits & within, precision, 0.0).sum(axis=1) / counts


def query_values(positives: Positives, direction: str, lists: np.ndarray, ks: list[int]) -> dict[str, np.ndarray]:
    """Per-query values of one retriever's ranked lists for one direction (rows: the set's queries, in order).
    ECCV: mAP@R, R-P and R@1; CxC: R@k for ``ks``."""
    sets = positives.t2i_sets if direction == "t2i" else positives.i2t_sets
    keep = positives.caption_gallery if direction == "i2t" else None
    counts = np.array([len(s) for s in sets], dtype=np.int64)
    if positives.name == "eccv":
        depth = int(counts.max()) if len(counts) else 1
        hits = positive_matrix(lists, sets, keep, depth)
        return {"mAP@R": map_at_r_values(hits, counts), "R-P": r_precision_values(hits, counts),
                "R@1": recall_values(hits, 1)}
    hits = positive_matrix(lists, sets, keep, max(ks))
    return {f"R@{k}": recall_values(hits, k) for k in ks}


def summarise(values: dict[str, np.ndarray]) -> dict:
    """Per-query values as the record's percentages, with the query count."""
    n = len(next(iter(values.values()))) if values else 0
    return {**{name: float(100.0 * v.mean()) if n else None for name, v in values.items()}, "n_queries": int(n)}


def needed_depth(sets: list[Positives], ks: list[int]) -> int:
    """The list length every retriever must keep for these sets' metrics."""
    return max((p.depth(d, ks) for p in sets for d in DIRECTIONS), default=0)


def evaluate(sets: list[Positives], lists: dict, i2t_query_images: np.ndarray, caption_image: np.ndarray,
             ks: list[int], candidates: list[str], baselines: list[str], draws: int, level: float, seed: int):
    """Every retriever's extra-positive metrics ({name: {set: {direction: {metric: percent, n_queries}}}}) and
    each candidate's paired comparisons with each baseline on every one of them."""
    blocks: dict[str, dict] = {name: {} for name in lists}
    comparisons = []
    for positives in sets:
        for direction in DIRECTIONS:
            if direction == "t2i":
                rows, clusters = positives.t2i_queries, caption_image[positives.t2i_queries]
            else:
                rows, clusters = np.searchsorted(i2t_query_images, positives.i2t_queries), positives.i2t_queries
            index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            values = {name: query_values(positives, direction, lists[name][direction].ids[index].numpy(), ks)
                      for name in lists}
            for name in lists:
                blocks[name].setdefault(positives.name, {})[direction] = summarise(values[name])
            for candidate in candidates:
                for baseline in baselines:
                    for metric in values[candidate]:
                        comparisons.append(compare_values(candidate, baseline, f"{positives.name} {metric}", direction,
                                                          values[candidate][metric], values[baseline][metric],
                                                          clusters, draws, level, seed))
    return blocks, comparisons

