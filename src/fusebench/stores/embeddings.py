"""A content-addressed embedding store: computed once, reused by every run whose inputs are the same.

An entry's key is the SHA-256 of a JSON description of everything that changes its rows (model and
checkpoint fingerprint, preprocessing, corpus fingerprint, storage dtype, library versions). Layout:

    ROOT/ab/abcdef.../embeddings.npy   rows in corpus order, stored fp16 or fp32
    ROOT/ab/abcdef.../meta.json        the key material, shape, dtype, sha256 of the .npy, stats
    ROOT/ab/abcdef.../chunk-000003.npz while computing: finished chunks, so a killed run resumes
    ROOT/ab/abcdef....lock             held while an entry is computed (two sweep jobs never both write)

Every file is written to a temp name and renamed; meta.json is written last, so an entry with meta.json is
complete. A complete entry is read only when it is provably the one asked for (``entry_meta``: meta.json
records this entry's key, and key material equal to what was asked for: an entry copied over another's is
not) and its .npy matches its recorded size and checksum; else it is reported, removed and recomputed,
never read as data. A chunk records its entry's key too. What sits where a store keeps a file but is none
(a directory, a link to nowhere: a lock, a chunk, meta.json) is reported and removed (``clear_non_file``); so
is what sits where a store keeps a folder but is none (a file where a shard folder ``ab/``, ``lists/`` or
``scores/`` belongs: ``store_folders``), below the cache root: the root itself, the user's folder, is never
removed (a file there is an error).

The helpers here (``entry_meta``, ``entry_lock``, ``clear_non_file``, ``store_folders``, ``discard_entry``,
``scan_entries``) are shared by the list store and the score store; ``matching`` and ``remove_entry`` serve
fusebench-cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from filelock import FileLock

from fusebench import FusebenchError
from fusebench.app import memo
from fusebench.stores.files import (
    CHECKSUMS,
    atomic_save,
    atomic_write_text,
    clear_path,
    file_sha256,
    not_a_file,
    not_a_folder,
    remembered_checksum,
)

log = logging.getLogger(__name__)
ROWS = memo.FileReads(768 << 20)  # entries' rows kept for the next job of the process (as encoders.sim keeps rows)
STORE_DTYPES = {"fp16": np.float16, "fp32": np.float32}
# what reading a damaged .npy/.npz/.json raises (cut short, bytes flipped, another type of file)
UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, EOFError, zipfile.BadZipFile,
              zlib.error)
Compute = Callable[[np.ndarray], Iterable[tuple[np.ndarray, dict]]]
KEY = re.compile(r"[0-9a-f]{64}")  # an entry's key (cache_key): the name of its folder


def cache_key(material: dict) -> str:
    """SHA-256 of the canonical JSON of ``material`` (sorted keys, no whitespace)."""
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_meta(path: Path) -> dict:
    """An entry's meta.json as a dict; ValueError when it is not a JSON object (or not JSON at all)."""
    meta = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{path.name} holds a JSON {type(meta).__name__}, not an object")
    return meta


def unreadable(err: BaseException) -> str:
    """The problem text for an entry whose files could not be read."""
    return f"unreadable entry ({type(err).__name__}: {err})"


def discard_entry(folder: Path, store: str, problem: str) -> None:
    """Report a corrupt or outdated store entry and remove it, so that it is recomputed (never trusted)."""
    log.warning("%s entry %s is corrupt or outdated: %s; removing it and recomputing", store, folder, problem)
    clear_path(folder)


def clear_non_file(path: Path, store: str | None) -> None:
    """Remove what sits at ``path`` where a store keeps a regular file but is none (a directory, a link to
    nowhere, ...), so that the file can be written there again; reported as ``store``'s damage (None: already
    reported). A regular file, or nothing, is left as it is."""
    kind = not_a_file(path)
    if kind not in (None, "missing"):
        if store is not None:
            log.warning("%s: %s is %s, not a file; removing it", store, path, kind)
        clear_path(path)


def clear_non_folder(path: Path, store: str) -> None:
    """Report and remove what sits at ``path`` where a store keeps a folder but is none (a file, a link to
    nowhere, ...), so that the folder can be made there. Only a non-folder is removed: a folder another process
    has just made there is left as it is."""
    kind = not_a_folder(path)
    if kind in (None, "missing"):
        return
    log.warning("%s: %s is %s, not a folder; removing it", store, path, kind)
    try:
        path.unlink()
    except OSError:
        if os.path.lexists(path) and not path.is_dir():
            raise


def store_folders(base: Path, folder: Path, store: str) -> None:
    """Make ``folder`` (a store's shard folder) and every folder between the cache root ``base`` (exclusive) and
    it, after reporting and removing a non-folder found where one of them belongs (``clear_non_folder``): that
    layout is fusebench's own, and a file there would fail every job. ``base`` itself, the user's
    embed.cache.dir, is never removed: a file there fails the mkdir (a one-line error naming it)."""
    path = Path(base)
    for part in Path(folder).relative_to(base).parts:
        path = path / part
        clear_non_folder(path, store)
    Path(folder).mkdir(parents=True, exist_ok=True)


