"""The one registry shape (``runtime.plugins.Registry``): a package scan fills it, names come in order, a wrong
name is one message naming the key and every valid name, and a name registered twice is a bug."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from fusebench import FusebenchError
from fusebench.runtime.plugins import Registry


@dataclass(frozen=True)
class Thing:
    name: str
    order: int = 50


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    root = tmp_path / "things_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("from fusebench.runtime.plugins import Registry\n"
                                      "REGISTRY = Registry(__name__, 'thing', 'thing.kind')\n")
    (root / "b.py").write_text("from things_pkg import REGISTRY\nfrom tests.test_plugins import Thing\n"
                               "THING = REGISTRY.register(Thing('b'))\n")
    (root / "a.py").write_text("from things_pkg import REGISTRY\nfrom tests.test_plugins import Thing\n"
                               "THING = REGISTRY.register(Thing('a', order=60))\n")
    (root / "_helper.py").write_text("raise RuntimeError('a module starting with _ is not a plugin')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "things_pkg"
    for name in [m for m in sys.modules if m == "things_pkg" or m.startswith("things_pkg.")]:
        del sys.modules[name]


def test_a_package_scan_fills_the_registry_in_order(plugin_package):
    import things_pkg

    registry = things_pkg.REGISTRY
    assert registry.names() == ("b", "a")  # order 50 before 60, then by name
    assert "a" in registry and "c" not in registry and len(registry) == 2 and list(registry) == ["b", "a"]
    assert registry.get("a").order == 60


def test_a_wrong_name_lists_every_valid_one(plugin_package):
    import things_pkg

    with pytest.raises(FusebenchError, match=r"thing\.kind.*b, a"):
        things_pkg.REGISTRY.get("c")
    with pytest.raises(FusebenchError, match=r"thing\.kind"):
        things_pkg.REGISTRY.get(["a"])


def test_two_plugins_of_one_name_are_a_bug():
    registry = Registry("fusebench.runtime", "thing", "thing.kind")
    registry._scanned = True  # nothing to scan: the registry holds only what the test adds
    registry.register(Thing("x"))
    registry.register(registry.get("x"))  # the same object again is fine (a module imported twice)
    with pytest.raises(RuntimeError, match="two things are named 'x'"):
        registry.register(Thing("x"))
    registry.unregister("x")
    assert registry.names() == ()
