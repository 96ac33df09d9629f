"""Qdrant's local mode (``qdrant-client``, in-process, on disk) as an engine: ``search=qdrant``.

One collection under ``request.workdir / "qdrant"`` (``QdrantClient(path=...)``: local mode persists every point
to a SQLite file there). ``fusion.fuse_on=source_object``: one point per item (id = item id) with one named vector
per model (``v0``, ``v1``, ... in model order); ``document``: one point per (model, item) (id = m * n_items + item)
holding only model m's vector, so the fused list may hold an item twice (returned ids map back to id % n_items).
The vectors' distance is DOT: the request's rows are unit vectors, so DOT is the cosine, which is how Qdrant's
server computes COSINE (normalise on upsert, then dot). Local mode's own COSINE re-normalises the whole stored
matrix in place on every search (qdrant_client/local/distances.py cosine_similarity), which costs more than the
search itself. Local mode searches every point exactly, whatever an index config says: only search.index=flat.

The lists come from the engine's own code, on the fastest route this measured (docs: /tmp/i23/qdrant_notes.md):

* singles: ``LocalCollection.query_points(query=<float32 row>, using=v_m, limit=per_model_k)`` per query and
  model. The public ``QdrantClient.query_points`` turns every query into a Python list, which local mode makes a
  float64 array, so numpy casts the whole stored matrix to float64 on every search (10-15x slower at 25k points);
  the collection called with the float32 row computes the same exact search in float32, as Qdrant's server does.
* fused: Qdrant's fusion code (``qdrant_client.hybrid.fusion``: ``reciprocal_rank_fusion`` with ``Rrf(k,
  weights)``, ``distribution_based_score_fusion``) over those per-model lists, dispatched as
  ``LocalCollection._merge_sources`` dispatches a prefetch query. The lists are the prefetch results themselves:
  a prefetch runs ``_query_collection`` with the same query, vector name and limit as the single search.
* latency: the first ``search.latency_queries`` queries as whole hybrid requests (``query_points`` with one
  ``Prefetch`` per model and the fusion query), one at a time; their fused lists must equal the route's (a note
  says how many did), which checks the shortcut on every run.

Nothing is written outside ``request.workdir`` (tests/test_engine_qdrant.py watches HOME, TMPDIR and the working
folder). The rules that make Qdrant's lists differ from fusebench's preset are in :data:`NOTES`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

from fusebench import FusebenchError
from fusebench.backends import engine_steps as steps
from fusebench.backends.base import Backend, Capacity, register, require
from fusebench.backends.engine_steps import EngineLists, EngineRequest
from fusebench.backends.qdrant_internals import CHECKED, local_collection, unsynced
from fusebench.runtime import checks

if TYPE_CHECKING:
    import numpy as np


COLLECTION = "fusebench"
UPLOAD_POINTS = 1024  # points per upload_points call
UNIT_TOLERANCE = 1e-3  # |norm - 1| above this: not the unit rows EngineRequest promises (DOT would not be cosine)
LARGE = 20_000  # local mode warns above this many points (LocalCollection.LARGE_DATA_THRESHOLD)
# What local mode holds in practice here (scripts/bench_engine_gallery.py, 2-core EPYC, clustered sim, d = 256, two
# models): at 21,000 items ingest took 22.5 s and each query 8.2 ms (numpy brute force over every point, both
# models), so COCO's 25,010 captions over 100,000 items take about 18 minutes; past that its server (HNSW) is the tool
CAPACITY = Capacity(items=100_000, measured="local mode searches by numpy brute force: 8.2 ms a query at 21,000 "
                    "items, so COCO's 25,010 captions over 100,000 items take about 18 minutes, ingest 1 ms a point",
                    server="Qdrant server, with its HNSW index, which fusebench does not drive")
NOTES = [
    "qdrant: local mode searches exactly (qdrant_client/local/local_collection.py LocalCollection.search: every "
    "score, then np.argsort(scores)[::-1]): equal scores come in reverse argsort order, not by id",
    "qdrant: the singles are LocalCollection.query_points with the float32 query row (DOT on unit vectors, float32 "
    "numpy dot); through QdrantClient.query_points a query becomes a list and then a float64 array "
    "(LocalCollection._resolve_query_vector_name), so scores there are float64 dots of the float32 stored vectors",
    "qdrant: RRF (qdrant_client/hybrid/fusion.py reciprocal_rank_fusion) adds 1 / (rank / w + k - 1), rank 1-based, "
    "k = Rrf.k (an integer; fusebench's rrf_k = k - 1), in Python float64; a weight <= 0 adds 0 but keeps the point; "
    "ties keep first-appearance order (sorted() is stable): model 0's list first",
    "qdrant: DBSF (distribution_based_score_fusion) maps each list by (s - (mean - 3 sd)) / (6 sd) with the sample "
    "sd (n - 1), 0.5 for a one-point list or zero variance, no clipping, summed by point id in float64, unweighted; "
    "ties keep first-appearance order",
    "qdrant: fused scores are float64 sums cast to float32 in the returned lists; fusebench sums in float32, so sums "
    "that differ by less than a float32 ulp may swap",
    "qdrant: the fused list holds at most final_k points (limit); fuse_on=document keeps one point per (model, item), "
    "so an item found by both models is two entries",
]


@dataclass
class QdrantParams:
    """The ``search.*`` settings only Qdrant reads."""

    qdrant_unsynced: bool = False  # local mode's SQLite commits without waiting for the disk (a patch of its storage:
    #   faster ingest, labelled in every figure); false = stock local mode

    def __post_init__(self):
        checks.boolean(self.qdrant_unsynced, "search.qdrant_unsynced")


def version() -> str:
    require("qdrant")
    return f"qdrant-client {metadata.version('qdrant-client')} (local mode)"


def rrf_k(request: EngineRequest) -> int:
    """Qdrant's ``Rrf.k`` (ranking_constant_k, an integer): fusebench's rrf_k + 1 (qdrant_rrf.yaml)."""
    k = float(request.fusion.params["rrf_k"]) + 1.0
    if not k.is_integer():
        raise FusebenchError(f"fusion.params.rrf_k={request.fusion.params['rrf_k']:g}: Qdrant's RRF constant k = rrf_k + 1 is an integer; "
                             f"valid: a whole fusion.params.rrf_k (qdrant_rrf: 1).")
    return int(k)


def _check_unit(block: dict[str, np.ndarray]) -> None:
    """Every model's rows in ``block`` (the queries, or one block of items as it is loaded) are unit rows."""
    import numpy as np

    for m, rows in block.items():
        norms = np.linalg.norm(rows, axis=1) if len(rows) else np.ones(1)
        if np.abs(norms - 1.0).max() > UNIT_TOLERANCE:
            raise FusebenchError(f"search=qdrant: model {m}'s vectors are not unit rows (norm {norms.min():.4g}.."
                                 f"{norms.max():.4g}); valid: L2-normalised embeddings.")


