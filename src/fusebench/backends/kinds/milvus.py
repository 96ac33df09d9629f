"""Milvus Lite (``pymilvus`` + ``milvus-lite``) as an embedded engine: ``search=milvus``.

One collection under ``request.workdir``: an INT64 primary key (the item id) and one FLOAT_VECTOR field per model
(``v0``, ``v1``, ... in model order: a model's name need not be a valid Milvus field name). The items are inserted
in batches, flushed, indexed per field (FLAT, HNSW or IVF_FLAT) and loaded; every query then goes through
``client.search`` per model (the singles) and ``client.hybrid_search`` with one ``AnnSearchRequest`` per model and
Milvus' own ranker (the fused list): ``RRFRanker(k)`` for ``fusion=milvus_rrf``, ``WeightedRanker(*weights)`` with
``norm_score=True`` for ``milvus_weighted`` (COSINE fields: each route adds w (1 + s) / 2) and
``milvus_weighted_ip`` (IP fields: w (1/2 + atan(s) / pi)).

Milvus Lite 3.x is pure Python (a gRPC server in a thread of this process, numpy brute force, FAISS for HNSW and
IVF_FLAT): ``milvus_lite/function/ops/merge_op.py`` (``MergeOp._merge_rrf``, ``_merge_weighted``,
``_normalize_func``) fuses in float64 and the response carries float32 scores. The engine rules that make its
lists differ from fusebench's exact preset are in :data:`NOTES` (and docs/engines.md). Nothing is written outside
``request.workdir``: the database is the folder ``workdir/milvus.db``; the server binds 127.0.0.1 on a free TCP
port (no socket or lock file elsewhere) and is stopped in ``finally``.

With ``search.uri=http://HOST:PORT`` the same steps run against a Milvus server (standalone, distributed, or Milvus
Lite's own ``milvus-lite server``): the collection is the run's own on that server, named and marked by
:mod:`fusebench.backends.milvus_server` (which also holds the timeouts, retries and the one-line faults), dropped
in ``finally`` unless ``search.keep_db``; nothing is written under ``request.workdir``.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusebench import DIRECTIONS, FusebenchError
from fusebench.backends import engine_steps as steps
from fusebench.backends import milvus_server as server
from fusebench.backends.base import Backend, Capacity, register, require
from fusebench.backends.engine_steps import EngineLists, EngineRequest
from fusebench.backends.milvus_internals import lean_rows
from fusebench.config.search import resolved_nlist
from fusebench.fusion.config import FusionConfig
from fusebench.runtime import checks

if TYPE_CHECKING:
    from fusebench.config.search import SearchConfig


COLLECTION = "fusebench"
PK = "id"
# Milvus' per-request limits (quotaAndLimits.limits.topK and .nq, both 16384: pkg/util/paramtable/quota_param.go; a
# search past them is refused). Milvus Lite 3.2.2 checks neither, but a real Milvus would refuse the run.
MAX_TOPK = MAX_NQ = 16384
# What Milvus Lite holds here (scripts/bench_engine_gallery.py, 2-core EPYC, 24 GB, clustered sim, d = 256, two models,
# HNSW M 16 / efConstruction 100): 1,001,000 items took 235.5 s to ingest and 252.6 s to index at a 6.07 GB peak
# (3.15 GB at 301,000): about 5 GB a million more, so twice the measured million stays well under 24 GB
CAPACITY = Capacity(items=2_000_000, measured="Milvus Lite keeps every vector in this process: 6.07 GB peak at "
                    "1,001,000 items of two 256-wide models (3.15 GB at 301,000), ingest 235.5 s and HNSW build "
                    "252.6 s; about 5 GB more a million, so at most twice the measured million on 24 GB",
                    server="Milvus standalone or distributed, which fusebench drives with search.uri=http://HOST:PORT")
INDEX_EXISTS = 35  # the status code of "index already exists" (Milvus Lite engine/collection.py IndexAlreadyExistsError)
INSERT_ROWS = 2048  # rows per insert call (a 2 x 1152-float batch is ~20 MB of protobuf, under the 256 MB cap)
METRICS = {"milvus_rrf": "IP", "milvus_weighted": "COSINE", "milvus_weighted_ip": "IP"}
NOTES = [
    "milvus: equal fused scores are ordered by the smaller item id (milvus_lite function/chain.py FuncChain.sort, "
    "tie_break_col=$id; Milvus: internal/util/function/rerank/util.go newIDScores), not in first-appearance order",
    "milvus: fused scores are computed in float64 (milvus_lite function/ops/merge_op.py MergeOp) and returned as "
    "float32; fusebench's preset adds in float32, so near-ties (|difference| ~1e-7) may order differently",
    "milvus: COSINE search re-normalises every vector in float32 and returns 1 - max(1 - cos, 0) "
    "(milvus_lite search/distance.py cosine_distance, engine/collection.py _internal_distance_to_milvus_distance): "
    "scores above 0.5 are exact float32 cosines, lower ones lose up to one float32 ulp of 1",
    "milvus: equal distances are ordered by (segment, row) = lower item id, but a segment's own top-k cut is "
    "numpy argpartition (milvus_lite index/brute_force.py), which keeps any of the items tied at the cut",
]
# search.milvus_lean_rows=true: what every figure of the run then says (its times are not stock Milvus Lite's)
LEAN_NOTE = ("milvus: search.milvus_lean_rows=true: search times skip Milvus Lite's copy of each hit's vectors "
             "(fusebench patches storage/segment.py Segment.row_to_dict while it searches): not stock Milvus Lite's "
             "times; the lists are unchanged")


@dataclass
class MilvusParams:
    """The ``search.*`` settings only Milvus reads."""

    milvus_lean_rows: bool = False  # skip Lite's copy of each hit's vectors while searching (patches the engine: its
    #   times are then not stock Milvus Lite's, and every figure says so); false = stock Milvus Lite
    uri: str | None = None  # a Milvus server (http://HOST:PORT); null = Milvus Lite embedded in the run
    token_env: str | None = None  # with uri: the NAME of the environment variable holding the server's token
    #   (the token itself is never in the config); null = no authentication
    connect_timeout_s: float = 10.0  # with uri: seconds to wait for the server to answer when connecting
    request_timeout_s: float = 120.0  # with uri: seconds one request may take (an insert batch, the index load, a
    #   block of queries), pymilvus' own retries of an unavailable server included
    retries: int = 2  # with uri: times a transient failure (unavailable, deadline, rate limit) is sent again

    def __post_init__(self):
        checks.boolean(self.milvus_lean_rows, "search.milvus_lean_rows")
        if self.uri is not None:
            server.check_uri(self.uri)
        server.check_token_env(self.token_env)
        self.connect_timeout_s = float(checks.number(self.connect_timeout_s, "search.connect_timeout_s", 0,
                                                     open_low=True, hint="seconds"))
        self.request_timeout_s = float(checks.number(self.request_timeout_s, "search.request_timeout_s", 0,
                                                     open_low=True, hint="seconds"))
        checks.integer(self.retries, "search.retries", 0, "times a transient failure is sent again")
        if self.retries > server.MAX_RETRIES:
            raise FusebenchError(f"search.retries={self.retries} is not valid; valid: 0..{server.MAX_RETRIES} (a "
                                 "server away for longer is reported, not waited out).")
        if self.uri is None:
            for key in SERVER_KEYS:
                if getattr(self, key) != getattr(MilvusParams, key):
                    raise FusebenchError(f"search.{key}={getattr(self, key)} is read only with search.uri set (a "
                                         f"Milvus server): set search.uri=http://HOST:PORT, or leave search.{key} unset.")
        elif self.milvus_lean_rows:
            raise FusebenchError("search.milvus_lean_rows=true patches Milvus Lite inside this process, and "
                                 f"search.uri={server.shown(self.uri)} is a server elsewhere: valid with search.uri, "
                                 "search.milvus_lean_rows=false.")


SERVER_KEYS = ("token_env", "connect_timeout_s", "request_timeout_s", "retries")  # read only with search.uri


def version() -> str:
    pymilvus = require("milvus")
    try:
        import milvus_lite
        lite = milvus_lite.__version__
    except ImportError:
        lite = "not installed"
    return f"pymilvus {pymilvus.__version__}, milvus-lite {lite}"


def check(search: SearchConfig, fusion: FusionConfig, weights: list[float]) -> None:
    """What Milvus cannot run, refused when the config is checked (one line naming the key): its rankers' weights and
    constant, and its per-request limits (whatever the corpus: a real Milvus refuses them)."""
    if fusion.preset in ("milvus_weighted", "milvus_weighted_ip") and not all(0 <= w <= 1 for w in weights):
        raise FusebenchError(f"fusion={fusion.preset} runs Milvus' WeightedRanker, which takes weights in [0, 1]; the "
                             f"models' weights are {'/'.join(f'{w:g}' for w in weights)}: scale them into [0, 1] "
                             "(only their ratios matter).")
    if fusion.preset == "milvus_rrf" and not 0 < fusion.params["rrf_k"] < MAX_TOPK:
        raise FusebenchError(f"fusion.params.rrf_k={fusion.params['rrf_k']:g} is out of Milvus' RRFRanker range: "
                             "valid fusion.params.rrf_k is "
                             f"in (0, {MAX_TOPK}).")
    for key in ("top_k", "final_top_k"):
        value = getattr(fusion, key)
        if value is not None and value > MAX_TOPK:
            raise FusebenchError(f"fusion.{key}={value} is past Milvus' limit of {MAX_TOPK} results per search (Milvus "
                                 f"refuses such a request): valid fusion.{key} is 1..{MAX_TOPK}.")
    if search.batch_size > MAX_NQ:
        raise FusebenchError(f"search.batch_size={search.batch_size} is more queries per request than Milvus takes: "
                             f"valid search.batch_size is 1..{MAX_NQ}.")
    if search.uri is not None:
        check_server(search, len(weights))


def check_server(search: SearchConfig, n_models: int) -> None:
    """The server form's own rules (its capacity is the server's, not this machine's): a vector field per model
    within Milvus' default limit, and the token's variable set."""
    if n_models > server.MAX_VECTOR_FIELDS:
        raise FusebenchError(f"search.uri={server.shown(search.uri)} holds {n_models} models as {n_models} vector fields "
                             f"of one collection, past Milvus' default limit of {server.MAX_VECTOR_FIELDS} "
                             "(proxy.maxVectorFieldNum): valid: at most "
                             f"{server.MAX_VECTOR_FIELDS} models, or a server configured for more.")
    server.token(search)


def served(search: SearchConfig) -> bool:
    """Whether the run drives a Milvus server (its capacity is the server's: no embedded item limit)."""
    return search.uri is not None


def preflight(search: SearchConfig, out_dir) -> None:
    """With search.uri, before any work: the server answers and no collection under the run's names is another's."""
    if search.uri is not None:
        server.preflight(require("milvus"), search, out_dir, DIRECTIONS)


def index_params(request: EngineRequest) -> tuple[str, dict, dict]:
    """(Milvus index type, build params, search params) for ``request.search``."""
    search = request.search
    if search.index == "hnsw":
        return "HNSW", {"M": search.hnsw_m, "efConstruction": search.ef_construction}, {"ef": search.ef_search}
    if search.index == "ivf_flat":
        return "IVF_FLAT", {"nlist": resolved_nlist(search, request.n_items)}, {"nprobe": search.nprobe}
    return "FLAT", {}, {}


def _schema(client, pymilvus, request: EngineRequest):
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field(PK, pymilvus.DataType.INT64, is_primary=True)
    for model, name in steps.vector_names(request).items():
        schema.add_field(name, pymilvus.DataType.FLOAT_VECTOR, dim=request.dim(model))
    return schema


def _create(client, pymilvus, request: EngineRequest) -> None:
    client.create_collection(COLLECTION, schema=_schema(client, pymilvus, request))


def _batches(request: EngineRequest, size: int):
    """(rows, count) for every insert request of ``size`` items, in id order, moving the ingest progress bar."""
    names = steps.vector_names(request)
    tick = steps.ticker(request, "milvus: inserting items", request.n_items)
    for start, stop, blocks in request.item_blocks(size):
        columns = {name: blocks[m] for m, name in names.items()}
        yield [{PK: i, **{name: columns[name][i - start] for name in names.values()}} for i in range(start, stop)]
        tick(stop - start)


def _insert(client, request: EngineRequest) -> None:
    for rows in _batches(request, INSERT_ROWS):
        client.insert(COLLECTION, rows)
    client.flush(COLLECTION)


def _build(client, pymilvus, request: EngineRequest, metric: str) -> None:
    kind, build, _ = index_params(request)
    for name in steps.vector_names(request).values():
        params = client.prepare_index_params()
        # nested: pymilvus 3 flattens ``params`` into one key per setting, which Milvus Lite 3.2.2 drops (it reads
        # only a JSON ``params`` key: adapter/grpc/translators/index.py kv_pairs_to_index_params_dict), so M,
        # efConstruction and nlist would silently be its defaults (16, 200, 128)
        params.add_index(field_name=name, index_type=kind, metric_type=metric, params={"params": build} if build else None)
        try:
            client.create_index(COLLECTION, params, sync=False)  # Lite builds in load_collection: no 0.5 s polls
        except pymilvus.MilvusException as err:
            # pymilvus re-sends create_index after an RPC failure (decorators.retry_on_rpc_failure); with a million
            # rows the server thread can be busy long enough that the first request is applied but its answer lost,
            # and the retry is refused as "index already exists" (code 35): the index it made is the one asked for
            if getattr(err, "code", None) != INDEX_EXISTS or not _built_as_asked(client, name, kind, build, metric):
                raise
    client.load_collection(COLLECTION)


def _built_as_asked(client, field: str, kind: str, build: dict, metric: str) -> bool:
    """Whether ``field``'s index is ``kind`` with ``metric`` and every setting of ``build`` (describe_index)."""
    made = client.describe_index(COLLECTION, index_name=field) or {}
    params = made.get("params") or {}
    return (str(made.get("index_type", "")).upper() == kind and str(made.get("metric_type", "")).upper() == metric
            and all(params.get(k) == v for k, v in build.items()))


def _rows(result) -> list[list[tuple[int, float]]]:
    """A SearchResult as per-query (id, score) lists (``Hits.ids`` / ``.distances``: no per-hit objects)."""
    return [list(zip(hits.ids, hits.distances)) for hits in result]


def _ranker(pymilvus, request: EngineRequest):
    if request.fusion.preset == "milvus_rrf":
        return pymilvus.RRFRanker(k=request.fusion.params["rrf_k"])
    return pymilvus.WeightedRanker(*(float(request.weights[m]) for m in request.models), norm_score=True)


class _Searcher:
    """The singles and the hybrid request for a block of queries, against the loaded collection."""

    def __init__(self, client, pymilvus, request: EngineRequest, metric: str):
        self.client, self.pymilvus, self.request = client, pymilvus, request
        _, _, extra = index_params(request)
        self.param = {"metric_type": metric, "params": extra}
        self.names = steps.vector_names(request)
        self.ranker = _ranker(pymilvus, request)

    def single(self, model: str, start: int, stop: int) -> list[list[tuple[int, float]]]:
        result = self.client.search(COLLECTION, data=self.request.queries[model][start:stop], anns_field=self.names[model],
                                    search_params=self.param, limit=self.request.per_model_k, output_fields=[PK])
        return _rows(result)

    def fused(self, start: int, stop: int) -> list[list[tuple[int, float]]]:
        reqs = [self.pymilvus.AnnSearchRequest(data=self.request.queries[m][start:stop], anns_field=name,
                                               param=self.param, limit=self.request.per_model_k)
                for m, name in self.names.items()]
        result = self.client.hybrid_search(COLLECTION, reqs, self.ranker, limit=self.request.final_k, output_fields=[PK])
        return _rows(result)


def _search_all(searcher: _Searcher, request: EngineRequest) -> tuple[dict, list, float]:
    """Each model's own search and the hybrid search, in batches; and the seconds the hybrid searches took (what
    the other engines' search time also measures: one fused answer per query)."""
    singles = {m: [] for m in request.models}
    fused, hybrid = [], 0.0
    for start, stop in steps.query_batches(request, "milvus: searching"):
        for m in request.models:
            singles[m] += searcher.single(m, start, stop)
        began = time.perf_counter()
        fused += searcher.fused(start, stop)
        hybrid += time.perf_counter() - began
    return singles, fused, hybrid


def _release(client, path: str) -> None:
    """Close the client, then stop the in-process lite server (pymilvus never does: it keeps it per path until exit)."""
    try:
        if client is not None:
            client.close()
    finally:
        try:
            from milvus_lite.server_manager import server_manager_instance
        except ImportError:
            return
        server_manager_instance.release_server(path)


def require_lite() -> None:
    """milvus-lite is pymilvus' optional part: a missing one is the same one-line error as a missing pymilvus. The
    rules this module follows (and lean_rows) are Milvus Lite 3's, the pure-Python rewrite; 2.x is a C++ server."""
    try:
        import milvus_lite
    except ImportError as err:
        raise FusebenchError(f"search=milvus needs milvus-lite, which is not installed ({err}): pip install "
                             "'fusebench[milvus]'.") from None
    major = str(getattr(milvus_lite, "__version__", "0")).split(".")[0]
    if not major.isdigit() or int(major) < 3:
        raise FusebenchError(f"search=milvus needs milvus-lite 3 (found {milvus_lite.__version__}): pip install "
                             "'milvus-lite>=3.2,<4'.")


def _run_server(request: EngineRequest, pymilvus, metric: str) -> EngineLists:
    """The same steps against the server of ``search.uri``: this run's collection created, filled in batches of
    about 16 MB, indexed, searched, dropped in ``finally`` (kept with ``search.keep_db``); nothing written under
    ``request.workdir``."""
    remote = server.Remote(pymilvus, request.search, request.workdir, request.direction)
    try:
        answered = remote.connect()
        remote.claim()
        client = server.Guarded(remote)
        began = time.perf_counter()
        remote.create(_schema(remote.client, pymilvus, request))
        for rows in _batches(request, server.insert_rows([request.dim(m) for m in request.models])):
            client.insert(COLLECTION, rows)
        client.flush(COLLECTION)
        ingest = time.perf_counter() - began
        began = time.perf_counter()
        try:
            _build(client, pymilvus, request, metric)
        except pymilvus.MilvusException as err:  # an index already there that is not the one asked for
            raise remote.fail("index", err) from None
        build = time.perf_counter() - began
        remote.check_rows(request.n_items)  # loaded now: a server counts rows only in a loaded collection
        searcher = _Searcher(client, pymilvus, request, metric)
        singles, fused, seconds = _search_all(searcher, request)
        latency, _ = steps.latencies(request, lambda q: searcher.fused(q, q + 1))
    finally:
        if not request.search.keep_db:
            remote.drop()
        remote.close()
    said = [f"milvus: answered by the Milvus server at {remote.uri} ({answered}); search_seconds and latency are "
            "client-to-server over the network (gRPC requests from this process), not in-process; disk_bytes 0: "
            "the server's storage is not measured"]
    if request.search.keep_db:
        said.append(f"milvus: search.keep_db=true: collection {remote.name} kept on {remote.uri} (the next run into "
                    "this run dir drops it)")
    return steps.engine_lists(request, singles, fused, ingest_seconds=ingest, build_seconds=build,
                              search_seconds=seconds, latency_ms=latency, disk_bytes=0,
                              version=f"pymilvus {pymilvus.__version__}, Milvus server {answered} at {remote.uri}",
                              notes=said + notes(request))


def run(request: EngineRequest) -> EngineLists:
    pymilvus = require("milvus")
    if request.search.uri is not None:
        return _run_server(request, pymilvus, METRICS[request.fusion.preset])
    require_lite()
    metric = METRICS[request.fusion.preset]
    path = str(request.workdir / "milvus.db")
    client = None
    try:
        began = time.perf_counter()
        client = pymilvus.MilvusClient(path)
        _create(client, pymilvus, request)
        _insert(client, request)
        ingest = time.perf_counter() - began
        began = time.perf_counter()
        _build(client, pymilvus, request, metric)
        build = time.perf_counter() - began
        disk = steps.folder_bytes(request.workdir)
        searcher = _Searcher(client, pymilvus, request, metric)
        with lean_rows(set(steps.vector_names(request).values())) if request.search.milvus_lean_rows else nullcontext():
            singles, fused, seconds = _search_all(searcher, request)
            latency, _ = steps.latencies(request, lambda q: searcher.fused(q, q + 1))
    finally:
        _release(client, path)
    return steps.engine_lists(request, singles, fused, ingest_seconds=ingest, build_seconds=build,
                              search_seconds=seconds, latency_ms=latency, disk_bytes=disk, version=version(), notes=notes(request))


def notes(request: EngineRequest) -> list[str]:
    """What this run's engine does its own way (NOTES, plus the index it really built)."""
    out = list(NOTES) + ([LEAN_NOTE] if request.search.milvus_lean_rows else [])
    kind, build, extra = index_params(request)
    if kind != "FLAT":
        out.append(f"milvus: {kind} {build} {extra} is a FAISS index per flushed segment (milvus_lite index/factory.py); "
                   "the per-segment lists are merged by distance; the build settings are sent as one JSON 'params' "
                   "key (Lite drops pymilvus 3's flattened keys: adapter/grpc/translators/index.py)")
    if request.fusion.preset == "milvus_rrf":
        out.append("milvus: RRFRanker scores are sum 1 / (k + rank) in float64 (merge_op.py MergeOp._merge_rrf)")
    return out


BACKEND = register(Backend(name="milvus", indexes=("flat", "ivf_flat", "hnsw"), params=MilvusParams,
                           label_flags={"milvus_lean_rows": "lean_rows", "uri": "server"},
                           presets=("milvus_rrf", "milvus_weighted", "milvus_weighted_ip"), extra="milvus",
                           module="pymilvus", check=check, run=steps.engine_runner(run, version), version=version,
                           capacity=CAPACITY, served=served, preflight=preflight, order=30))
