"""What one fusebench process keeps from one job to the next: one ``ProcessState``, in one place.

Hydra's basic launcher runs the jobs of a sweep one after another in one process. What a job leaves for the jobs
after it lives in the ``ProcessState`` that ``current()`` returns, and nowhere else (no module keeps state of its
own): the similarity blocks computed so far (each job records its own count), whether Ctrl-C was pressed, the
plots already drawn, the checksums of files already verified, and the simulated models' rows with what is derived
from them. Each optimisation kept here saves a 30-job sweep more than 3% of its time (measured with
scripts/bench_sweep.py's ablation). A process has one state, made on first use; tests start a fresh one (``start``)
where a new process would.

This module imports nothing of fusebench (every stage may read the state without an import cycle) and nothing heavy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path


@dataclass
class SharedArrays:
    """Read-only arrays kept for the next jobs (a sim model's rows: ``encoders.simulated``; ~0.25 s a model and job),
    at most ``budget`` bytes in all and ``entry_budget`` an entry, least recently used out first; and what is
    derived from them (their normalised rows, store-key digests: ``derived``), dropped with them. The arrays are
    held, not watched: no weakref callback runs (where Python would drop a Ctrl-C), and an array's ``id`` cannot be
    taken by another while its values are remembered. Values are remembered only for the arrays of a kept entry
    and the read-only arrays derived from them; anything else is derived afresh every time."""

    budget: int = 768 << 20
    entry_budget: int = 256 << 20
    entries: OrderedDict[str, tuple] = field(default_factory=OrderedDict)  # key -> its arrays
    owners: dict[int, tuple[Any, str]] = field(default_factory=dict)  # id(array) -> (array, its entry's key)
    values: dict[tuple[int, str], Any] = field(default_factory=dict)  # (id(array), what) -> value

    def get(self, key: str, make: Callable[[], tuple]) -> tuple:
        """The arrays kept under ``key``, else ``make()`` (read-only arrays), kept when they fit."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        arrays = make()
        if sum(a.nbytes for a in arrays) <= self.entry_budget:
            self.entries[key] = arrays
            self._own(arrays, key)
            while sum(a.nbytes for kept in self.entries.values() for a in kept) > self.budget:
                self._drop(next(iter(self.entries)))
        return arrays

    def known(self, array, what: str):
        """The value remembered under ``what`` for this very ``array``, or None."""
        return self.values.get((id(array), what)) if self._owner(array) is not None else None

    def remember(self, array, what: str, value) -> None:
        """Remember ``value`` for ``array`` if the array is kept (else nothing); read-only arrays in ``value``
        join its entry, so that what is derived from them is remembered too."""
        owner = self._owner(array)
        if owner is not None:
            self.values[(id(array), what)] = value
            self._own([v for v in (value if isinstance(value, tuple) else (value,))
                       if hasattr(v, "flags") and not v.flags.writeable], owner)

    def derived(self, array, what: str, compute: Callable[[Any], Any]):
        """``compute(array)``, remembered under ``what`` while ``array`` is kept."""
        found = self.known(array, what)
        if found is None:
            found = compute(array)
            self.remember(array, what, found)
        return found

    def _owner(self, array) -> str | None:
        owned = self.owners.get(id(array))
        return owned[1] if owned is not None and owned[0] is array else None

    def _own(self, arrays, key: str) -> None:
        for array in arrays:
            self.owners.setdefault(id(array), (array, key))

    def _drop(self, key: str) -> None:
        del self.entries[key]
        gone = {i for i, (_, owner) in self.owners.items() if owner == key}
        self.owners = {i: owned for i, owned in self.owners.items() if i not in gone}
        self.values = {k: v for k, v in self.values.items() if k[0] not in gone}


@dataclass
class ProcessState:
    similarity_blocks: int = 0  # similarity blocks computed in this process (search.exact.similarity)
    ctrl_c: bool = False  # Ctrl-C was pressed (app.interrupts): no further job starts, no outputs are written
    written: list[str] = field(default_factory=list)  # run dirs whose results this process swapped in (report.outputs)
    # plots drawn: digest of a plot's inputs -> (a PNG this process drew, its file identity) (report.plots)
    drawn: dict[str, tuple[Path, tuple]] = field(default_factory=dict)
    # file checksums computed or written: (kind, device, inode, size, mtime_ns) -> checksum (stores.files)
    checksums: dict[tuple[str, int, int, int, int], str] = field(default_factory=dict)
    shared: SharedArrays = field(default_factory=SharedArrays)
    # webdataset shards read from: tar path -> its image members' offsets and, if still open, its file (data.tar_shards)
    tars: dict[str, Any] = field(default_factory=dict)
    # a job this process runs fuses whole rankings (fusion.top_k null; set by the sweeper for its batch): a list pass
    # also stores the score matrices that job reads (backends.retrieval)
    whole_rankings_ahead: bool = False


_STATE = [ProcessState()]  # the one state of this process: read with current(), replaced by start()


def current() -> ProcessState:
    """This process's state."""
    return _STATE[0]


def start() -> ProcessState:
    """A fresh state for this process, as a new process would have (tests)."""
    _STATE[0] = ProcessState()
    return _STATE[0]