def entry_lock(folder: Path, store: str) -> FileLock:
    """The lock of a store entry (``folder.lock``), after removing (and reporting) a directory or other non-file
    found at its path: no process can hold such a lock, and every job would fail on it."""
    lock = Path(str(folder) + ".lock")
    clear_non_file(lock, store)
    return FileLock(str(lock))


def recorded_material(material: dict) -> dict:
    """``material`` as meta.json records it (a JSON round trip: tuples become lists, keys strings)."""
    return json.loads(json.dumps(material, default=str))


def distinct_keys(one: str, other: str, least: int = 16) -> tuple[str, str]:
    """Prefixes of two different keys long enough to tell them apart (``least`` characters at least; a key
    longer than its prefix ends in "...")."""
    same = len(os.path.commonprefix([one, other]))
    length = max(least, same + 1)
    return tuple(key if len(key) <= length else key[:length] + "..." for key in (one, other))


def key_problem(meta: dict, key: str, material: dict | None) -> str | None:
    """Why ``meta`` is not the meta.json of the entry keyed ``key`` for ``material`` (None: not checked): it
    records another key, or other inputs (an entry copied or moved from elsewhere); None when it is."""
    if meta.get("key") != key:
        recorded, this = distinct_keys(str(meta.get("key")), key)
        return f"meta.json records key {recorded}, not this entry's {this} (copied from another entry?)"
    if material is not None and meta.get("material") != recorded_material(material):
        return "meta.json records inputs other than this entry's"
    return None


def entry_meta(folder: Path, key: str, material: dict | None) -> tuple[dict | None, str | None]:
    """A store entry's meta.json, proven to be this entry's: ``(meta, None)``; ``(None, None)`` when the entry
    is absent or has no meta.json (never finished); ``(None, problem)`` when the entry or its meta.json is not
    what fusebench writes there (a file for the folder, a directory for meta.json, not a JSON object) or it
    records another key or other inputs (``key_problem``)."""
    meta_path = folder / "meta.json"
    if os.path.lexists(folder) and not folder.is_dir():
        return None, f"the entry is {not_a_folder(folder)}, not a folder"
    if not os.path.lexists(meta_path):
        return None, None
    kind = not_a_file(meta_path)
    if kind is not None:
        return None, f"meta.json is {kind}, not a file"
    try:
        meta = read_meta(meta_path)
    except UNREADABLE as err:
        return None, unreadable(err)
    problem = key_problem(meta, key, material)
    return (None, problem) if problem else (meta, None)


def data_file_size_problem(path: Path, size: int) -> str | None:
    """Why a data file fails the cheap checks (present, a regular file, its recorded size), or None."""
    kind = not_a_file(path)
    if kind is not None:
        return f"{path.name} is {kind}"
    found = path.stat().st_size
    return None if found == size else f"{path.name} has {found} bytes, expected {size} (truncated?)"


def data_file_problem(path: Path, meta: dict, once_per_process: bool = False) -> str | None:
    """Why the data file of a complete entry cannot be trusted (missing, not a regular file, wrong size, wrong
    checksum: ``crc32`` or ``sha256``, whichever ``meta`` records), or None. ``once_per_process``: a checksum
    this process computed or wrote for the unchanged file is not read again (``files.remembered_checksum``)."""
    problem = data_file_size_problem(path, meta["bytes"])
    if problem is not None:
        return problem
    kind = "crc32" if "crc32" in meta else "sha256"
    checksum = remembered_checksum(path, kind) if once_per_process else CHECKSUMS[kind](path)
    if checksum != meta[kind]:
        return f"{path.name} does not match its recorded checksum"
    return None


def shared_rows(path: Path) -> np.ndarray:
    """An entry's rows as float32, read once per process for the unchanged file and returned read-only: the jobs
    of a sweep on the basic launcher share them, and so share what is derived from them (normalised rows,
    store keys: ``fusebench.app.memo``)."""
    return ROWS.get(path, lambda p: memo.read_only(np.load(p, allow_pickle=False).astype(np.float32)))


def _add_stats(total: dict, more: dict) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


