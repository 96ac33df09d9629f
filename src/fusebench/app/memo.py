"""What a process derives from a read-only array, computed once while the array lives.

A sweep on Hydra's basic launcher runs every job in one process, and most of its jobs take the same
models: a sim model's rows come from the same in-memory arrays every job (``encoders.sim``), and so
its normalised rows and the digests that key its stored lists can be derived once, not once per job
(~0.3 s a job for two COCO-size models: normalising ~260 MB and hashing it).

Only read-only arrays are remembered (``flags.writeable`` False: fusebench's arrays that are shared
between jobs are made read-only so that nothing can change them in place). A writable array is derived
afresh every time, since its contents may change under the same object. An entry is dropped when its
array is garbage-collected, so the memo holds nothing its arrays do not already keep alive (the values
themselves aside: those live as long as the array does).

``FileReads`` keeps what a process read from a file (an embedding-cache entry's rows, a list-store entry's
lists) for its next job while the file is unchanged, so that those jobs get the same read-only arrays.
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from fusebench.stores.files import file_identity

T = TypeVar("T")
_DERIVED: dict[tuple[int, str], tuple[weakref.ref, object]] = {}  # (id(array), what) -> (ref to array, value)


def known(array: np.ndarray, what: str):
    """The value remembered under ``what`` for this very ``array``, or None."""
    found = _DERIVED.get((id(array), what))
    if found is None or found[0]() is not array:
        return None
    return found[1]


def remember(array: np.ndarray, what: str, value: object) -> None:
    """Remember ``value`` under ``what`` while ``array`` lives, if it is read-only (else nothing is kept)."""
    if array.flags.writeable:
        return
    key = (id(array), what)
    _DERIVED[key] = (weakref.ref(array, functools.partial(_forget, key)), value)


def derived(array: np.ndarray, what: str, compute: Callable[[np.ndarray], T]) -> T:
    """``compute(array)``, remembered under ``what`` for as long as a read-only ``array`` lives."""
    found = known(array, what)
    if found is not None:
        return found
    value = compute(array)
    remember(array, what, value)
    return value


def _forget(key: tuple[int, str], ref: weakref.ref, entries: dict = _DERIVED) -> None:
    """Drop the entry of a collected array (no globals: at exit they may be gone before the arrays are)."""
    found = entries.get(key)
    if found is not None and found[0] is ref:  # not a newer array that took the same id since
        del entries[key]


def nbytes(value) -> int:
    """Bytes held by an array, or by the arrays of a dict."""
    return sum(a.nbytes for a in value.values()) if isinstance(value, dict) else value.nbytes


class FileReads:
    """What a process read from files, kept for its next job while each file is unchanged (same device, inode,
    size and modification time: ``files.file_identity``): at most ``budget`` bytes in all, an entry up to half
    of it, least recently used first out. ``read(path)`` must return read-only arrays (or a dict of them):
    every job that reads the file gets the same objects."""

    def __init__(self, budget: int):
        self.budget = budget
        self.entries: OrderedDict[tuple, object] = OrderedDict()

    def get(self, path: Path, read: Callable[[Path], T]) -> T:
        identity = file_identity(path)
        if identity in self.entries:
            self.entries.move_to_end(identity)
            return self.entries[identity]  # type: ignore[return-value]
        value = read(path)
        if nbytes(value) <= self.budget // 2:
            self.entries[identity] = value
            while sum(nbytes(v) for v in self.entries.values()) > self.budget:
                self.entries.popitem(last=False)
        return value


def read_only(array: np.ndarray) -> np.ndarray:
    """``array``, made read-only (in place), for arrays shared between jobs."""
    array.setflags(write=False)
    return array


def clear() -> None:
    """Forget everything (tests: derive again, as a new process would)."""
    _DERIVED.clear()
