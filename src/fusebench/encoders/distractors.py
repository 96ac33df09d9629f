"""A model's distractor rows: the gallery images past the test split's, read a range at a time.

Galleries of a million images never sit whole in memory: the search streams them through the item axis of its
tiles (:mod:`fusebench.search.gallery_search`). Every source of distractor rows (simulated, the embedding shards
of a real model, a clip-retrieval dump, an array in memory) gives the same :class:`DistractorRows` interface:
``n`` rows of width ``dim``; ``read(start, stop)`` the rows ``start:stop`` as float32, L2-normalised exactly as
:func:`fusebench.encoders.rownorm.l2_normalise_rows` normalises the test images' rows, C-contiguous; ``key`` a
JSON-able description of exactly what the rows are (what store keys hash, so lists computed over one gallery are
never read for another).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from fusebench.encoders.rownorm import l2_normalise_rows
from fusebench.stores.files import array_digest


@runtime_checkable
class DistractorRows(Protocol):
    n: int
    dim: int

    @property
    def key(self) -> dict: ...

    def read(self, start: int, stop: int) -> np.ndarray: ...


def normalised(rows: np.ndarray) -> np.ndarray:
    """Raw rows as the evaluator takes them: float32, L2-normalised (the test images' rule), C-contiguous."""
    out = l2_normalise_rows(np.asarray(rows, dtype=np.float32))[0]
    return np.ascontiguousarray(out, dtype=np.float32)


class ArrayRows:
    """Distractor rows held in memory (tests, small galleries): ``rows`` raw, normalised here once."""

    def __init__(self, rows: np.ndarray, label: str = "array"):
        self.rows = normalised(rows)
        self.n, self.dim = self.rows.shape
        self._key = {"kind": "array", "label": label, "sha256": array_digest(self.rows)}

    @property
    def key(self) -> dict:
        return self._key

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.rows[start:stop]


class KeptRows:
    """The rows of ``base`` at the ascending positions ``keep`` (the distractors left after near-duplicates are
    dropped): row i here is row ``keep[i]`` there."""

    def __init__(self, base: DistractorRows, keep: np.ndarray):
        self.base, self.keep = base, np.asarray(keep, dtype=np.int64)
        self.n, self.dim = int(self.keep.size), base.dim

    @property
    def key(self) -> dict:
        return {"kind": "kept", "base": self.base.key, "n": self.n, "keep_sha256": array_digest(self.keep)}

    def read(self, start: int, stop: int) -> np.ndarray:
        positions = self.keep[start:stop]
        if positions.size == 0:
            return np.empty((0, self.dim), dtype=np.float32)
        out = np.empty((positions.size, self.dim), dtype=np.float32)
        window = max(positions.size, 1024)  # rows of ``base`` read at once: memory stays bounded by the tile
        done = 0
        while done < positions.size:
            lo = int(positions[done])
            end = done + int(np.searchsorted(positions[done:], lo + window))
            out[done:end] = self.base.read(lo, int(positions[end - 1]) + 1)[positions[done:end] - lo]
            done = end
        return out


class FirstRows:
    """The first ``n`` rows of ``base`` (a gallery of ``size`` distractors out of a longer source)."""

    def __init__(self, base: DistractorRows, n: int):
        if n > base.n:
            raise ValueError(f"FirstRows: {n} rows asked of a source of {base.n}")
        self.base, self.n, self.dim = base, int(n), base.dim

    @property
    def key(self) -> dict:
        return {"kind": "first", "base": self.base.key, "n": self.n}

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.base.read(start, min(stop, self.n))
