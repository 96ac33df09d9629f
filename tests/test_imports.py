"""A module's dependencies stand at its top (issue 40, item 8). A fusebench module imported inside a function is
one of two kinds, and its line says which with a ``# lazy:`` comment that this test checks against the code:

- ``# lazy: heavy``: the imported module brings a heavy library (``HEAVY``: torch, numba, matplotlib, an engine,
  ...; numpy and tqdm too where the importer is loaded at a command's start or by a registry's scan) with it at
  import, itself or through the fusebench modules it imports at its top, that the importer does not load at its
  own top;
- ``# lazy: cycle``: the imported module, at its top (directly or through others), imports the importer, so a
  top-level import would be a circle. A module that makes a ``Registry`` of a plugin package counts as importing
  every plugin module of it (the registry scans them on first read, which may be while that module loads).

Any other function-level import of a fusebench module belongs at the top. Static: the files are read, not run.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import fusebench

PACKAGE = Path(fusebench.__file__).resolve().parent
SRC = PACKAGE.parent
HEAVY = {"torch", "numba", "llvmlite", "scipy", "matplotlib", "transformers", "open_clip", "wandb", "pandas",
         "sklearn", "skimage", "faiss", "pymilvus", "milvus_lite", "lancedb", "qdrant_client", "sentence_transformers",
         "datasets", "pyarrow", "PIL", "submitit", "joblib"}
LAZY = re.compile(r"#\s*lazy:\s*(heavy|cycle)\b")
OURS = ("fusebench", "hydra_plugins")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def files() -> dict[str, Path]:
    return {module_name(p): p for root in OURS for p in sorted((SRC / root).rglob("*.py"))}


def _targets(node: ast.AST) -> list[str]:
    """The modules an import statement imports (``from a import b``: ``a``, and ``a.b`` when that is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files()]
        return [*subs, *([node.module] if len(subs) < len(node.names) else [])]
    return []


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING" or (
        isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")


