"""Writes one entry of each store of whole entries (lists, near-duplicates, scores, a FAISS index) into the cache
folder given as argv[1], by the stores' public calls, the same under every version of fusebench since the store
base (issue 40): run with main's code before the change, it made tests/data/stores_from_main/ (test_store_base)."""

import sys

import numpy as np

from fusebench.search.model_lists import ModelLists
from fusebench.stores.indexes import IndexStore
from fusebench.stores.lists import ListStore
from fusebench.stores.near_duplicates import NearDuplicateStore
from fusebench.stores.scores import ScoreStore

LISTS = {"kind": "lists", "format": 1, "image": "i" * 64, "text": "t" * 64, "caption_image": "c" * 64, "device": "cpu"}
DEDUP = {"test": "d" * 64, "distractors": "e" * 64, "model": "m"}
SCORES = {"image": "i" * 64, "text": "t" * 64, "caption_image": "c" * 64, "device": "cpu"}
INDEX = {"kind": "index", "format": 1, "items": "f" * 64, "n": 6, "dim": 4, "direction": "t2i", "index": "flat",
         "build": {}, "faiss": "any"}
INFO = {"model": "tiny"}


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    t2i_scores = np.sort(rng.random((5, 3), dtype=np.float32), axis=1)[:, ::-1].copy()
    i2t_scores = np.sort(rng.random((4, 3), dtype=np.float32), axis=1)[:, ::-1].copy()
    return {"t2i_ids": rng.integers(0, 4, (5, 3)).astype(np.int32), "t2i_scores": t2i_scores,
            "t2i_ranks": rng.integers(1, 4, 5).astype(np.int64), "i2t_ids": rng.integers(0, 5, (4, 3)).astype(np.int32),
            "i2t_scores": i2t_scores, "i2t_ranks": rng.integers(1, 4, 4).astype(np.int64)}


def t2i_matrix() -> np.ndarray:
    return np.arange(20, dtype=np.float32).reshape(5, 4) / 7


def dedup_values() -> np.ndarray:
    return np.array([0.25, 0.5, 0.75], dtype=np.float32)


def index_vectors() -> np.ndarray:
    return np.eye(6, 4, dtype=np.float32) + 0.5


def write(root: str) -> None:
    import faiss

    ListStore(root).get_or_compute(LISTS, 3, 4, 5, lambda depth: ModelLists.from_arrays(depth, arrays()), INFO)
    NearDuplicateStore(root).get_or_compute(DEDUP, 3, dedup_values, INFO)
    ScoreStore(root).get_or_compute(SCORES, {"t2i": (5, 4), "i2t": (4, 5)}, lambda: iter([t2i_matrix()]),
                                    np.arange(4), 1 << 20, INFO)

    def build():
        index = faiss.IndexFlatIP(4)
        index.add(index_vectors())
        return index

    IndexStore(root).get_or_build(INDEX, build, INFO)


if __name__ == "__main__":
    write(sys.argv[1])
