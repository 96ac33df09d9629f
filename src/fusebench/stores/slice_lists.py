"""The slice store: one slice of a gallery's exact search, per model (``fusebench.search.slices``), written by the
slice's job and read by the merge.

An entry's key is the model's list-store key material (its normalised embeddings' digests, which image each
caption describes, the gallery's distractor key, the device type, the list format) with the slicing: the number of
slices, the slice, its item bounds, the tiles (``eval.chunk_size``, ``eval.item_chunk_size``) and the distractor
tiles' precision. A slice of another gallery, model, slice count or tiling has another key and is never read for
this one; an entry whose meta.json records other inputs, whose file is cut short or altered (SHA-256, once per
process) or whose arrays are not this slice's is reported, removed and computed again. The depth is not in the
key: an entry holds the deepest lists asked so far (a shallower ask reads their head). Layout:

    CACHE/slices/ab/abcdef.../slice.npz   t2i_ids, t2i_scores, ahead, target_score, i2t_images, i2t_ids, i2t_scores
    CACHE/slices/ab/abcdef.../meta.json   key material, depth, bounds, seconds, bytes and sha256 of slice.npz
    CACHE/slices/ab/abcdef....lock        held while the entry is read or computed (one job computes it)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusebench.stores.entries import STORES, Store, data_file_problem
from fusebench.stores.files import atomic_save, file_sha256

log = logging.getLogger(__name__)
FORMAT = 1  # bump when the stored arrays change meaning; older entries are then recomputed
DATA = "slice.npz"
FIELDS = ("t2i_ids", "t2i_scores", "ahead", "target_score", "i2t_images", "i2t_ids", "i2t_scores")


def slice_material(list_material: dict, slices: int, index: int, start: int, stop: int, chunk_size: int,
                   item_chunk_size: int, precision: str) -> dict:
    """The slice entry's key material: the model's list material and the slicing."""
    return {**list_material, "kind": "slice", "slice_format": FORMAT, "slices": slices, "slice": index,
            "start": start, "stop": stop, "chunk_size": chunk_size, "item_chunk_size": item_chunk_size,
            "precision": precision}


@dataclass
class SliceResult:
    arrays: dict[str, np.ndarray]
    depth: int
    key: str
    hit: bool  # True: read from the store
    seconds: float  # to read, or to compute and write
    meta: dict


@STORES.register
class SliceStore(Store):
    folder, name, kind, format, what = "slices", "slice store", "slices", FORMAT, "the slice's lists"
    order = 6

    def get_or_compute(self, material: dict, depth: int, check: Callable[[dict[str, np.ndarray], int], str | None],
                       compute: Callable[[int], tuple[dict[str, np.ndarray], dict]],
                       info: dict | None = None) -> SliceResult:
        """The slice's arrays at least ``depth`` deep: from the store (``check(arrays, depth)`` must find nothing
        wrong), else ``compute(depth)`` (arrays, and what meta.json records beside them) and stored."""
        started = time.perf_counter()
        with self.locked(material) as (key, folder):
            meta_found: dict = {}

            def checked(meta: dict):
                problem = data_file_problem(folder / DATA, meta, once_per_process=True)
                if problem is None:
                    arrays = _read_arrays(folder / DATA)
                    problem = check(arrays, int(meta["depth"]))
                    meta_found.update(meta)
                return (None, problem) if problem else (arrays, None)

            stored = self.read(folder, key, material, checked)
            if stored is not None and int(meta_found["depth"]) >= depth:
                return SliceResult(stored, int(meta_found["depth"]), key, True, time.perf_counter() - started,
                                   meta_found)
            if stored is not None:
                log.info("slice store %s holds depth %d; recomputing at depth %d", key[:12], meta_found["depth"],
                         depth)
            arrays, extra = compute(depth)
            meta = self.store_or_keep(folder, lambda: self.write(folder, key, material, info or {},
                                                                 lambda folder: _save(folder, arrays, depth, extra)))
            return SliceResult(arrays, depth, key, False, time.perf_counter() - started,
                               meta or {"depth": depth, **extra})

    def describe(self, meta: dict) -> dict:
        material = meta.get("material") or {}
        return {**super().describe(meta), "shape": (meta.get("shapes") or {}).get("t2i_ids"),
                "dtype": f"slice {material.get('slice')}/{material.get('slices')}, depth {meta.get('depth')}"}

    def data_files(self, meta: dict) -> dict[str, dict]:
        return {DATA: meta}


def _save(folder: Path, arrays: dict[str, np.ndarray], depth: int, extra: dict) -> dict:
    """Write slice.npz; what meta.json records of it (depth, shapes, what the caller adds, size, SHA-256)."""
    path = folder / DATA
    atomic_save(path, lambda tmp: _save_npz(tmp, arrays))
    return {"depth": depth, "shapes": {name: list(arrays[name].shape) for name in FIELDS}, **extra,
            "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in FIELDS}


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with path.open("wb") as fh:
        np.savez(fh, **{name: arrays[name] for name in FIELDS})
