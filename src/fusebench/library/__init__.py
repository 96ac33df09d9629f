"""The library beneath the app: plain-array functions a notebook or another pipeline calls on what it holds, with
no Hydra, no files and no cache. Each is the code a run uses (``tests/test_library.py`` checks each equals a
run's saved lists, ranks and comparisons on the same rows).

* :func:`search`: texts and images (any float rows; L2-normalised as a run normalises them) -> each direction's
  top-``k`` :class:`Lists` (ids, scores; exact ranks when ``caption_image`` is given).
* :func:`fuse`: ranked lists the caller holds, one per model, -> one fused :class:`Lists` per direction
  (``method`` from the fusion methods' registry, its settings as keywords).
* :func:`ranks`: lists or a score matrix -> each query's rank of its first positive; :func:`recall`: ranks ->
  recall@k.
* :func:`compare`: two retrievers' ranks on the same queries -> the paired comparison (gain, intervals, wins,
  losses, McNemar's p) a run records.

:func:`fusebench.evaluate` runs a whole job over arrays through the same calls.
"""

from fusebench.library.measures import compare, ranks, recall
from fusebench.library.ranking import Lists, fuse, search

__all__ = ["Lists", "compare", "fuse", "ranks", "recall", "search"]
