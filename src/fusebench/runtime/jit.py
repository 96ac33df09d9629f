"""Numba compilation of fusebench's kernels: the ``kernel`` decorator every compiled kernel uses, and its disk cache.

A kernel is compiled once per machine and kept on disk (numba's ``cache=True``): in the package's ``__pycache__``
folders when they are writable (a checkout, an editable install), else in ``$NUMBA_CACHE_DIR`` when set, else in
numba's user-wide cache (``~/.cache/numba``). ``python -m fusebench.search.warmup`` (``fusebench-warmup``, the last
step of ``make``'s venv) compiles every kernel there at install time, so that a user's first run does not.

numba keys a cached kernel on the content of the file that defines it, its bytecode, its signature, the CPU and
numba's version, but not on the helpers it inlines from other files (``row_kernels`` inlines ``topk_kernels``'
heap functions) nor on settings imported from them (``FAST``): after such a change numba would load the stale
machine code and give other numbers. ``kernel`` therefore adds a digest of every kernel source file
(``KERNEL_SOURCES``) to the cache key: any change to any of them compiles every kernel again. numba offers no
public way to do that; the private names it takes are in :mod:`fusebench.runtime.numba_internals`, and only there.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba import njit

from fusebench.runtime.numba_internals import cache_with_key

PACKAGE = Path(__file__).resolve().parents[1]
# every file of the package that defines or inlines a compiled kernel, or makes its cache key (tests/test_kernel_cache.py
# checks the list)
KERNEL_SOURCES = ("runtime/jit.py", "runtime/numba_internals.py", "search/topk_kernels.py", "search/row_kernels.py",
                  "encoders/rownorm.py")


@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """sha256 over every kernel source file, in ``KERNEL_SOURCES`` order (read once per process)."""
    digest = hashlib.sha256()
    for name in KERNEL_SOURCES:
        digest.update(name.encode() + b"\0" + (PACKAGE / name).read_bytes() + b"\0")
    return digest.hexdigest()


def kernel(*, cache: bool = False, **options):
    """``numba.njit(**options)``; with ``cache=True``, cached on disk under numba's key plus
    :func:`sources_digest` (:mod:`fusebench.runtime.numba_internals`: numba has no public way to extend the key)."""
    def decorate(function):
        dispatcher = njit(**options)(function)
        return cache_with_key(dispatcher, function, lambda: sources_digest()) if cache else dispatcher
    return decorate
