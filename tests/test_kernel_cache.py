"""The numba kernels' disk cache can never hand back stale machine code, and the warm-up covers every kernel.

numba keys a cached kernel on its own file only; ``fusebench.runtime.jit`` adds a digest of every kernel source,
so a change to a helper that another file inlines (``row_kernels`` inlines ``topk_kernels``' heaps) compiles
again instead of loading the old code."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fusebench.runtime import jit, numba_internals
from fusebench.search import warmup

PACKAGE = Path(jit.__file__).resolve().parents[1]


def numba_modules() -> set[str]:
    """Package files (relative to the package) that import numba."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "numba" or n.startswith("numba.") for n in names):
                found.add(path.relative_to(PACKAGE).as_posix())
    return found


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_every_kernel_source_is_in_the_cache_key():
    kernel_files = {name for name in jit.KERNEL_SOURCES}
    assert all((PACKAGE / name).is_file() for name in kernel_files)
    # a module that compiles kernels is in the digest (warmup.py only compiles the others, by name)
    assert numba_modules() - {"search/warmup.py"} <= kernel_files
    for name in kernel_files - {"runtime/jit.py"}:  # kernels come from jit.kernel, never numba.njit directly
        assert "njit" not in (PACKAGE / name).read_text(encoding="utf-8"), name


def test_every_cached_kernel_uses_the_full_key_and_the_warm_up_names_them_all():
    cached = {}
    for name in jit.KERNEL_SOURCES:
        module = __import__("fusebench." + name[:-3].replace("/", "."), fromlist=["_"])
        for attr, value in vars(module).items():
            if getattr(value, "_cache", None) is not None and getattr(value, "py_func", None) is not None \
                    and value.py_func.__module__ == module.__name__ and type(value._cache).__name__ != "NullCache":
                cached[f"{module.__name__}.{attr}"] = value
    assert cached and all(numba_internals.keyed(d) for d in cached.values())
    assert set(warmup.SIGNATURES) == set(cached)  # the warm-up compiles every cached kernel


def test_the_cache_key_holds_the_digest_of_every_kernel_source(monkeypatch):
    from fusebench.search.topk_kernels import finish

    codegen = finish.targetctx.codegen()
    signature = tuple(warmup.numba_type(code) for code in warmup.SIGNATURES["fusebench.search.topk_kernels.finish"][0])
    key = numba_internals.index_key(finish, signature, codegen)
    assert key[-1] == jit.sources_digest()
    monkeypatch.setattr(jit, "sources_digest", lambda: "another")
    assert numba_internals.index_key(finish, signature, codegen) != key


@pytest.mark.slow
def test_a_change_to_an_inlined_helper_in_another_file_compiles_again(tmp_path):
    """The package copied to ``tmp_path``: a kernel of row_kernels is compiled and cached, loaded from the cache
    by the next process, and compiled again once topk_kernels.py (whose helper it inlines) changes."""
    copy = tmp_path / "src" / "fusebench"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "conf"))
    env = {**os.environ, "PYTHONPATH": str(copy.parent), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    probe = ("import json, numpy as np, fusebench.search.row_kernels as rk\n"
             f"assert rk.__file__.startswith({str(copy)!r})\n"
             "value = float(rk._row_floor(np.arange(8, dtype=np.float32), 3))\n"
             "stats = rk._row_floor.stats\n"
             "print(json.dumps([value, sum(stats.cache_hits.values()), sum(stats.cache_misses.values())]))")

    def run():
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first[1:] == [0, 1] and second[1:] == [1, 0]  # compiled, then loaded
    topk = copy / "search" / "topk_kernels.py"
    topk.write_text(topk.read_text(encoding="utf-8") + "\n# a change in the file whose helpers row_kernels inlines\n",
                    encoding="utf-8")
    third = run()
    assert third[1:] == [0, 1] and third[0] == first[0]  # compiled again, not the stale code
