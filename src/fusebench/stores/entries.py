"""The entry mechanism every store shares: the embedding cache (``embeddings``), the list store (``lists``), the
score store (``scores``), the near-duplicate store (``near_duplicates``) and the index store (``indexes``). An entry
is a folder ``ROOT/ab/KEY`` named by a content key (``cache_key``: the SHA-256 of a JSON description of every input
that changes its data), with a ``meta.json`` that records that key and those
inputs, data files whose size and checksum meta.json records, and a lock beside it (``KEY.lock``).

* key: ``cache_key``; meta: ``entry_meta`` (an entry is read only when it is provably the one asked for: meta.json
  records its key and the inputs asked for, so an entry copied over another's is not);
* lock: ``entry_lock`` (two jobs never both write an entry);
* checksum: ``data_file_problem`` (present, a regular file, its recorded size and CRC-32 or SHA-256);
* discard: ``discard_entry`` (reported, removed, recomputed: never read as data), ``clear_non_file`` and
  ``store_folders`` (what sits where a store keeps a file or a folder but is none is reported and removed, below
  the cache root: the root itself, the user's folder, is never removed);
* scan: ``scan_entries`` (what ``fusebench-cache`` lists, checksums verified unless ``--quick``), ``matching``
  and ``remove_entry`` (what it removes).

``Store`` puts these together for a store of whole entries (the list, score, near-duplicate and index stores):
locate (``entry_dir``), key and lock (``locked``), read (``read``: meta.json proven this entry's and of the
store's format, then the store's own checks, a damaged entry discarded), write (``write``: data files, then
meta.json last), keep going when the cache cannot be written (``store_or_keep``) and list (``entries``). A
store subclass holds only what is its own: its folder, names and format, its data files and what it checks.

Every file is written to a temp name and renamed (``files.atomic_save``); meta.json is written last, so an entry
with meta.json is complete.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

from fusebench import FusebenchError
from fusebench.runtime.plugins import Registry
from fusebench.stores.files import (
    CHECKSUMS,
    atomic_write_text,
    clear_path,
    not_a_file,
    not_a_folder,
    remembered_checksum,
)

log = logging.getLogger(__name__)
# what reading a damaged .npy/.npz/.json raises (cut short, bytes flipped, another type of file)
UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, EOFError, zipfile.BadZipFile,
              zlib.error)
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


def scan_entries(root: Path, describe: Callable[[dict], dict], data_files: Callable[[dict], dict[str, dict]],
                 kind: str | None = None, verify: bool = True,
                 progress: Callable[[int], None] | None = None) -> list[dict]:
    """Every entry folder of a store (``root/ab/KEY``): key, path, size on disk, complete, and what
    ``describe(meta)`` adds; ``kind`` labels entries whose meta does not say it. Complete: meta.json is this
    entry's (``entry_meta``) and each data file ``data_files(meta)`` names (name -> its record: ``bytes`` and the
    ``crc32`` or ``sha256`` a read checks) is a regular file of that size and, with ``verify``, that checksum (the
    check a run makes before it reads the entry: a bit flipped in place is listed as damaged, never as complete;
    without ``verify`` only the cheap checks run, and a complete entry is complete as far as its sizes tell).
    ``progress(bytes)`` after each file hashed. Else ``problem`` says why, when it is damage rather than an
    unfinished write. A file (or a link to nowhere) at an entry's path (a key's name) is listed too, as damaged,
    so that it can be removed. Only a key's place is looked at (``ab/abKEY``): a folder or file of any other name
    is not fusebench's, never listed and so never removed."""
    out = []
    folders = sorted(p for p in root.glob("??/*") if KEY.fullmatch(p.name) and p.name.startswith(p.parent.name)
                     ) if root.is_dir() else []  # a key's place only: anything else there is not fusebench's
    for folder in folders:
        size = (sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) if folder.is_dir()
                else folder.lstat().st_size)
        info = {"key": folder.name, "path": str(folder), "complete": False, "bytes": size, "verified": verify}
        if kind is not None:
            info["kind"] = kind
        meta, problem = entry_meta(folder, folder.name, None)
        try:
            if meta is not None:
                info.update(describe(meta))
                for name, record in data_files(meta).items():
                    problem = (data_file_problem(folder / name, record) if verify
                               else data_file_size_problem(folder / name, record["bytes"]))
                    if progress is not None:
                        progress(int(record["bytes"]))
                    if problem is not None:
                        break
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


