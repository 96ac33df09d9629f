"""The engines' private parts fusebench uses, each in one adapter module (backends/*_internals.py): a test that
fails loudly, naming the release and the attribute, when the installed library is not the one they were read in."""

from __future__ import annotations

from importlib import metadata

import pytest


@pytest.mark.slow  # runs Qdrant's local mode
def test_qdrant_local_mode_has_the_parts_the_adapter_reads(tmp_path):
    pytest.importorskip("qdrant_client")
    from qdrant_client import QdrantClient, models

    from fusebench.backends import qdrant_internals as internals

    installed = metadata.version("qdrant-client")
    assert installed == internals.CHECKED, (f"qdrant-client {installed} is installed; backends/qdrant_internals.py was "
                                            f"read in {internals.CHECKED}: check its private names again")
    client = QdrantClient(path=str(tmp_path / "q"))
    try:
        client.create_collection("c", vectors_config={"v": models.VectorParams(size=2, distance=models.Distance.DOT)})
        collection = internals.local_collection(client, "c")
        assert hasattr(collection, "query_points"), "QdrantLocal.collections no longer holds LocalCollection objects"
        assert internals.unsynced(collection), "LocalCollection.storage.storage is no longer a SQLite connection"
        assert collection.storage.storage.execute("PRAGMA synchronous").fetchone()[0] == 0
    finally:
        client.close()


def test_a_missing_collection_is_one_line():
    from fusebench import FusebenchError
    from fusebench.backends import qdrant_internals as internals

    with pytest.raises(FusebenchError, match="QdrantLocal.collections") as err:
        internals.local_collection(object(), "c")
    assert "\n" not in str(err.value)


def test_milvus_lite_has_the_row_reader_the_adapter_replaces():
    pytest.importorskip("milvus_lite")
    import milvus_lite
    from milvus_lite.storage import segment

    from fusebench.backends import milvus_internals as internals

    assert milvus_lite.__version__ == internals.CHECKED, (
        f"milvus-lite {milvus_lite.__version__} is installed; backends/milvus_internals.py was read in "
        f"{internals.CHECKED}: check Segment.row_to_dict again")
    original = segment.Segment.row_to_dict
    with internals.lean_rows({"v0"}):
        assert segment.Segment.row_to_dict is not original
    assert segment.Segment.row_to_dict is original  # restored


@pytest.mark.slow  # runs Qdrant's local mode
def test_an_unsynced_patch_that_cannot_be_made_is_refused_not_labelled(tmp_path, monkeypatch):
    """search.qdrant_unsynced=true labels every figure as a patched engine's: where the patch cannot be made (a
    qdrant-client whose storage is elsewhere), the run stops in one line instead of reporting stock timings as patched."""
    pytest.importorskip("qdrant_client")
    from helpers.engine_case import corpus, preset, request

    from fusebench import FusebenchError
    from fusebench.backends.kinds import qdrant
    from fusebench.config.search import SearchConfig

    monkeypatch.setattr(qdrant, "unsynced", lambda collection: False)
    items, queries = corpus(n_items=60, n_queries=10)
    req = request(items, queries, preset("qdrant_rrf"), tmp_path / "w",
                  SearchConfig(backend="qdrant", qdrant_unsynced=True, latency_queries=0))
    with pytest.raises(FusebenchError, match="search.qdrant_unsynced=true: .*drop search.qdrant_unsynced") as err:
        qdrant.run(req)
    assert "\n" not in str(err.value)
