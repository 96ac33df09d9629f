"""LanceDB (``lancedb``, embedded) as an engine: ``search=lancedb``.

One table under ``request.workdir`` (``lancedb.connect(workdir)``): an int64 ``id`` (the item id, written in id
order, so LanceDB's ``_rowid`` order is id order) and one ``fixed_size_list<float32>`` column per model (``v0``,
``v1``, ... in model order), written from pyarrow record batches in one commit. Searches use the ``dot`` distance
(``1 - q.x``: on unit vectors the cosine order; the singles' scores are ``1 - _distance``). Indexes, per column:
``flat`` builds none (LanceDB's exact brute-force kNN: every distance, then a TopK sort by ``(_distance,
_rowid)``), ``ivf_pq`` builds ``IvfPq`` (``nprobes`` per query), ``hnsw`` builds ``HnswSq`` with one partition
(IVF_HNSW_SQ; ``ef`` per query).

LanceDB has no server-side multi-vector hybrid search: its documented recipe is one search per model, then a
reranker's ``rerank_multivector`` in Python. So the fused list is ``RRFReranker(K=fusion.params.rrf_k)
.rerank_multivector([one table per model], deduplicate=True)`` over each query's per-model results (the same
searches the singles are: each ``per_model_k`` deep), cut to ``final_k``; its score is the reranker's
``_relevance_score``. The rules that make LanceDB's lists differ from fusebench's preset are in :data:`NOTES`
(and docs/engines.md). Nothing is written outside ``request.workdir`` (tests/test_engine_lancedb.py watches HOME,
TMPDIR and the working folder): an index build's spill files go to ``workdir/tmp`` (TMPDIR while the engine runs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING

from fusebench import FusebenchError
from fusebench.backends import engine_steps as steps
from fusebench.backends.base import Backend, register, require
from fusebench.backends.engine_steps import EngineLists, EngineRequest
from fusebench.config.search import resolve_pq_m, resolved_nlist
from fusebench.fusion.config import FusionConfig

if TYPE_CHECKING:
    import numpy as np

    from fusebench.config.search import SearchConfig


TABLE = "fusebench"
DISTANCE = "dot"  # 1 - q.x (lance-linalg): on unit vectors the cosine order, with no re-normalisation
WRITE_ROWS = 2048  # rows per pyarrow record batch written
PQ_BITS = (4, 8)  # lance-index vector/pq.rs refuses any other num_bits
NOTES = [
    "lancedb: RRFReranker.rerank_multivector (lancedb/rerankers/rrf.py) ranks each model's list on its own (rank 1 "
    "at each list's top; earlier releases, from lancedb PR #1481 (2024), ranked the concatenation of the lists) and "
    "sums 1 / (K + rank) per _rowid in Python float64",
    "lancedb: _relevance_score is that float64 sum cast to float32, and the list is sorted on the float32 value "
    "(pyarrow sort_by, stable): sums that round to the same float32 tie, and ties keep the order of the concatenated lists "
    "after deduplication (model 0's hits from its rank 1 down, then each later model's new hits)",
    "lancedb: duplicates are removed by Reranker._deduplicate (lancedb/rerankers/base.py), which keeps the first "
    "occurrence of each _rowid in the concatenation; the reranker returns every distinct hit (no limit): fusebench "
    "cuts it to final_top_k",
    "lancedb: the singles' scores are 1 - _distance, where the dot distance is 1 - q.x in float32 (so a score "
    "may differ from the exact cosine by a float32 ulp of 1); equal distances are ordered by _rowid = item id "
    "(the kNN plan's TopK sort on (_distance, _rowid))",
]


def version() -> str:
    lancedb = require("lancedb")
    try:
        pylance = metadata.version("pylance")
    except metadata.PackageNotFoundError:
        pylance = "not installed"
    return f"lancedb {lancedb.__version__} (pylance {pylance})"


def check(search: SearchConfig, fusion: FusionConfig, weights: list[float]) -> None:
    """What LanceDB cannot build, refused when the config is checked: a PQ code width other than its own."""
    if search.index == "ivf_pq" and search.nbits not in PQ_BITS:
        raise FusebenchError(f"search.nbits={search.nbits} is not a PQ code width LanceDB builds: valid "
                             f"search.nbits is {' or '.join(map(str, PQ_BITS))}.")


def check_items(request: EngineRequest) -> None:
    """What LanceDB cannot build from these rows, refused before any is written: PQ sub-vectors that do not divide a
    model's width (the corpus-size rules, such as IVF_PQ's training rows, are config.search.check_sizes')."""
    if request.search.index == "ivf_pq":
        for m in request.models:
            resolve_pq_m(request.search, request.dim(m), m)


