"""The list store: each model's ranked lists (both directions, exact ranks), computed once per model x
corpus x depth and reused by every later job, in this process or another.

An entry's key is the SHA-256 of what determines its lists: the model's normalised image and text
embeddings (their bytes), which image each caption describes, the compute device type and the store
format. The depth is not in the key: an entry holds the deepest lists asked for so far, and a job that
needs deeper lists recomputes the entry at its depth. Layout, beside the embedding cache:

    CACHE/lists/ab/abcdef.../lists.npz    t2i_ids, t2i_scores, t2i_ranks, i2t_ids, i2t_scores, i2t_ranks
    CACHE/lists/ab/abcdef.../meta.json    key material, depth, shapes, bytes and sha256 of lists.npz
    CACHE/lists/ab/abcdef....lock         held while the entry is read or computed (one job computes it)

Guarantees as for embeddings: atomic writes (meta.json last, so an entry with meta.json is complete), a
lock per entry, a checksum verified when a process first reads the file; an entry that is not provably the
one asked for (its meta.json records another key or other inputs: ``entries.entry_meta``), truncated, corrupt,
of another format or holding a directory where a file belongs is reported, removed and recomputed, never
used; a file where a folder belongs (the entry's, ``lists/ab/`` or ``lists/`` itself) is reported and removed
(``entries.store_folders``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fusebench import DIRECTIONS
from fusebench.runtime import state
from fusebench.stores.entries import STORES, Store, data_file_problem
from fusebench.stores.files import array_digest, atomic_save, file_sha256

if TYPE_CHECKING:  # torch is imported where a list is built, so that fusebench-cache starts fast
    from fusebench.search.model_lists import ModelLists

log = logging.getLogger(__name__)
FORMAT = 1  # bump when the stored arrays change meaning; older entries are then recomputed
FIELDS = tuple(f"{d}_{f}" for d in DIRECTIONS for f in ("ids", "scores", "ranks"))
DATA = "lists.npz"


def array_digests(arrays: Sequence[np.ndarray]) -> list[str]:
    """``array_digest`` of each array, largest first on one thread per core (hashlib releases the GIL while
    it hashes: a sim sweep job hashes ~260 MB of embeddings for its keys)."""
    order = sorted(range(len(arrays)), key=lambda i: -arrays[i].nbytes)
    workers = min(len(arrays), os.cpu_count() or 1)
    if workers < 2:
        digests = [array_digest(arrays[i]) for i in order]
    else:
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(lambda i: array_digest(arrays[i]), order))
    out = [""] * len(arrays)
    for i, digest in zip(order, digests):
        out[i] = digest
    return out


def shared_digests(arrays: Sequence[np.ndarray]) -> list[str]:
    """``array_digests``, the arrays the process keeps hashed once per process (``runtime.state.SharedArrays``): a
    sweep's jobs share their sim models' normalised rows, and each job's keys would hash them again (~0.2 s a job)."""
    shared = state.current().shared
    digests = [shared.known(a, "sha256") for a in arrays]
    todo = [i for i, digest in enumerate(digests) if digest is None]
    for i, digest in zip(todo, array_digests([arrays[i] for i in todo])):
        digests[i] = digest
        shared.remember(arrays[i], "sha256", digest)
    return digests


def list_materials(models: Sequence[tuple[np.ndarray, np.ndarray]], caption_image: np.ndarray,
                   device_type: str) -> list[dict]:
    """Everything each model's lists depend on, for the entry keys: per (image, text) pair, the digests of
    its normalised embeddings, of which image each caption describes, the device type and the format."""
    arrays = [np.asarray(a, dtype=np.float32) for pair in models for a in pair]
    digests = shared_digests([*arrays, np.asarray(caption_image, dtype=np.int64)])
    return [{"kind": "lists", "format": FORMAT, "image": digests[2 * m], "text": digests[2 * m + 1],
             "caption_image": digests[-1], "device": device_type} for m in range(len(models))]


@dataclass
class StoreResult:
    lists: ModelLists
    key: str
    hit: bool  # True: read from the store, no similarity computed
    seconds: float  # time to read, or to compute and write


@STORES.register
class ListStore(Store):
    folder, name, kind, format, what = "lists", "list store", "lists", FORMAT, "the lists"
    order = 1

    def get_or_compute(self, material: dict, depth: int, n_images: int, n_captions: int,
                       compute: Callable[[int], ModelLists], info: dict | None = None) -> StoreResult:
        """The lists for ``material`` at least ``depth`` deep: from the store, else ``compute(depth)``."""
        started = time.perf_counter()
        with self.locked(material) as (key, folder):
            stored = self.read(folder, key, material, lambda meta: _checked_lists(folder, meta, n_images, n_captions))
            if stored is not None and stored.covers(depth, n_images, n_captions):
                return StoreResult(stored, key, True, time.perf_counter() - started)
            if stored is not None:
                log.info("list store %s holds depth %d; recomputing at depth %d", key[:12], stored.depth, depth)
                depth = max(depth, stored.depth)
            lists = compute(depth)
            self.store_or_keep(folder, lambda: self.write(folder, key, material, info or {},
                                                          lambda folder: _save_lists(folder, lists)))
            return StoreResult(lists, key, False, time.perf_counter() - started)

    def describe(self, meta: dict) -> dict:
        return {**super().describe(meta), "shape": (meta.get("shapes") or {}).get("t2i_ids"),
                "dtype": f"depth {meta.get('depth')}"}

    def data_files(self, meta: dict) -> dict[str, dict]:
        return {DATA: meta}


def _checked_lists(folder: Path, meta: dict, n_images: int, n_captions: int) -> tuple[ModelLists | None, str | None]:
    """The entry's lists when its file is intact (verified once per process) and of the corpus's shapes."""
    from fusebench.search.model_lists import ModelLists  # lazy: heavy (torch, numpy, numba)

    problem = data_file_problem(folder / DATA, meta, once_per_process=True)
    if problem is None:
        arrays = _read_arrays(folder / DATA)
        problem = _shape_problem(arrays, n_images, n_captions)
    return (None, problem) if problem else (ModelLists.from_arrays(int(meta["depth"]), arrays), None)


def _save_lists(folder: Path, lists: ModelLists) -> dict:
    """Write lists.npz; what meta.json records of it (depth, shapes, size, SHA-256)."""
    data_path = folder / DATA
    arrays = lists.arrays()
    atomic_save(data_path, lambda tmp: _save_npz(tmp, arrays))
    return {"depth": lists.depth, "shapes": {name: list(arrays[name].shape) for name in FIELDS},
            "bytes": data_path.stat().st_size, "sha256": file_sha256(data_path)}


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in FIELDS}


def _shape_problem(arrays: dict[str, np.ndarray], n_images: int, n_captions: int) -> str | None:
    n_queries = {"t2i": n_captions, "i2t": None}
    for direction in DIRECTIONS:
        ids, scores, ranks = (arrays[f"{direction}_{f}"] for f in ("ids", "scores", "ranks"))
        rows = n_queries[direction] if n_queries[direction] is not None else ids.shape[0]
        if ids.ndim != 2 or ids.shape != scores.shape or ids.shape[0] != rows or ranks.shape != (rows,):
            return f"{direction} arrays have shapes {ids.shape}, {scores.shape}, {ranks.shape}"
    if arrays["t2i_ids"].shape[1] > n_images or arrays["i2t_ids"].shape[1] > n_captions:
        return "lists longer than the corpus"
    return None


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with path.open("wb") as fh:
        np.savez(fh, **arrays)