@contextmanager
def _environment(request: EngineRequest) -> Iterator[None]:
    """While the engine runs: numpy's BLAS at ``search.threads`` threads (null: 1; local mode's searches are
    matrix-vector products, memory-bound: two BLAS threads made them 3x slower on the 2-core machine measured),
    through threadpoolctl where it is installed; local mode's warning above 20,000 points silenced (a note says it)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    limit = threadpool_limits(limits=request.search.threads or 1, user_api="blas") if threadpool_limits else nullcontext()
    with limit, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Local mode is not recommended", category=UserWarning)
        yield


def point_ids(request: EngineRequest) -> list[np.ndarray]:
    """Per model, its items' point ids: the item id (source_object) or m * n_items + item (document)."""
    import numpy as np

    ids = np.arange(request.n_items, dtype=np.int64)
    if request.fusion.fuse_on == "source_object":
        return [ids for _ in request.models]
    return [m * request.n_items + ids for m in range(len(request.models))]


def _ingest(client, models, request: EngineRequest) -> None:
    names = steps.vector_names(request)
    config = {names[m]: models.VectorParams(size=request.dim(m), distance=models.Distance.DOT)
              for m in request.models}
    client.create_collection(COLLECTION, vectors_config=config)
    if request.search.qdrant_unsynced and not unsynced(local_collection(client, COLLECTION)):
        raise FusebenchError("search.qdrant_unsynced=true: this qdrant-client's local storage is not the SQLite "
                             f"connection read in {CHECKED}, so the patch cannot be made and the run would be labelled "
                             "with a patch it lacks: drop search.qdrant_unsynced (stock local mode).")
    ids = point_ids(request)
    tick = steps.ticker(request, "qdrant: loading points", request.n_items)
    for start, stop, rows in request.item_blocks(UPLOAD_POINTS):
        _check_unit(rows)  # as each block is read: the gallery is read once
        if request.fusion.fuse_on == "source_object":
            points = [models.PointStruct(id=int(ids[0][i]), vector={names[m]: rows[m][i - start] for m in request.models})
                      for i in range(start, stop)]
        else:
            points = [models.PointStruct(id=int(ids[k][i]), vector={names[m]: rows[m][i - start]})
                      for k, m in enumerate(request.models) for i in range(start, stop)]
        client.upload_points(COLLECTION, points=points)
        tick(stop - start)


class _Searcher:
    """The collection's exact search and Qdrant's fusion, one query at a time (the route in the module docstring)."""

    def __init__(self, client, models, request: EngineRequest):
        import numpy as np
        from qdrant_client.hybrid.fusion import distribution_based_score_fusion, reciprocal_rank_fusion

        self.models, self.request = models, request
        self.names = [steps.vector_names(request)[m] for m in request.models]
        self.collection = local_collection(client, COLLECTION)
        self.queries = [np.ascontiguousarray(request.queries[m], dtype=np.float32) for m in request.models]
        weights = [float(request.weights[m]) for m in request.models]
        if request.fusion.method == "rrf":
            k = rrf_k(request)
            self.query = models.RrfQuery(rrf=models.Rrf(k=k, weights=weights))
            self.fuse = lambda lists: reciprocal_rank_fusion(lists, limit=request.final_k, ranking_constant_k=k,
                                                             weights=weights)
        else:
            self.query = models.FusionQuery(fusion=models.Fusion.DBSF)
            self.fuse = lambda lists: distribution_based_score_fusion(lists, limit=request.final_k)

    def single(self, q: int, m: int) -> list:
        return self.collection.query_points(query=self.queries[m][q], using=self.names[m], limit=self.request.per_model_k,
                                            with_payload=False).points

    def hybrid(self, q: int) -> list:
        """One whole hybrid request: a Prefetch per model (built without validation, which would turn the float32
        row into a list) and the fusion query."""
        prefetch = [self.models.Prefetch.model_construct(query=self.queries[m][q], using=name, limit=self.request.per_model_k)
                    for m, name in enumerate(self.names)]
        return self.collection.query_points(prefetch=prefetch, query=self.query, limit=self.request.final_k,
                                            with_payload=False).points


