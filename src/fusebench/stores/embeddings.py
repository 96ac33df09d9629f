"""A content-addressed embedding store: computed once, reused by every run whose inputs are the same.

An entry's key is the SHA-256 of a JSON description of everything that changes its rows (model and
checkpoint fingerprint, preprocessing, corpus fingerprint, storage dtype, library versions). Layout:

    ROOT/ab/abcdef.../embeddings.npy   rows in corpus order, stored fp16 or fp32
    ROOT/ab/abcdef.../meta.json        the key material, shape, dtype, sha256 of the .npy, stats
    ROOT/ab/abcdef.../contents.json    gallery shards: each row's [file, SHA-256 of its bytes] (``CONTENTS``)
    ROOT/ab/abcdef.../chunk-000003.npz while computing: finished chunks, so a killed run resumes
    ROOT/ab/abcdef....lock             held while an entry is computed (two sweep jobs never both write)

A compute function may yield, among its per-chunk stats, ``CONTENTS``: one ``[ref, digest]`` per row (a gallery
shard's images and their content digests). They are joined in row order and written to ``contents.json`` (its size
and SHA-256 in meta.json's ``contents``) rather than into meta.json, which every run reads; only
``fusebench-cache verify`` reads them (``entry_contents``).

A complete entry is read only when the entry mechanism (``stores.entries``) proves it the one asked for (its
meta.json records this entry's key and inputs) and its .npy matches its recorded size and checksum; else it is
reported, removed and recomputed, never read as data (a shard's contents.json is checked the same way). A chunk
records its entry's key too. ``complete_entry``
verifies a complete entry the same way without loading it, for rows read in place (memory-mapped gallery shards).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.stores.entries import (
    UNREADABLE,
    cache_key,
    clear_non_file,
    data_file_problem,
    discard_entry,
    distinct_keys,
    entry_lock,
    entry_meta,
    scan_entries,
    store_folders,
    unreadable,
)
from fusebench.stores.files import atomic_save, atomic_write_text, file_sha256, save_npy_synced

log = logging.getLogger(__name__)
STORE_DTYPES = {"fp16": np.float16, "fp32": np.float32}
Compute = Callable[[np.ndarray], Iterable[tuple[np.ndarray, dict]]]
CONTENTS = "contents"  # the per-row stat kept in contents.json, not in meta.json
CONTENTS_FILE = "contents.json"


def _add_stats(total: dict, more: dict) -> None:
    """Sum per-chunk stats: numbers add up, lists (the files a shard could not read) are joined in chunk order."""
    for name, value in more.items():
        total[name] = total[name] + value if name in total else value


@dataclass
class CacheResult:
    embeddings: np.ndarray  # float32, corpus order
    key: str
    hit: bool  # True: read from the cache, no model work done
    stats: dict = field(default_factory=dict)  # summed per-chunk counters (skipped images, truncated texts, ...)
    seconds: float = 0.0  # compute time when it was computed


@dataclass(frozen=True)
class CompleteEntry:
    """A complete entry, verified (its meta.json is this entry's; its .npy has the recorded size, checksum and
    row count), to be read in place: ``np.load(path, mmap_mode="r")`` reads rows only as they are touched."""

    path: Path  # embeddings.npy
    key: str
    meta: dict  # meta.json: material, shape, dtype, stats, seconds, info


class EmbeddingCache:
    """``dtype`` and ``chunk_rows`` are the embed.cache settings (defaults: fusebench.config.schema.CacheSchema); a
    cache opened only to list or remove entries (``fusebench-cache``) leaves them None."""

    def __init__(self, root: str | Path, dtype: str | None = None, chunk_rows: int | None = None):
        if dtype is not None and dtype not in STORE_DTYPES:
            raise FusebenchError(f"embed.cache.dtype={dtype!r} is not valid; valid: {', '.join(STORE_DTYPES)}.")
        if chunk_rows is not None and chunk_rows < 1:
            raise FusebenchError(f"embed.cache.chunk_rows={chunk_rows} must be >= 1.")
        self.root = Path(root).expanduser()
        self.dtype = dtype
        self.chunk_rows = None if chunk_rows is None else int(chunk_rows)

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get_or_compute(self, material: dict, n_rows: int, compute: Compute, label: str = "",
                       info: dict | None = None) -> CacheResult:
        """The rows described by ``material``: from the cache, else computed (resuming finished chunks).

        ``compute(rows)`` gets the row indices still missing, in order, and yields ``(embeddings, stats)``
        batches covering exactly those rows in that order; ``stats`` are counters to record (numbers, summed
        over the chunks; or lists, joined in chunk order).
        ``info`` (model name, ...) is stored for listing but is not part of the key.
        """
        if self.dtype is None or self.chunk_rows is None:
            raise ValueError("this EmbeddingCache was opened to list entries; give dtype and chunk_rows to compute")
        material, key = self.keyed(material, n_rows)
        folder = self.entry_dir(key)
        store_folders(self.root, folder.parent, "embedding cache")
        with entry_lock(folder, "cache"):
            found = self._read_complete(folder, key, material, n_rows)
            if found is not None:
                return found
            return self._compute(folder, key, material, n_rows, compute, label, info or {})

    def keyed(self, material: dict, n_rows: int) -> tuple[dict, str]:
        """The entry's whole key material (``material`` with the storage dtype and row count) and its key."""
        if self.dtype is None:
            raise ValueError("this EmbeddingCache was opened to list entries; give dtype and chunk_rows to read")
        material = {**material, "store_dtype": self.dtype, "n_rows": int(n_rows)}
        return material, cache_key(material)

    def complete_entry(self, material: dict, n_rows: int) -> CompleteEntry | None:
        """The complete entry for ``material`` (as ``get_or_compute`` keys it), verified under its lock but not
        loaded: its rows stay on disk for memory-mapped reading. None when it is not computed (or only partly:
        ``get_or_compute`` resumes it); a damaged or foreign one is reported and removed, then None."""
        material, key = self.keyed(material, n_rows)
        folder = self.entry_dir(key)
        if not folder.parent.is_dir():
            return None  # no entry of this shard folder: nothing to lock or read
        with entry_lock(folder, "cache"):
            meta = self._verified(folder, key, material, n_rows)
        return None if meta is None else CompleteEntry(folder / "embeddings.npy", key, meta)

    def _verified(self, folder: Path, key: str, material: dict, n_rows: int) -> dict | None:
        """The meta.json of the complete entry in ``folder``, once proven this entry's with its .npy intact (size,
        checksum, row count: the header alone); None when it is not computed yet, or unfinished (its chunks are
        resumed); a damaged one is reported and removed, then None."""
        data_path = folder / "embeddings.npy"
        meta, problem = entry_meta(folder, key, material)
        if meta is None and problem is None:
            return None  # not computed yet, or unfinished: its chunks are resumed
        try:
            problem = problem or data_file_problem(data_path, meta, once_per_process=True)
            if problem is None and CONTENTS in meta:  # a shard's content record: damaged is damaged, as listed
                problem = data_file_problem(folder / CONTENTS_FILE, meta[CONTENTS], once_per_process=True)
            if problem is None:
                rows = np.load(data_path, mmap_mode="r", allow_pickle=False).shape[0]  # the header only
                if rows != n_rows:
                    problem = f"embeddings.npy has {rows} rows, expected {n_rows}"
        except UNREADABLE as err:
            problem = unreadable(err)
        if problem:
            discard_entry(folder, "cache", problem)
            return None
        return meta

    def _read_complete(self, folder: Path, key: str, material: dict, n_rows: int) -> CacheResult | None:
        meta = self._verified(folder, key, material, n_rows)
        if meta is None:
            return None
        data = np.load(folder / "embeddings.npy", allow_pickle=False).astype(np.float32)
        return CacheResult(data, key, hit=True, stats=meta.get("stats", {}),
                           seconds=float(meta.get("seconds", 0.0)))

    def _finished_chunks(self, folder: Path, key: str, n_chunks: int, n_rows: int) -> dict[int, tuple[np.ndarray, dict]]:
        """The chunks an unfinished run of this entry left (each checked to be of this entry: its key, its rows);
        a damaged one is reported and removed."""
        done = {}
        for index in range(n_chunks):
            path = folder / f"chunk-{index:06d}.npz"
            if not path.is_file():
                continue
            rows = min(self.chunk_rows, n_rows - index * self.chunk_rows)
            try:
                with np.load(path, allow_pickle=False) as chunk:
                    data, stats, written_for = chunk["embeddings"], json.loads(str(chunk["stats"])), str(chunk["key"])
                if written_for != key:
                    raise ValueError("written for entry {}, not this one ({})".format(*distinct_keys(written_for, key)))
                if data.shape[0] != rows:
                    raise ValueError(f"{data.shape[0]} rows, expected {rows}")
                done[index] = (data, stats)
            except UNREADABLE as err:
                log.warning("cache chunk %s is unreadable (%s: %s); recomputing it", path, type(err).__name__, err)
                path.unlink(missing_ok=True)
        return done

    def _compute(self, folder: Path, key: str, material: dict, n_rows: int, compute: Compute,
                 label: str, info: dict) -> CacheResult:
        folder.mkdir(parents=True, exist_ok=True)
        for path in folder.iterdir():  # a directory where a chunk, the rows or meta.json go: no write could succeed
            clear_non_file(path, "cache")
        n_chunks = max(1, -(-n_rows // self.chunk_rows))
        done = self._finished_chunks(folder, key, n_chunks, n_rows)
        if done:
            log.info("%s: resuming, %d of %d chunks already computed", label or key[:12], len(done), n_chunks)
        missing = [i for i in range(n_chunks) if i not in done]
        rows = np.concatenate([np.arange(i * self.chunk_rows, min((i + 1) * self.chunk_rows, n_rows))
                               for i in missing]) if missing else np.zeros(0, dtype=np.int64)
        started = time.perf_counter()
        store = STORE_DTYPES[self.dtype]
        batches: Iterator[tuple[np.ndarray, dict]] = iter(compute(rows)) if rows.size else iter(())
        pending: list[np.ndarray] = []
        pending_stats: dict = {}
        for index in missing:
            need = min(self.chunk_rows, n_rows - index * self.chunk_rows)
            have = sum(len(p) for p in pending)
            while have < need:
                try:
                    batch, stats = next(batches)
                except StopIteration:
                    raise RuntimeError(f"{label}: the encoder produced {have} of {need} rows for chunk {index}") from None
                pending.append(np.asarray(batch))
                _add_stats(pending_stats, stats)
                have += len(batch)
            block = np.concatenate(pending)
            chunk, rest = block[:need].astype(store), block[need:]
            pending = [rest] if len(rest) else []
            chunk_stats, pending_stats = pending_stats, {}
            atomic_save(folder / f"chunk-{index:06d}.npz",
                         lambda tmp, c=chunk, s=chunk_stats: _save_npz(tmp, c, s, key))
            done[index] = (chunk, chunk_stats)
        seconds = time.perf_counter() - started
        data = np.concatenate([done[i][0] for i in range(n_chunks)]) if n_rows else np.zeros((0, 0), store)
        stats: dict = {}
        for i in range(n_chunks):
            _add_stats(stats, done[i][1])
        contents = stats.pop(CONTENTS, None)
        if any(CONTENTS not in done[i][1] for i in range(n_chunks)):
            contents = None  # chunks a run of an earlier version left: no record, rather than one with gaps
        data_path = folder / "embeddings.npy"
        atomic_save(data_path, lambda tmp: save_npy_synced(tmp, data))
        meta = {"key": key, "info": info, "material": material, "shape": list(data.shape), "dtype": self.dtype,
                "bytes": data_path.stat().st_size, "sha256": file_sha256(data_path), "stats": stats,
                "seconds": round(seconds, 3), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if contents is not None:
            if len(contents) != n_rows:
                raise RuntimeError(f"{label}: the encoder recorded the contents of {len(contents)} of {n_rows} rows")
            contents_path = folder / CONTENTS_FILE
            atomic_write_text(contents_path, json.dumps(contents))
            meta[CONTENTS] = {"bytes": contents_path.stat().st_size, "sha256": file_sha256(contents_path)}
        atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))
        for i in range(n_chunks):
            (folder / f"chunk-{i:06d}.npz").unlink(missing_ok=True)
        return CacheResult(data.astype(np.float32), key, hit=False, stats=stats, seconds=seconds)

    def entries(self, verify: bool = True, progress=None) -> list[dict]:
        """Every entry under the root: key, label, kind, shape, size on disk, complete or partial."""
        def describe(meta: dict) -> dict:
            return {"model": meta.get("info", {}).get("model", ""), "kind": meta.get("material", {}).get("kind", ""),
                    "shape": meta.get("shape"), "dtype": meta.get("dtype"), "created": meta.get("created")}

        entries = scan_entries(self.root, describe, _data_files, verify=verify, progress=progress)
        for info in entries:
            if not info["complete"] and not info.get("problem"):
                info["chunks"] = len(list(Path(info["path"]).glob("chunk-*.npz")))
        return entries


def _data_files(meta: dict) -> dict[str, dict]:
    """An entry's data files and their records (size, checksum): the rows, and a shard's contents.json."""
    return {"embeddings.npy": meta, **({CONTENTS_FILE: meta[CONTENTS]} if CONTENTS in meta else {})}


def entry_contents(folder: Path, meta: dict) -> tuple[list | None, str | None]:
    """A complete entry's content record: ``(rows, None)``, each row ``[ref, digest or None]`` in row order;
    ``(None, None)`` when the entry has none (not a gallery shard, or embedded before fusebench recorded them);
    ``(None, problem)`` when contents.json is missing, damaged or not one row per embedding row."""
    record = meta.get(CONTENTS)
    if record is None:
        return None, None
    path = folder / CONTENTS_FILE
    try:
        problem = data_file_problem(path, record)
        if problem is not None:
            return None, problem
        rows = json.loads(path.read_text(encoding="utf-8"))
    except UNREADABLE as err:
        return None, unreadable(err)
    if not isinstance(rows, list) or len(rows) != int(meta["shape"][0]):
        return None, f"{CONTENTS_FILE} does not hold one row per embedding row"
    return rows, None


def _save_npz(path: Path, data: np.ndarray, stats: dict, key: str) -> None:
    with path.open("wb") as fh:
        np.savez(fh, embeddings=data, stats=np.array(json.dumps(stats)), key=np.array(key))
        fh.flush()
        os.fsync(fh.fileno())