class Store:
    """A store of whole entries, ``CACHE/<folder>/ab/KEY/`` (data files and meta.json) beside ``KEY.lock``.

    A subclass sets ``folder`` (below the cache root), ``name`` (in messages: "list store"), ``kind`` (its
    entries' kind in ``fusebench-cache list``), ``format`` (meta.json records it; an entry of another format is
    discarded, never read), ``what`` (what an entry holds, in the warning when it cannot be stored), ``order``
    (its place in ``fusebench-cache list``, after the embeddings), and says which data files an entry has
    (``data_files``) and what a listing shows of one (``describe``). It registers itself in ``STORES`` (a module
    of this package), which is what ``fusebench-cache`` lists and removes: no list of stores kept by hand."""

    folder: str
    name: str
    kind: str
    format: int
    what: str
    order: int

    def __init__(self, cache_root: str | Path):
        self.cache_root = Path(cache_root).expanduser()
        self.root = self.cache_root / self.folder

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    @contextmanager
    def locked(self, material: dict) -> Iterator[tuple[str, Path]]:
        """The key and folder of ``material``'s entry, held under its lock (its shard folder made first)."""
        key = cache_key(material)
        folder = self.entry_dir(key)
        store_folders(self.cache_root, folder.parent, self.name)
        with entry_lock(folder, self.name):
            yield key, folder

    def read(self, folder: Path, key: str, material: dict, check: Callable[[dict], tuple[Any, str | None]]) -> Any:
        """The entry's value, ``check(meta)``'s ``(value, None)``, once its meta.json is proven this entry's and of
        this store's format; None when there is none (``unfinished``), or when it is damaged (``check``'s
        ``(None, problem)``, or a file that cannot be read): reported and removed (``discard_entry``)."""
        meta, problem = entry_meta(folder, key, material)
        if meta is None and problem is None:
            self.unfinished(folder)
            return None
        value = None
        try:
            if problem is None and meta.get("format") != self.format:
                problem = f"format {meta.get('format')!r}, this version reads format {self.format}"
            if problem is None:
                value, problem = check(meta)
        except UNREADABLE as err:
            problem = unreadable(err)
        if problem:
            discard_entry(folder, self.name, problem)
            return None
        return value

    def unfinished(self, folder: Path) -> None:
        """An entry without meta.json (none yet, or a write that never finished): nothing in it is trusted."""
        clear_path(folder)

    def write(self, folder: Path, key: str, material: dict, info: dict, save: Callable[[Path], dict],
              fresh: bool = True) -> dict:
        """Write the entry: ``save(folder)`` writes its data files (each atomically) and gives what meta.json
        records of them; meta.json (key, format, info, material, those records, the time) is written last, so an
        entry with meta.json is complete. ``fresh``: the folder is emptied first. Returns the meta."""
        if fresh:
            clear_path(folder)
            folder.mkdir(parents=True)
        meta = {"key": key, "format": self.format, "info": info, "material": material, **save(folder)}
        meta.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
        atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))
        return meta

    def store_or_keep(self, folder: Path, write: Callable[[], Any]) -> Any:
        """``write()``'s result; when the cache cannot be written (a full disk, a read-only cache: an OSError),
        the entry is removed, a warning says so and the job goes on with what it computed: None."""
        try:
            return write()
        except OSError as err:
            clear_path(folder)
            log.warning("could not store %s in %s (%s); going on without storing it", self.what, folder,
                        err.strerror or err)
            return None

    def describe(self, meta: dict) -> dict:
        """What ``fusebench-cache list`` shows of a complete entry beside its key, size and state."""
        return {"model": (meta.get("info") or {}).get("model", ""), "created": meta.get("created")}

    def data_files(self, meta: dict) -> dict[str, dict]:
        """An entry's data files: name -> its record in meta.json (``bytes`` and ``crc32`` or ``sha256``)."""
        raise NotImplementedError

    def entries(self, verify: bool = True, progress: Callable[[int], None] | None = None) -> list[dict]:
        """Every entry, as ``fusebench-cache`` lists it (``scan_entries``)."""
        return scan_entries(self.root, self.describe, self.data_files, kind=self.kind, verify=verify,
                            progress=progress)


STORES: Registry[type[Store]] = Registry("fusebench.stores", "store", "fusebench-cache")