def _hits(points: list, n_items: int) -> list[tuple[int, float]]:
    """(item id, score) per point: a document point's id is m * n_items + item."""
    return [(int(p.id) % n_items, float(p.score)) for p in points]


def _search_all(searcher: _Searcher, request: EngineRequest) -> tuple[dict, list, list]:
    """Each model's list and the fused list per query; and the model of each fused entry (its point id // n)."""
    n, singles, fused, owners = request.n_items, {m: [] for m in request.models}, [], []
    for start, stop in steps.query_batches(request, "qdrant: searching"):
        for q in range(start, stop):
            lists = [searcher.single(q, m) for m in range(len(request.models))]
            for m, points in zip(request.models, lists):
                singles[m].append(_hits(points, n))
            points = searcher.fuse(lists)  # reads the lists' scores, then overwrites them
            fused.append(_hits(points, n))
            owners.append([(int(p.id) // n, 0.0) for p in points])
    return singles, fused, owners


def _latency(searcher: _Searcher, request: EngineRequest, fused: list) -> tuple[np.ndarray, int, int]:
    """Milliseconds per hybrid request for the first latency_queries queries, and how many of them returned the
    route's fused list (ids exactly, scores to 1e-9)."""
    import numpy as np

    times, answers = steps.latencies(request, searcher.hybrid)
    same = 0
    for q, points in enumerate(answers):
        hits = _hits(points, request.n_items)
        same += [h[0] for h in hits] == [h[0] for h in fused[q]] and np.allclose(
            [h[1] for h in hits], [h[1] for h in fused[q]], rtol=0, atol=1e-9)
    return times, same, len(answers)


def run(request: EngineRequest) -> EngineLists:
    _check_unit(request.queries)
    qdrant_client = require("qdrant")
    from qdrant_client import models

    if request.fusion.method == "rrf" and not hasattr(models, "RrfQuery"):
        raise FusebenchError(f"fusion=qdrant_rrf passes k and weights through models.Rrf, which {version()} lacks: "
                             f"pip install 'qdrant-client>=1.20'.")
    with _environment(request):
        client = qdrant_client.QdrantClient(path=str(request.workdir / "qdrant"))
        try:
            began = time.perf_counter()
            _ingest(client, models, request)
            ingest = time.perf_counter() - began
            disk = steps.folder_bytes(request.workdir)
            searcher = _Searcher(client, models, request)
            began = time.perf_counter()
            singles, fused, owners = _search_all(searcher, request)
            seconds = time.perf_counter() - began
            latency, same, timed = _latency(searcher, request, fused)
        finally:
            client.close()
    document = request.fusion.fuse_on == "document"
    return steps.engine_lists(request, singles, fused, owners if document else None, ingest_seconds=ingest,
                        build_seconds=0.0, search_seconds=seconds, latency_ms=latency, disk_bytes=disk,
                        version=version(), notes=notes(request, same, timed))


def notes(request: EngineRequest, same: int, timed: int) -> list[str]:
    """What this run's engine does its own way (NOTES, the hybrid requests' check, the collection's size)."""
    out = list(NOTES)
    if request.search.qdrant_unsynced:
        out.append("qdrant: search.qdrant_unsynced=true: local mode's SQLite commits skipped their wait for the disk "
                   "(PRAGMA synchronous=OFF): not stock local mode's ingest times; the lists are unchanged")
    if timed:
        out.append(f"qdrant: {same} of {timed} whole hybrid requests (prefetch + fusion query) returned the same fused "
                   f"list as the per-model searches fused by qdrant_client.hybrid.fusion")
    points = request.n_items * (1 if request.fusion.fuse_on == "source_object" else len(request.models))
    if points > LARGE:
        out.append(f"qdrant: {points:,} points; local mode warns above {LARGE:,} (its searches are numpy brute force: "
                   f"exact, slow); the warning was silenced")
    return out


BACKEND = register(Backend(name="qdrant", indexes=("flat",), reads=("threads",), params=QdrantParams,
                           label_flags={"qdrant_unsynced": "unsynced"}, presets=("qdrant_rrf", "qdrant_dbsf"),
                           extra="qdrant", module="qdrant_client", document=True,
                           index_note=" (Qdrant's local mode searches every point exactly)",
                           run=steps.engine_runner(run, version), version=version, capacity=CAPACITY, order=50))