@contextmanager
def _environment(request: EngineRequest) -> Iterator[None]:
    """LanceDB's environment while it runs: TMPDIR inside ``workdir`` (an index build spills its k-means/shuffle
    files to Rust's std::env::temp_dir(), read on every call, which is TMPDIR) and ``search.threads`` as
    LANCE_CPU_THREADS (read once, when LanceDB's compute pool starts: a process's first LanceDB run sets it for
    the rest of that process; an explicit LANCE_CPU_THREADS is left alone). The previous values come back after."""
    spill = request.workdir / "tmp"
    spill.mkdir(exist_ok=True)
    wanted = {"TMPDIR": str(spill)}
    if request.search.threads is not None and "LANCE_CPU_THREADS" not in os.environ:
        wanted["LANCE_CPU_THREADS"] = str(request.search.threads)
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _batches(pa, request: EngineRequest, schema) -> Iterator:
    import numpy as np

    tick = steps.ticker(request, "lancedb: writing items", request.n_items)
    for start, stop, blocks in request.item_blocks(WRITE_ROWS):
        arrays = [pa.array(np.arange(start, stop, dtype=np.int64))]
        for m in request.models:
            block = blocks[m]
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(block.ravel()), block.shape[1]))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        tick(stop - start)


def _ingest(db, pa, request: EngineRequest):
    fields = [pa.field("id", pa.int64(), nullable=False)]
    fields += [pa.field(name, pa.list_(pa.float32(), int(request.dim(m))))
               for m, name in steps.vector_names(request).items()]
    schema = pa.schema(fields)
    return db.create_table(TABLE, data=_batches(pa, request, schema), schema=schema)


def index_config(request: EngineRequest, model: str):
    """The LanceDB index config for ``model``'s column (None for flat: no index)."""
    from lancedb.index import HnswSq, IvfPq

    search = request.search
    if search.index == "ivf_pq":
        return IvfPq(distance_type=DISTANCE, num_partitions=resolved_nlist(search, request.n_items),
                     num_sub_vectors=resolve_pq_m(search, request.dim(model), model), num_bits=search.nbits)
    if search.index == "hnsw":
        return HnswSq(distance_type=DISTANCE, num_partitions=1, m=search.hnsw_m, ef_construction=search.ef_construction)
    return None


def _build(table, request: EngineRequest) -> float:
    """Each column's index (none for flat: 0 seconds); the seconds it took."""
    if request.search.index == "flat":
        return 0.0
    began = time.perf_counter()
    for m, name in steps.vector_names(request).items():
        config = index_config(request, m)
        if config is None:
            continue
        table.create_index(name, config=config, replace=True)
        stats = table.index_stats(f"{name}_idx")
        if stats is None or stats.num_unindexed_rows:  # LanceDB leaves rows it could not train on unindexed
            raise FusebenchError(f"search.index={request.search.index}: LanceDB indexed "
                                 f"{0 if stats is None else stats.num_indexed_rows} of {request.n_items} rows of "
                                 f"model {m}; valid: search.index=flat, or more items.")
    return time.perf_counter() - began


def _query(table, request: EngineRequest, column: str, vectors: np.ndarray):
    """One search of ``column`` for ``vectors`` (one row, or several: LanceDB adds query_index), per_model_k deep."""
    search = request.search
    builder = (table.search(vectors, vector_column_name=column).distance_type(DISTANCE).limit(request.per_model_k)
               .select(["id", "_distance"]).with_row_id(True))
    if search.index == "flat":
        return builder.bypass_vector_index()
    if search.index == "ivf_pq":
        builder = builder.nprobes(search.nprobe)
        return builder if search.refine_factor is None else builder.refine_factor(search.refine_factor)
    return builder.nprobes(1).ef(search.ef_search)


def _split(result, count: int) -> list:
    """A multi-vector result as one table per query (query_index 0..count-1), each best first. A one-row batch
    comes back without query_index (LanceDB adds it for two or more vectors only)."""
    import numpy as np

    if "query_index" not in result.column_names:
        return [result]
    qi = result["query_index"].to_numpy()
    if np.any(np.diff(qi) < 0):
        result = result.sort_by([("query_index", "ascending"), ("_distance", "ascending"), ("_rowid", "ascending")])
        qi = result["query_index"].to_numpy()
    bounds = np.searchsorted(qi, np.arange(count + 1))
    return [result.slice(bounds[q], bounds[q + 1] - bounds[q]).drop_columns(["query_index"]) for q in range(count)]


