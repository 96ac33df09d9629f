"""The one registry shape every extension point shares (fusion methods, dataset kinds, model kinds, search backends,
plots): a :class:`Registry` names the package whose modules are its plugins, and fills itself on first use by
importing every module of that package whose name does not start with ``_`` (a package scan). A plugin module
registers one object that has a ``name`` (and, where its order matters, an ``order``) at import.

This is the bottom layer: the registry imports its plugins by their package's dotted name when it is first read,
so a layer below the plugins' package (the config schema, which lists the dataset kinds) can read the registry
without an import pointing up. Plugin modules keep their top level light (no torch, numba, matplotlib, engine
package): the CLI scans them to check a config before any heavy import.

Every list of names a user sees (the values a config key takes, the valid values a message lists, the docs tables,
the sweep report's factor order, the tests' parameters) is read from a registry here, never written beside it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from typing import Generic, TypeVar

from fusebench.runtime import checks

T = TypeVar("T")


class Registry(Generic[T]):
    """The plugins of one extension point, found by scanning ``package`` (its modules not starting with ``_``).

    ``what`` names one plugin for messages ("dataset kind"); ``key`` is the config key that selects one
    ("dataset.kind"), named in the message that lists the valid values."""

    def __init__(self, package: str, what: str, key: str):
        self.package = package
        self.what = what
        self.key = key
        self._items: dict[str, T] = {}
        self._scanned = False

    def register(self, item: T) -> T:
        """Add ``item`` (a plugin module calls it once, at import). Two plugins of one name are a bug, not a
        user's mistake."""
        name = item.name
        if self._items.get(name, item) is not item:
            raise RuntimeError(f"two {self.what}s are named {name!r}")
        self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's own plugin, once the test is done)."""
        self._items.pop(name, None)

    def scan(self) -> None:
        """Import every plugin module of the package once (registering each)."""
        if self._scanned:
            return
        self._scanned = True  # set first: a plugin module that reads the registry at import does not scan again
        package = importlib.import_module(self.package)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")

    def _sorted(self) -> list[T]:
        self.scan()
        return sorted(self._items.values(), key=lambda item: (getattr(item, "order", 50), item.name))

    def names(self) -> tuple[str, ...]:
        """The registered names, by each plugin's ``order`` (50 when it has none), then by name."""
        return tuple(item.name for item in self._sorted())

    def items(self) -> tuple[T, ...]:
        return tuple(self._sorted())

    def get(self, name) -> T:
        """The plugin ``name``; any other value is a FusebenchError naming ``key`` and the valid names (exit 2)."""
        checks.choice(name, self.key, self.names())
        return self._items[name]

    def __contains__(self, name) -> bool:
        self.scan()
        return isinstance(name, str) and name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self.scan()
        return len(self._items)