@dataclass
class CacheResult:
    embeddings: np.ndarray  # float32, corpus order
    key: str
    hit: bool  # True: read from the cache, no model work done
    stats: dict = field(default_factory=dict)  # summed per-chunk counters (skipped images, truncated texts, ...)
    seconds: float = 0.0  # compute time when it was computed


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
        batches covering exactly those rows in that order; ``stats`` are integer counters to record.
        ``info`` (model name, ...) is stored for listing but is not part of the key.
        """
        if self.dtype is None or self.chunk_rows is None:
            raise ValueError("this EmbeddingCache was opened to list entries; give dtype and chunk_rows to compute")
        material = {**material, "store_dtype": self.dtype, "n_rows": int(n_rows)}
        key = cache_key(material)
        folder = self.entry_dir(key)
        store_folders(self.root, folder.parent, "embedding cache")
        with entry_lock(folder, "cache"):
            found = self._read_complete(folder, key, material, n_rows)
            if found is not None:
                return found
            return self._compute(folder, key, material, n_rows, compute, label, info or {})

    def _read_complete(self, folder: Path, key: str, material: dict, n_rows: int) -> CacheResult | None:
        data_path = folder / "embeddings.npy"
        meta, problem = entry_meta(folder, key, material)
        if meta is None and problem is None:
            return None  # not computed yet, or unfinished: its chunks are resumed
        try:
            problem = problem or data_file_problem(data_path, meta, once_per_process=True)
            if problem is None:
                data = shared_rows(data_path)
                if data.shape[0] != n_rows:
                    problem = f"embeddings.npy has {data.shape[0]} rows, expected {n_rows}"
        except UNREADABLE as err:
            problem = unreadable(err)
        if problem:
            discard_entry(folder, "cache", problem)
            return None
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
        data_path = folder / "embeddings.npy"
        atomic_save(data_path, lambda tmp: _save_npy(tmp, data))
        meta = {"key": key, "info": info, "material": material, "shape": list(data.shape), "dtype": self.dtype,
                "bytes": data_path.stat().st_size, "sha256": file_sha256(data_path), "stats": stats,
                "seconds": round(seconds, 3), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))
        for i in range(n_chunks):
            (folder / f"chunk-{i:06d}.npz").unlink(missing_ok=True)
        return CacheResult(data.astype(np.float32), key, hit=False, stats=stats, seconds=seconds)

    def entries(self) -> list[dict]:
        """Every entry under the root: key, label, kind, shape, size on disk, complete or partial."""
        def describe(meta: dict) -> dict:
            return {"model": meta.get("info", {}).get("model", ""), "kind": meta.get("material", {}).get("kind", ""),
                    "shape": meta.get("shape"), "dtype": meta.get("dtype"), "created": meta.get("created")}

        entries = scan_entries(self.root, describe, lambda meta: {"embeddings.npy": meta["bytes"]})
        for info in entries:
            if not info["complete"] and not info.get("problem"):
                info["chunks"] = len(list(Path(info["path"]).glob("chunk-*.npz")))
        return entries


def scan_entries(root: Path, describe: Callable[[dict], dict], data_files: Callable[[dict], dict[str, int]],
                 kind: str | None = None) -> list[dict]:
    """Every entry folder of a store (``root/ab/KEY``): key, path, size on disk, complete, and what
    ``describe(meta)`` adds; ``kind`` labels entries whose meta does not say it. Complete: meta.json is this
    entry's (``entry_meta``) and each data file ``data_files(meta)`` names (name -> recorded bytes) is a regular
    file of that size (cheap checks: no checksum is read); else ``problem`` says why, when it is damage
    rather than an unfinished write. A file (or a link to nowhere) at an entry's path (a key's name) is listed
    too, as damaged, so that it can be removed."""
    out = []
    folders = sorted(p for p in root.glob("??/*") if not p.name.endswith(".lock") and (
        p.is_dir() or (KEY.fullmatch(p.name) and p.name.startswith(p.parent.name)))) if root.is_dir() else []
    for folder in folders:
        size = (sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) if folder.is_dir()
                else folder.lstat().st_size)
        info = {"key": folder.name, "path": str(folder), "complete": False, "bytes": size}
        if kind is not None:
            info["kind"] = kind
        meta, problem = entry_meta(folder, folder.name, None)
        try:
            if meta is not None:
                info.update(describe(meta))
                problem = next(filter(None, (data_file_size_problem(folder / name, size)
                                             for name, size in data_files(meta).items())), None)
        except UNREADABLE as err:
            problem = unreadable(err)
        info["complete"], info["problem"] = meta is not None and problem is None, problem
        out.append(info)
    return out


def matching(entries: list[dict], key_prefix: str) -> list[dict]:
    """The listed entries whose key starts with ``key_prefix`` (at least 4 characters; hex digits in either
    case: keys are written in lower case)."""
    if len(key_prefix) < 4:
        raise FusebenchError("give at least 4 characters of a cache key (see fusebench-cache list).")
    return [entry for entry in entries if entry["key"].lower().startswith(key_prefix.lower())]


def remove_entry(entry: dict) -> None:
    """Remove a listed entry (under its lock), and its lock."""
    folder = Path(entry["path"])
    with entry_lock(folder, "fusebench-cache"):
        clear_path(folder)
    clear_path(Path(str(folder) + ".lock"))


def _save_npy(path: Path, data: np.ndarray) -> None:
    with path.open("wb") as fh:
        np.save(fh, data, allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())


def _save_npz(path: Path, data: np.ndarray, stats: dict, key: str) -> None:
    with path.open("wb") as fh:
        np.savez(fh, embeddings=data, stats=np.array(json.dumps(stats)), key=np.array(key))
        fh.flush()
        os.fsync(fh.fileno())
