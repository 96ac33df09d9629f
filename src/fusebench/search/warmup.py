"""Compile every numba kernel once, at install time: ``fusebench-warmup`` (``python -m fusebench.search.warmup``).

Compiling the kernels takes about a minute per few kernels on a 2-core CPU (the parallel ones most), which a
user's first run would otherwise pay: a default job took ~68 s the first time and ~3 s after. This compiles each
kernel for every signature fusebench calls it with (``SIGNATURES``) into numba's disk cache
(:mod:`fusebench.runtime.jit`), the kernels spread over the CPU's cores in separate processes; a kernel already
in the cache is loaded, not compiled. ``make`` runs it as the last step of its venv; after ``pip install`` run it
once (with ``NUMBA_CACHE_DIR`` set as the runs will have it, when the package folder is not writable).

A signature missing here is not an error: that kernel is compiled on first use and cached then (a test checks
that the default job and the test suite call no kernel with a signature missing here).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

# dtype code, ndim (0: a scalar), readonly: "f4:2" float32 2-d, "i8" int64 scalar, "f4:2:ro" read-only (a memmap)
F2, F1, I2, I1, B1 = "f4:2", "f4:1", "i8:2", "i8:1", "b1:1"
SIGNATURES: dict[str, list[tuple[str, ...]]] = {
    "fusebench.search.topk_kernels.offer_rows": [(F2, "i8", F2, I2, I1)],
    "fusebench.search.topk_kernels.offer_columns": [(F2, "i8", I1, F2, I2, I1, F1)],
    "fusebench.search.topk_kernels.offer_rows_count": [(F2, "i8", F2, I2, I1, F1, I1, I1)],
    "fusebench.search.topk_kernels.finish": [(F2, I2, I1)],
    "fusebench.search.topk_kernels.fuse_by_id": [(I2, F2, I1, "i8", "i8", "i8", I2, F2, I2)],
    "fusebench.search.row_kernels.row_mean_std": [(F2, "i8")],
    "fusebench.search.row_kernels.count_ahead": [(F2, F2, "b1", F1, F1, I1)],
    "fusebench.search.row_kernels._radix_order": [(F2, "i8", "i8", I2), (F2, "i8", "i8", "u2:2"),
                                                  (F2, "i8", "i8", "i4:2")],
    "fusebench.search.row_kernels.scatter_by_order": [(I2, I1, I2, "b1"), ("u2:2", F1, F2, "b1"),
                                                      ("i4:2", F1, F2, "b1"), (I2, F1, F2, "b1")],
    "fusebench.search.row_kernels.gather_rows": [(F2, "u2:2", F2), (F2, "i4:2", F2), (F2, I2, F2)],
    "fusebench.search.row_kernels.gather_transposed": [(F2, I1, F2, "i8")],
    "fusebench.search.row_kernels.affine_evidence": [(F2, F1, F1, B1, "f8", "f8", F2, "b1")],
    "fusebench.search.row_kernels._row_floor": [(F1, "i8")],
    "fusebench.search.row_kernels.affine_count_top": [(F2, F1, F1, B1, "f8", "f8", F1, F1, I1, F2, I2, I1)],
    "fusebench.encoders.rownorm._normalise": [("f4:2:ro", F2, F1, B1), (F2, F2, F1, B1)],
}


def numba_type(code: str):
    """The numba type a code of ``SIGNATURES`` names: ``DTYPE`` (a scalar) or ``DTYPE:NDIM[:ro]`` (a C array)."""
    import numpy as np
    from numba import types
    from numba.np.numpy_support import from_dtype

    dtype, _, rest = code.partition(":")
    scalar = from_dtype(np.dtype(dtype))
    if not rest:
        return scalar
    ndim, _, flag = rest.partition(":")
    return types.Array(scalar, int(ndim), "C", readonly=flag == "ro")


def dispatcher(name: str):
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def compile_kernel(name: str) -> tuple[str, float, int]:
    """Compile (or load from the cache) ``name`` for each of its signatures: (name, seconds, signatures)."""
    start = time.perf_counter()
    kernel = dispatcher(name)
    for signature in SIGNATURES[name]:
        kernel.compile(tuple(numba_type(code) for code in signature))
    return name, time.perf_counter() - start, len(SIGNATURES[name])


def warm_up(workers: int | None = None, quiet: bool = False) -> None:
    """Compile every kernel of ``SIGNATURES`` into the disk cache, ``workers`` processes at a time (one per core)."""
    start = time.perf_counter()
    workers = max(1, min(workers or os.cpu_count() or 1, len(SIGNATURES)))
    names = sorted(SIGNATURES, key=lambda n: -len(SIGNATURES[n]))  # the longest first: the workers end together
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        for name, seconds, count in pool.map(compile_kernel, names):
            if not quiet:
                print(f"  {'.'.join(name.rsplit('.', 2)[-2:]):<32} {count} signature(s) {seconds:6.1f} s")
    if not quiet:
        print(f"fusebench-warmup: {len(SIGNATURES)} kernels ready in {time.perf_counter() - start:.0f} s "
              f"(numba cache: {cache_dir()})")


def cache_dir() -> str:
    """Where numba keeps the kernels (the first locator that applies, as numba picks it)."""
    from fusebench.search.topk_kernels import offer_rows  # lazy: heavy (numba)

    return offer_rows.stats.cache_path  # numba's public compile stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fusebench-warmup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=None, help="processes compiling at once (default: one per core)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    warm_up(args.workers, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
