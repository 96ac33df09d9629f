"""IVF-Flat searched list-major (``search.list_major``): each inverted list is read once for every query of a block
that probes it, and scored against all of them with one matmul, instead of each query scanning its own lists.

FAISS's own routine does it (``faiss.contrib.big_batch_search``, method ``pairwise_distances``, ``threaded=1``: the
next list's queries and rows are gathered, and the last list's scores offered to the per-query heaps, on a second
thread while this list's matmul runs). The candidates are exactly FAISS's search's (the same coarse quantizer, the
same ``nprobe`` lists per query); the scores are the same inner products summed in BLAS's order, so a score may
differ from FAISS's scan in its last bit, and two items that tie within it may swap.

Why: FAISS's search scans each query's lists alone, so at a million items a query at 6% of the rows reads 60 MB,
and 25,010 captions read 1.5 TB from memory; list-major reads each list once per block of queries and is a matmul
(docs/search.md#faiss-at-a-million has the measurements). On a GPU, FAISS's own GPU index searches instead.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np

from fusebench.backends import gallery_index

BLOCK = 16384  # queries per big_batch_search call: larger blocks make each list's matmul larger; one progress step


def supported(faiss, index) -> bool:
    """Whether ``index`` is one a list-major search takes: a plain IndexIVFFlat (no pre-transform, no re-ranking)."""
    return type(faiss.downcast_index(index)) is faiss.IndexIVFFlat


def search(faiss, index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32, ids int64) of ``queries`` (one block) searched ``k`` deep in IVF-Flat ``index`` at its
    ``nprobe``, best first, as ``index.search`` returns them (ids -1 and scores -inf-like where fewer were found)."""
    from faiss.contrib.big_batch_search import big_batch_search  # lazy: faiss's contrib imports its own helpers

    ivf = faiss.downcast_index(gallery_index.ivf_part(faiss, index))
    rows = np.ascontiguousarray(queries, dtype=np.float32)
    if len(rows) * ivf.nprobe <= ivf.nlist + 1:  # FAISS's bucket sort of the probes needs more than nlist + 1; a
        return index.search(rows, k)  # batch this small has nothing to share: each query's lists alone, as FAISS does
    # it prints a line per list to stdout at verbose=0 (and logs to the root logger above that): kept off the run's
    with contextlib.redirect_stdout(io.StringIO()):
        scores, ids = big_batch_search(ivf, rows, k, method="pairwise_distances", threaded=1, verbose=0)
    return np.asarray(scores, dtype=np.float32), np.asarray(ids, dtype=np.int64)
