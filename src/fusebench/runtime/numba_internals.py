"""numba's private cache API, used here only: a kernel's disk cache with more in its key than numba puts there.

numba keys a cached function on its own file, bytecode, closure, signature, CPU and numba's version; its public
API (``cache=True`` on its jit decorator, ``$NUMBA_CACHE_DIR``, ``Dispatcher.stats``: ``cache_path``, ``cache_hits``,
``cache_misses``) offers no way to add to that key, which :mod:`fusebench.runtime.jit` needs (a digest of every
kernel source, so an inlined helper's change compiles again). What this module relies on, none of it public:

- ``numba.core.caching.FunctionCache`` (what ``cache=True`` installs), subclassed, and its method
  ``_index_key(self, sig, codegen) -> tuple``, extended by one element;
- a dispatcher's ``_cache`` attribute, set to that cache (as ``Dispatcher.enable_caching`` sets it).

Checked against numba 0.68.1 (``CHECKED``). ``tests/test_numba_internals.py`` checks the installed numba against
these names (failing with numba's version and the name when they change) and that a kernel's key holds the
extra element; ``tests/test_kernel_cache.py`` that a change to it compiles again. Where numba keeps the kernels
is read through the public ``Dispatcher.stats.cache_path``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

CHECKED = ("0.68.1",)  # the numba versions this module was checked against


class KeyedCache(FunctionCache):
    """numba's per-function disk cache, with ``extra()`` (a string) as the last element of each entry's key."""

    def __init__(self, py_func, extra: Callable[[], str]):
        super().__init__(py_func)
        self._extra = extra

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), self._extra())


def cache_with_key(dispatcher, function, extra: Callable[[], str]):
    """``dispatcher`` (numba's, of ``function``) cached on disk under numba's key plus ``extra()``."""
    dispatcher._cache = KeyedCache(function, extra)
    return dispatcher


def keyed(dispatcher) -> bool:
    """Whether ``dispatcher`` is cached under a :class:`KeyedCache`."""
    return isinstance(getattr(dispatcher, "_cache", None), KeyedCache)


def index_key(dispatcher, sig, codegen) -> tuple:
    """The key ``dispatcher``'s disk cache files ``sig`` under (for tests)."""
    return dispatcher._cache._index_key(sig, codegen)


def shape_problems() -> list[str]:
    """What in the installed numba differs from what this module relies on: one line per name, naming numba's
    version. Empty when it matches."""
    import numba

    where = f"numba {numba.__version__} (fusebench.runtime.numba_internals was checked against {', '.join(CHECKED)})"
    problems = []
    index = getattr(FunctionCache, "_index_key", None)
    if index is None:
        problems.append(f"{where}: numba.core.caching.FunctionCache._index_key is gone")
    elif list(inspect.signature(index).parameters) != ["self", "sig", "codegen"]:
        problems.append(f"{where}: FunctionCache._index_key{inspect.signature(index)} is not (self, sig, codegen)")
    if list(inspect.signature(FunctionCache.__init__).parameters)[:2] != ["self", "py_func"]:
        problems.append(f"{where}: FunctionCache{inspect.signature(FunctionCache.__init__)} does not take py_func first")
    source = inspect.getsource(Dispatcher.enable_caching) if hasattr(Dispatcher, "enable_caching") else ""
    if "self._cache = FunctionCache(" not in source:
        problems.append(f"{where}: Dispatcher.enable_caching no longer sets self._cache = FunctionCache(...)")
    stats = getattr(Dispatcher, "stats", None)
    if not isinstance(stats, property) or "cache_path" not in inspect.getsource(stats.fget):
        problems.append(f"{where}: Dispatcher.stats (public) no longer gives cache_path")
    return problems
