"""The private parts of qdrant-client's local mode that ``backends/kinds/qdrant.py`` uses, in one place, each checked
against the release named in ``CHECKED`` (``tests/test_engine_internals.py`` fails, naming the release and the
attribute, when the installed one differs in shape).

* ``QdrantClient._client.collections`` (``qdrant_client/local/qdrant_local.py`` ``QdrantLocal.collections``): the
  collection's ``LocalCollection``, searched directly, because the client's own ``query_points`` validates a
  numpy query into a Python list first (pydantic), which costs more than local mode's search of a small collection;
  the lists are the same (the record's notes say the requests go to the collection).
* ``LocalCollection.storage.storage`` (``qdrant_client/local/persistence.py`` ``CollectionPersistence``): the SQLite
  connection local mode commits each point through. ``PRAGMA synchronous=OFF`` skips each commit's wait for the disk,
  only with ``search.qdrant_unsynced=true`` (off by default: stock local mode's ingest times), and then labelled.
"""

from __future__ import annotations

from fusebench import FusebenchError

CHECKED = "1.20.0"  # the qdrant-client release these were read in


def local_collection(client, name: str):
    """The local-mode ``LocalCollection`` called ``name`` of ``client`` (a ``QdrantClient(path=...)``)."""
    collection = getattr(getattr(client, "_client", None), "collections", {}).get(name)
    if collection is None:
        raise FusebenchError(f"search=qdrant drives qdrant-client's local mode (QdrantLocal.collections, as in {CHECKED}), "
                             "which the installed qdrant-client does not have: pip install 'qdrant-client==1.20.0'.")
    return collection


def unsynced(collection) -> bool:
    """Local mode's SQLite commits without waiting for the disk (the file is the same; a torn file is never read: the
    run's workdir is new and removed after). False, and nothing changed, where the storage is not there."""
    storage = getattr(getattr(collection, "storage", None), "storage", None)
    if storage is None or not hasattr(storage, "execute"):
        return False
    storage.execute("PRAGMA synchronous=OFF")
    return True
