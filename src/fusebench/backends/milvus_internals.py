"""The private part of Milvus Lite that ``backends/kinds/milvus.py`` can use, in one place, checked against the release
named in ``CHECKED`` (``tests/test_engine_internals.py`` fails, naming the release and the attribute, when the
installed one differs in shape).

* ``milvus_lite.storage.segment.Segment.row_to_dict``, replaced while searching by :func:`lean_rows`, only with
  ``search.milvus_lean_rows=true`` (off by default: stock Milvus Lite's times); the run is then labelled
  ``lean_rows`` and its record says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

CHECKED = "3.2.2"  # the milvus-lite release this was read in


@contextmanager
def lean_rows(vector_fields: set[str]) -> Iterator[None]:
    """While searching, a hit's row is read without its vector columns.

    Milvus Lite reads every column of every hit's row (``milvus_lite/storage/segment.py`` ``Segment.row_to_dict``,
    called by ``search/executor_indexed.py`` ``execute_search_with_index`` for each of the top-k), including each
    model's ~1,000-float vector as a Python list, even when only the primary key is asked for: that was two thirds of
    its search time. The hits, their order and scores do not depend on it (the ids and distances come from the index;
    the row only gives the pk and the output fields, here the pk alone), so the lists are Milvus Lite's own; the
    timings are those of a Milvus Lite that skips the copy. Restored on exit.
    """
    from milvus_lite.storage import segment

    original = getattr(segment.Segment, "row_to_dict", None)
    if original is None:  # another Milvus Lite: search as it is
        yield
        return

    def row_to_dict(self, row_idx: int) -> dict:
        names = self.table.schema.names
        if "$meta" in names or not vector_fields.intersection(names):
            return original(self, row_idx)
        return {name: self.table.column(name)[row_idx].as_py() for name in names
                if name != "_seq" and name not in vector_fields}

    segment.Segment.row_to_dict = row_to_dict
    try:
        yield
    finally:
        segment.Segment.row_to_dict = original
