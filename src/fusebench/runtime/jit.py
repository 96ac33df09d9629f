"""Numba compilation of fusebench's kernels: the ``kernel`` decorator every compiled kernel uses, and its disk cache.

A kernel is compiled once per machine and kept on disk (numba's ``cache=True``): in the package's ``__pycache__``
folders when they are writable (a checkout, an editable install), else in ``$NUMBA_CACHE_DIR`` when set, else in
numba's user-wide cache (``~/.cache/numba``). ``python -m fusebench.search.warmup`` (``fusebench-warmup``, the last
step of ``make``'s venv) compiles every kernel there at install time, so that a user's first run does not.

numba keys a cached kernel on the content of the file that defines it, its bytecode, its signature, the CPU and
numba's version, but not on the helpers it inlines from other files (``row_kernels`` inlines ``topk_kernels``'
heap functions) nor on settings imported from them (``FAST``): after such a change numba would load the stale
machine code and give other numbers. ``kernel`` therefore adds a digest of every kernel source file
(``KERNEL_SOURCES``) to the cache key: any change to any of them compiles every kernel again.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba import njit
from numba.core.caching import FunctionCache

PACKAGE = Path(__file__).resolve().parents[1]
# every file of the package that defines or inlines a compiled kernel (tests/test_kernels.py checks the list)
KERNEL_SOURCES = ("runtime/jit.py", "search/topk_kernels.py", "search/row_kernels.py", "encoders/rownorm.py")


@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """sha256 over every kernel source file, in ``KERNEL_SOURCES`` order (read once per process)."""
    digest = hashlib.sha256()
    for name in KERNEL_SOURCES:
        digest.update(name.encode() + b"\0" + (PACKAGE / name).read_bytes() + b"\0")
    return digest.hexdigest()


class KernelCache(FunctionCache):
    """numba's per-function disk cache, with the digest of every kernel source in each entry's key."""

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), sources_digest())


def kernel(*, cache: bool = False, **options):
    """``numba.njit(**options)``; with ``cache=True``, cached on disk under :class:`KernelCache`'s key."""
    def decorate(function):
        dispatcher = njit(**options)(function)
        if cache:
            dispatcher._cache = KernelCache(function)  # what numba's enable_caching sets, with the fuller key
        return dispatcher
    return decorate
