"""The near-duplicate store: per model, each distractor's largest cosine to any test image, computed once per
(test image rows, distractors, model, device type) and reused by every job of a sweep over the same gallery
(a pass over the whole gallery per model, as long as one similarity pass of the captions over it).

    CACHE/near_duplicates/ab/abcdef.../max_cosine.npy   (distractors,) float32
    CACHE/near_duplicates/ab/abcdef.../meta.json        key material, shape, bytes and sha256 of the .npy
    CACHE/near_duplicates/ab/abcdef....lock             held while the entry is read or computed

The threshold is not in the key: a run with another ``gallery.near_duplicate`` reads the same entry. Guarantees
as for the list store (``stores.entries``): atomic writes, meta.json last, a lock per entry, a checksum verified
once per process; an entry that is not provably the one asked for, truncated, corrupt or of another format is
reported, removed and recomputed; listed and removed by ``fusebench-cache`` (kind ``dedup``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from fusebench.stores.entries import STORES, Store, data_file_problem
from fusebench.stores.files import atomic_save, file_sha256, save_npy_synced

FORMAT = 1  # bump when the stored array changes meaning; older entries are then recomputed
DATA = "max_cosine.npy"


@STORES.register
class NearDuplicateStore(Store):
    folder, name, kind, format, what = "near_duplicates", "near-duplicate store", "dedup", FORMAT, \
        "near-duplicate values"
    order = 3

    def get_or_compute(self, material: dict, n: int, compute: Callable[[], np.ndarray],
                       info: dict | None = None) -> tuple[np.ndarray, bool]:
        """The ``n`` stored values for ``material``, and True; else ``compute()``'s, stored, and False."""
        material = {**material, "kind": "near_duplicates", "format": FORMAT}
        with self.locked(material) as (key, folder):
            stored = self.read(folder, key, material, lambda meta: _checked_values(folder, meta, n))
            if stored is not None:
                return stored, True
            values = np.ascontiguousarray(compute(), dtype=np.float32)
            if values.shape != (n,):
                raise ValueError(f"near-duplicate values of shape {values.shape}, expected ({n},)")
            self.store_or_keep(folder, lambda: self.write(folder, key, material, info or {},
                                                          lambda folder: _save_values(folder, values)))
            return values, False

    def describe(self, meta: dict) -> dict:
        return {**super().describe(meta), "shape": meta.get("shape"), "dtype": "float32"}

    def data_files(self, meta: dict) -> dict[str, dict]:
        return {DATA: meta}


def _checked_values(folder: Path, meta: dict, n: int) -> tuple[np.ndarray | None, str | None]:
    """The entry's values when its file is intact (verified once per process) and ``n`` float32 values."""
    problem = data_file_problem(folder / DATA, meta, once_per_process=True)
    if problem is not None:
        return None, problem
    values = np.load(folder / DATA, allow_pickle=False)
    if values.shape != (n,) or values.dtype != np.float32:
        return None, f"{DATA} holds {values.dtype} of shape {values.shape}, expected float32 ({n},)"
    return values, None


def _save_values(folder: Path, values: np.ndarray) -> dict:
    """Write max_cosine.npy; what meta.json records of it (shape, size, SHA-256)."""
    data_path = folder / DATA
    atomic_save(data_path, lambda tmp: save_npy_synced(tmp, values))
    return {"shape": list(values.shape), "bytes": data_path.stat().st_size, "sha256": file_sha256(data_path)}