def _hits(table) -> list[tuple[int, float]]:
    """(id, 1 - _distance) per row of one query's single-model result."""
    import numpy as np

    scores = 1.0 - table["_distance"].to_numpy().astype(np.float64)
    return list(zip(table["id"].to_numpy().tolist(), scores.tolist()))


def _fuse(reranker, tables: list, final_k: int) -> list[tuple[int, float]]:
    """LanceDB's own fusion of one query's per-model results, cut to final_k: (id, _relevance_score)."""
    fused = reranker.rerank_multivector(tables, deduplicate=True).slice(0, final_k)
    return list(zip(fused["id"].to_numpy().tolist(), fused["_relevance_score"].to_numpy().tolist()))


def _search_all(table, reranker, request: EngineRequest) -> tuple[dict, list]:
    names = steps.vector_names(request)
    singles: dict[str, list] = {m: [] for m in request.models}
    fused = []
    for start, stop in steps.query_batches(request, "lancedb: searching"):
        per_model = [_split(_query(table, request, names[m], request.queries[m][start:stop]).to_arrow(), stop - start)
                     for m in request.models]
        for m, tables in zip(request.models, per_model):
            singles[m] += [_hits(t) for t in tables]
        fused += [_fuse(reranker, list(tables), request.final_k) for tables in zip(*per_model)]
    return singles, fused


def _one_request(table, reranker, request: EngineRequest, names: dict[str, str], q: int) -> list[tuple[int, float]]:
    """One fused request: each model's search for query ``q``, then the rerank (what latency times)."""
    tables = [_query(table, request, names[m], request.queries[m][q]).to_arrow() for m in request.models]
    return _fuse(reranker, tables, request.final_k)


def rrf_reranker(request: EngineRequest):
    from lancedb.rerankers import RRFReranker

    k = float(request.fusion.params["rrf_k"])
    return RRFReranker(K=int(k) if k.is_integer() else k)


def run(request: EngineRequest) -> EngineLists:
    check_items(request)
    lancedb = require("lancedb")
    import pyarrow as pa

    with _environment(request):
        began = time.perf_counter()
        db = lancedb.connect(str(request.workdir))
        table = _ingest(db, pa, request)
        ingest = time.perf_counter() - began
        build = _build(table, request)
        disk = steps.folder_bytes(request.workdir)
        reranker = rrf_reranker(request)
        began = time.perf_counter()
        singles, fused = _search_all(table, reranker, request)
        seconds = time.perf_counter() - began
        names = steps.vector_names(request)
        latency, _ = steps.latencies(request, lambda q: _one_request(table, reranker, request, names, q))
    return steps.engine_lists(request, singles, fused, ingest_seconds=ingest, build_seconds=build, search_seconds=seconds,
                        latency_ms=latency, disk_bytes=disk, version=version(), notes=notes(request))


def notes(request: EngineRequest) -> list[str]:
    """What this run's engine does its own way (NOTES, plus the index it really built)."""
    out = list(NOTES)
    search = request.search
    if search.index == "ivf_pq":
        out.append(f"lancedb: IVF_PQ (num_partitions={resolved_nlist(search, request.n_items)}, num_bits={search.nbits}, "
                   f"nprobes={search.nprobe}, "
                   + ("no refine_factor): the singles' scores are PQ-approximate distances" if search.refine_factor is None
                      else f"refine_factor={search.refine_factor}): the {search.refine_factor} x limit best PQ candidates "
                      "re-ranked by their full vectors, whose distances the singles' scores are"))
    elif search.index == "hnsw":
        out.append(f"lancedb: IVF_HNSW_SQ with one partition (m={search.hnsw_m}, ef_construction={search.ef_construction}, "
                   f"ef={search.ef_search}): the singles' scores are 8-bit scalar-quantised distances")
    return out


BACKEND = register(Backend(name="lancedb", indexes=("flat", "ivf_pq", "hnsw"), reads=("threads", "refine_factor"),
                           presets=("lancedb_rrf",), extra="lancedb", module="lancedb", check=check,
                           run=steps.engine_runner(run, version), version=version, order=40))
