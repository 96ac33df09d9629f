"""Distractor rows generated from a seed, a fixed block at a time, for streamed-search tests and scripts/bench_scale.py.

Row i is always the same whatever ranges are read: the rows of block b = i // BLOCK come from
``np.random.default_rng([seed, b])``. Each row is ``latent @ mix + noise * e`` with latent and e of independent
uniform entries of unit variance (``mix`` None: e alone), L2-normalised as the evaluator normalises rows. Every
read is logged, with the most rows its returned arrays held alive at once (``peak_live``), so a test can check
that a search reads each range once and holds one tile at a time.
"""

from __future__ import annotations

import weakref

import numpy as np

from fusebench.encoders.distractors import normalised


def _unit_variance(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Uniform entries of mean 0 and variance 1 (float32): several times cheaper to draw than Gaussian ones, and
    a row's projection through ``mix`` is close to Gaussian anyway."""
    return (rng.random(shape, dtype=np.float32) - np.float32(0.5)) * np.float32(12**0.5)


class SeededRows:
    """``n`` rows of width ``dim`` (a ``DistractorRows``), generated per block of ``BLOCK`` rows from ``seed``."""

    BLOCK = 4096

    def __init__(self, n: int, dim: int, seed: int, mix: np.ndarray | None = None, noise: float = 1.0):
        self.n, self.dim, self.seed = int(n), int(dim), int(seed)
        self.mix, self.noise = mix, float(noise)
        self.reads: list[tuple[int, int]] = []
        self.live = 0
        self.peak_live = 0

    @property
    def key(self) -> dict:
        return {"kind": "seeded", "n": self.n, "dim": self.dim, "seed": self.seed}

    def block(self, b: int) -> np.ndarray:
        """Rows ``b * BLOCK`` up to ``(b + 1) * BLOCK`` (fewer in the last block), normalised."""
        rows = min(self.BLOCK, self.n - b * self.BLOCK)
        rng = np.random.default_rng([self.seed, b])
        if self.mix is None:
            return normalised(_unit_variance(rng, (rows, self.dim)))
        raw = _unit_variance(rng, (rows, self.mix.shape[0])) @ self.mix
        raw += np.float32(self.noise) * _unit_variance(rng, (rows, self.dim))
        return normalised(raw)

    def read(self, start: int, stop: int) -> np.ndarray:
        stop = min(stop, self.n)
        self.reads.append((start, stop))
        if stop <= start:
            return np.empty((0, self.dim), dtype=np.float32)
        first, last = start // self.BLOCK, (stop - 1) // self.BLOCK
        rows = np.concatenate([self.block(b) for b in range(first, last + 1)])
        out = np.ascontiguousarray(rows[start - first * self.BLOCK: stop - first * self.BLOCK])
        self.live += len(out)
        self.peak_live = max(self.peak_live, self.live)
        weakref.finalize(out, self._released, len(out))
        return out

    def _released(self, rows: int) -> None:
        self.live -= rows

    def all_rows(self) -> np.ndarray:
        """Every row at once (small galleries only: the in-memory reference)."""
        return np.concatenate([self.block(b) for b in range(-(-self.n // self.BLOCK))]) if self.n else \
            np.empty((0, self.dim), dtype=np.float32)
