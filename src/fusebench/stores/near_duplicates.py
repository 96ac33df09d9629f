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

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fusebench.stores.entries import (
    UNREADABLE,
    cache_key,
    data_file_problem,
    discard_entry,
    entry_lock,
    entry_meta,
    scan_entries,
    store_folders,
    unreadable,
)
from fusebench.stores.files import atomic_save, atomic_write_text, clear_path, file_sha256, save_npy_synced

log = logging.getLogger(__name__)
FORMAT = 1  # bump when the stored array changes meaning; older entries are then recomputed
STORE = "near-duplicate store"
DATA = "max_cosine.npy"


class NearDuplicateStore:
    def __init__(self, cache_root: str | Path):
        self.cache_root = Path(cache_root).expanduser()
        self.root = self.cache_root / "near_duplicates"

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get_or_compute(self, material: dict, n: int, compute: Callable[[], np.ndarray],
                       info: dict | None = None) -> tuple[np.ndarray, bool]:
        """The ``n`` stored values for ``material``, and True; else ``compute()``'s, stored, and False."""
        material = {**material, "kind": "near_duplicates", "format": FORMAT}
        key = cache_key(material)
        folder = self.entry_dir(key)
        store_folders(self.cache_root, folder.parent, STORE)
        with entry_lock(folder, STORE):
            stored = self._read(folder, key, material, n)
            if stored is not None:
                return stored, True
            values = np.ascontiguousarray(compute(), dtype=np.float32)
            if values.shape != (n,):
                raise ValueError(f"near-duplicate values of shape {values.shape}, expected ({n},)")
            try:
                self._write(folder, key, material, values, info or {})
            except OSError as err:  # a full disk or a read-only cache: keep the values, store nothing
                clear_path(folder)
                log.warning("could not store near-duplicate values in %s (%s); going on without storing them",
                            folder, err.strerror or err)
            return values, False

    def _read(self, folder: Path, key: str, material: dict, n: int) -> np.ndarray | None:
        meta, problem = entry_meta(folder, key, material)
        if meta is None and problem is None:
            clear_path(folder)  # a write that never finished (or none yet): nothing in it is trusted
            return None
        try:
            if problem is None and meta.get("format") != FORMAT:
                problem = f"format {meta.get('format')!r}, this version reads format {FORMAT}"
            problem = problem or data_file_problem(folder / DATA, meta, once_per_process=True)
            if problem is None:
                values = np.load(folder / DATA, allow_pickle=False)
                if values.shape != (n,) or values.dtype != np.float32:
                    problem = f"{DATA} holds {values.dtype} of shape {values.shape}, expected float32 ({n},)"
        except UNREADABLE as err:
            problem = unreadable(err)
        if problem:
            discard_entry(folder, STORE, problem)
            return None
        return values

    def _write(self, folder: Path, key: str, material: dict, values: np.ndarray, info: dict) -> None:
        clear_path(folder)
        folder.mkdir(parents=True)
        data_path = folder / DATA
        atomic_save(data_path, lambda tmp: save_npy_synced(tmp, values))
        meta = {"key": key, "format": FORMAT, "info": info, "material": material, "shape": list(values.shape),
                "bytes": data_path.stat().st_size, "sha256": file_sha256(data_path),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))

    def entries(self, verify: bool = True, progress=None) -> list[dict]:
        """Every entry: key, model, distractors, size on disk, complete or not."""
        return scan_entries(self.root, lambda meta: {
            "model": (meta.get("info") or {}).get("model", ""), "created": meta.get("created"),
            "shape": meta.get("shape"), "dtype": "float32"}, lambda meta: {DATA: meta}, kind="dedup",
            verify=verify, progress=progress)
