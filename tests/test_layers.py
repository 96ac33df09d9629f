"""Layers point one way: every package has its place in ``LAYERS`` and imports only packages placed below it
(so the package graph has no cycle), nothing below ``app/`` imports it, and the bottom layer (``runtime/``, the
package's ``__init__``) imports no other fusebench package. Every import counts, a lazy one inside a function as
much as one at the top."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import fusebench

PACKAGE = Path(fusebench.__file__).resolve().parent
TOP = "(top)"  # fusebench/__init__.py and any module directly in fusebench/
# bottom to top: a package may import the ones before it, never one after it. search is the pure kernels and the
# ranked-list type; fusion is math over lists; config holds every group's typed form (FusionConfig is fusion's);
# stores, data and encoders turn files into embeddings; evaluation scores lists; library is the plain-array functions over
# search, fusion and evaluation (no Hydra, no files); backends answer queries through an
# index or an engine; report reads run dirs; app orchestrates (the CLI, the Python API, the pipeline).
LAYERS = ("runtime", "search", "fusion", "config", "stores", "data", "encoders", "evaluation", "library", "backends", "report",
          "app")
# imports that still point up (to be moved: issue 30), file -> the packages above it that it imports
NOT_YET: dict[str, set[str]] = {}
KNOWN_CYCLES: set[frozenset[str]] = set()  # none: LAYERS orders every package


def package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else TOP


def _nodes(path: Path):
    """Every node of the file, less the body of the package's ``__getattr__`` in ``fusebench/__init__.py``: the
    API hook (``fusebench.evaluate``) that points at the top layer, ``app.api``, on first use. Anything else in
    ``__init__`` is the bottom layer and is checked like it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if path == PACKAGE / "__init__.py":
        hooks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
        assert len(hooks) <= 1
        for hook in hooks:
            tree.body.remove(hook)
            assert all(isinstance(n, ast.ImportFrom) and n.module == "fusebench.app" and [a.name for a in n.names]
                       == ["api"] for n in ast.walk(hook) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return ast.walk(tree)


def imported_packages(path: Path) -> set[str]:
    """The fusebench packages ``path`` imports (any import statement anywhere in the file)."""
    stat = path.stat()
    return set(_imported_packages(path, stat.st_mtime_ns, stat.st_size))


@functools.cache
def _imported_packages(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    """imported_packages, each file parsed once per session (per version of it: the key holds its mtime and size)."""
    found = set()
    for node in _nodes(path):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else
                 [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "fusebench":
                found.add(parts[1] if len(parts) > 1 else TOP)
        if isinstance(node, ast.ImportFrom) and node.module == "fusebench":  # from fusebench import state, ...
            found |= {a.name for a in node.names if (PACKAGE / a.name).is_dir()}
    return frozenset(found)


def graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the files that import it."""
    out: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = package_of(path)
        for target in imported_packages(path) - {source}:
            out.setdefault(source, {}).setdefault(target, []).append(str(path.relative_to(PACKAGE)))
    return out


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one package."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_nothing_below_app_imports_app():
    offenders = {source: files for source, targets in graph().items() if source != "app"
                 for target, files in targets.items() if target == "app"}
    assert offenders == {}, f"modules below app/ that import it: {offenders}"


def test_the_bottom_layer_imports_no_other_package():
    targets = graph()
    for bottom in ("runtime", TOP):
        above = {t: f for t, f in targets.get(bottom, {}).items() if t not in ("runtime", TOP)}
        assert above == {}, f"{bottom} imports {above}"


def test_every_package_imports_only_the_layers_below_it():
    placed = set(LAYERS) | {TOP}
    packages = {package_of(p) for p in PACKAGE.rglob("*.py")}
    assert packages <= placed, f"packages with no place in LAYERS: {sorted(packages - placed)}"
    level = {name: i for i, name in enumerate(LAYERS)} | {TOP: 0}
    upward, still = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source, rel = package_of(path), str(path.relative_to(PACKAGE))
        above = {t for t in imported_packages(path) if level[t] > level[source]}
        (still if rel in NOT_YET else upward).update({rel: above} if above else {})
    assert upward == {}, f"imports that point up the layers: {upward}"
    assert still == NOT_YET, f"NOT_YET is out of date: the files' upward imports are now {still}"


def test_package_cycles_are_exactly_the_known_ones():
    edges = {source: set(targets) for source, targets in graph().items()}
    cycles = {frozenset(c) for c in strongly_connected(edges)}
    assert cycles == KNOWN_CYCLES, (f"package cycles now: {[sorted(c) for c in cycles]}; "
                                    f"listed: {[sorted(c) for c in KNOWN_CYCLES]}")


def test_the_cycle_finder_against_a_hand_made_graph():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(map(sorted, strongly_connected(edges))) == [["a", "b", "c"], ["e", "f"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_no_module_imports_relatively():
    """The layer graph reads absolute imports (``from fusebench.app import x``); a relative one (``from ..app import
    x``) would slip past it, so there are none."""
    relative = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
                for node in _nodes(path) if isinstance(node, ast.ImportFrom) and node.level > 0]
    assert not relative, f"relative imports (write them absolute): {relative}"