def _top_statements(body: list[ast.stmt]):
    """A module's statements run at import: its body, and the bodies of top-level if/try/with (not TYPE_CHECKING)."""
    for node in body:
        yield node
        if isinstance(node, ast.If) and not _is_type_checking(node):
            yield from _top_statements(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_statements(node.body + node.orelse + node.finalbody +
                                       [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.With):
            yield from _top_statements(node.body)


@functools.cache
def top_imports(name: str, scans: bool = True) -> frozenset[str]:
    """Every module ``name`` imports when it is imported (its own top, its packages' ``__init__``; with ``scans``,
    the plugin modules of a registry it makes, which it may scan while it loads)."""
    tree = ast.parse(files()[name].read_text(encoding="utf-8"))
    found = set()
    for node in _top_statements(tree.body):
        for target in _targets(node):
            found.update(_with_parents(target))
    found.update(_with_parents(name)[:-1])
    if scans:
        found.update(_scanned(tree, name))
    found.discard(name)
    return frozenset(found)


def _scanned(tree: ast.Module, name: str) -> set[str]:
    """The plugin modules a ``Registry(PACKAGE, ...)`` made at this module's top may import when it is first read
    (counted as imported at the top: a registry read while its module loads scans then)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Registry" and node.args:
            first = node.args[0]
            package = (first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else
                       name if isinstance(first, ast.Name) and first.id == "__name__" else None)
            if package:
                out.update(m for m in files() if m.startswith(package + "."))
    return out


@functools.cache
def closure(name: str, scans: bool = True) -> frozenset[str]:
    """Every module importing ``name`` imports, through the top-level imports of ours (with ``scans``: and the
    plugin modules of the registries they make; a circle through a scan is a circle, but a plugin's weight is not
    counted, since plugins keep their top level light and are scanned on first read: tests/test_startup.py)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        for target in top_imports(current, scans) if current in files() else ():
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return frozenset(seen)


@functools.cache
def plugin_packages() -> frozenset[str]:
    """The packages a ``Registry`` scans (their modules are plugins)."""
    found = set()
    for name, path in files().items():
        for module in _scanned(ast.parse(path.read_text(encoding="utf-8")), name):
            found.add(module.rsplit(".", 1)[0])
    return frozenset(found)


def is_plugin(name: str) -> bool:
    """``name`` is imported when a registry scans its plugins: a plugin module, or one a plugin imports at its top."""
    plugins = [m for m in files() if m.rsplit(".", 1)[0] in plugin_packages()]
    return any(name == p or name in closure(p, scans=False) for p in plugins)


# what a command imports before it knows a job will run (Hydra imports the callback and every plugin at start): numpy
# and tqdm count as heavy there too (tests/test_startup.py: `fusebench --help` loads neither)
START = ("fusebench.app.cli", "fusebench.app.callback", "fusebench.app.cache_cli", "fusebench.report.cli",
         "hydra_plugins.fusebench_sweeper.sweeper")


def _libraries(name: str) -> set[str]:
    return {m.split(".")[0] for m in closure(name, scans=False) | {name}}


def heavy_libraries(target: str, importer: str) -> set[str]:
    """The heavy libraries importing ``target`` brings that ``importer`` does not already load at its top (numpy and
    tqdm count for a module a command's start or a registry's scan loads)."""
    heavy = HEAVY | {"numpy", "tqdm"} if importer in START or is_plugin(importer) else HEAVY
    return (_libraries(target) & heavy) - _libraries(importer)


def lazy_imports() -> list[tuple[str, int, tuple[str, ...], str]]:
    """(importer, line, the modules of ours it imports, the statement's text) for each import inside a function."""
    out = []
    for name, path in files().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                ours = tuple(t for t in _targets(node) if t.split(".")[0] in OURS)
                if ours:
                    out.append((name, node.lineno, ours, " ".join(lines[node.lineno - 1:node.end_lineno])))
    return sorted(set(out))


def _verdict(importer: str, targets: tuple[str, ...], line: str) -> str | None:
    """What is wrong with one function-level import statement (None: nothing); one reason covers the statement
    when it holds for one of the modules it imports."""
    reason = LAZY.search(line)
    heavy = any(heavy_libraries(t, importer) for t in targets)
    cycle = any(importer in closure(t) for t in targets)
    named = ", ".join(targets)
    if reason is None:
        why = "cycle" if cycle else "heavy" if heavy else None
        return (f"imports {named} inside a function without a '# lazy:' reason"
                + (f" (it could say '# lazy: {why}')" if why else ": move it to the top"))
    if reason.group(1) == "heavy" and not heavy:
        return (f"says '# lazy: heavy' but {named} brings no heavy library {importer} does not load at its top: "
                + ("say '# lazy: cycle'" if cycle else "move it up"))
    if reason.group(1) == "cycle" and not cycle:
        return f"says '# lazy: cycle' but {named} does not import {importer} at its top: move it up"
    return None


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_every_function_level_import_of_ours_says_why_and_is_right():
    wrong = [f"{files()[imp].relative_to(SRC)}:{line}: {problem}" for imp, line, targets, text in lazy_imports()
             if (problem := _verdict(imp, targets, text))]
    assert not wrong, f"{len(wrong)} function-level imports to mend:\n" + "\n".join(wrong)


def test_the_checker_sees_heavy_modules_and_cycles():
    assert "torch" in heavy_libraries("fusebench.search.exact", "fusebench.app.cli")  # torch at its top
    assert not heavy_libraries("fusebench.search.exact", "fusebench.search.model_lists")  # which loads torch itself
    assert "numpy" in heavy_libraries("fusebench.report.runs", "fusebench.app.callback")  # at a command's start
    assert not heavy_libraries("fusebench.report.runs", "fusebench.report.sweep")
    assert not heavy_libraries("fusebench.runtime.checks", "fusebench.app.cli")
    assert "fusebench.runtime.checks" in closure("fusebench.runtime.plugins")
    assert _verdict("fusebench.app.cli", ("fusebench.runtime.checks",), "    from x import y") is not None
    assert _verdict("fusebench.app.cli", ("fusebench.search.exact",), "    import y  # lazy: heavy (torch)") is None
    assert "move it up" in _verdict("fusebench.app.cli", ("fusebench.runtime.checks",), "import y  # lazy: heavy")
