"""The ``search`` config group: which index answers each model's queries, and, for an engine, who fuses.

``backend``:

* ``exact``   brute-force search (the default; exact ranks in each model's full ranking);
* ``faiss``   a FAISS index per model and direction, built from the cached embeddings (``index``: ``flat`` |
  ``ivf_flat`` | ``hnsw`` | ``ivf_pq`` | ``ivf_pqfs``: IVF-PQ with 4-bit fast-scan codes), stored content-addressed
  beside the list store; fusebench fuses the index's lists with the run's fusion;
* ``milvus`` | ``lancedb`` | ``qdrant``: the engine itself, embedded (Milvus Lite, LanceDB, Qdrant's local mode):
  the cached embeddings are loaded into it, and it answers every query with its own hybrid search and its own
  fusion (the run's ``fusion`` must be one of that engine's presets).

Every backend but ``exact`` returns lists ``fusion.top_k`` deep per model: a query whose first correct item is not
in its list counts as missed (rank past the list). Each such run also evaluates the same fusion on exact lists
(``exact_fused``) and compares query by query. Parameter names follow FAISS (docs/search.md maps them to each
engine's). Light on purpose: no numpy, torch or faiss. What is a backend's own (the indexes it builds, the settings
it reads, an engine's presets and limits) is checked by the backend (:mod:`fusebench.backends`).

The schema is assembled from the registry of backends (:data:`BACKENDS`, filled by a scan of
``fusebench.backends.kinds``, imported by dotted name: no import points up): :class:`SearchKeys` holds the keys
several backends read, and each backend's own parameters (its ``params`` dataclass: ``search.milvus_lean_rows``
is Milvus') are added to it flat, so ``search.KEY`` stays one level deep and a new backend's keys are its module's.
A module the scan imports must not import :class:`SearchConfig` at its top (it is assembled after the scan).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields, make_dataclass

from fusebench import FusebenchError
from fusebench.runtime import checks
from fusebench.runtime.plugins import Registry

INDEXES = ("flat", "ivf_flat", "hnsw", "ivf_pq", "ivf_pqfs")
IVF_INDEXES = ("ivf_flat", "ivf_pq", "ivf_pqfs")  # inverted lists: nlist, nprobe, a k-means quantizer
PQ_INDEXES = ("ivf_pq", "ivf_pqfs")  # product-quantised codes: pq_m sub-quantizers
FASTSCAN_SUBDIMS = 2  # ivf_pqfs: dimensions a sub-quantizer codes when search.pq_m is null (pq_layout)
FASTSCAN_MAX_M = 256  # ivf_pqfs: sub-quantizers at most when search.pq_m is null
FASTSCAN_BITS = 4  # ivf_pqfs: FAISS's fast-scan codes are 4 bits a sub-quantizer (search.nbits is IVF-PQ's)
# The settings each index type reads (a setting the chosen index does not read must keep its default: refused
# otherwise, as checks.unread says); the k-means seed is FAISS's (the engines train their own). Which backend builds
# which index, and the settings each backend reads, are the backends' own (fusebench.backends: their registry).
TARGET_READS = ("target_recall", "tune_queries", "tune_images")  # an index with a search-time setting to choose
INDEX_READS = {"flat": (), "ivf_flat": ("nlist", "nprobe", "seed", *TARGET_READS),
               "hnsw": ("hnsw_m", "ef_construction", "ef_search", *TARGET_READS),
               "ivf_pq": ("nlist", "nprobe", "pq_m", "nbits", "seed", "refine_factor", *TARGET_READS),
               "ivf_pqfs": ("nlist", "nprobe", "pq_m", "seed", "refine_factor", *TARGET_READS)}
TUNE_QUERIES = ("auto", "split", "held_out")  # search.tune_queries (backends.target_recall)
# the search-time setting search.target_recall chooses for each index type (FAISS's name, the config key)
TUNED = {"ivf_flat": ("nprobe", "nprobe"), "ivf_pq": ("nprobe", "nprobe"), "ivf_pqfs": ("nprobe", "nprobe"),
         "hnsw": ("efSearch", "ef_search")}
IVF_MIN_POINTS = 39  # FAISS k-means wants at least 39 training points per list (it warns below that)
# the search backends (fusebench.backends.base.Backend, one module each in fusebench.backends.kinds), by their order
BACKENDS = Registry("fusebench.backends.kinds", "search backend", "search.backend")


@dataclass
class SearchKeys:
    """The ``search`` keys several backends read; :class:`SearchConfig` adds each backend's own."""

    backend: str = "exact"  # exact | faiss | milvus | lancedb | qdrant (fusebench.backends.kinds registers them)
    index: str = "flat"  # flat | ivf_flat | hnsw | ivf_pq | ivf_pqfs (each backend says which it builds)
    nlist: int | None = 64  # ivf_*: inverted lists; null = min(4 sqrt(n), n / 39) for an index of n items (ivf_pqfs
    #   and a list-major ivf_flat, search.list_major: min(sqrt(n), n / 39): they want longer lists)
    nprobe: int = 52  # ivf_*: lists visited per query (1..nlist); 52 of 64 reaches neighbour recall@100 0.97 on the
    #   COCO-size sim, whose isotropic embeddings have no clusters (real embeddings need far fewer: docs/search.md)
    hnsw_m: int = 32  # hnsw: links per node (FAISS/Milvus "M")
    ef_construction: int = 200  # hnsw: candidate list while building (FAISS efConstruction)
    ef_search: int = 256  # hnsw: candidate list per query (FAISS efSearch, Milvus "ef"); at least the list depth
    pq_m: int | None = None  # ivf_pq, ivf_pqfs: sub-quantizers (FAISS zero-pads the width to a multiple; an engine's
    #   must divide it); null = width / 4, at most 64 (ivf_pq), width / 2, at most 256 (ivf_pqfs: 4-bit codes)
    nbits: int = 8  # ivf_pq: bits per sub-quantizer code (4..12)
    refine_factor: int | None = None  # ivf_pq (faiss, lancedb): re-rank refine_factor x k PQ hits by their full
    #   vectors (FAISS IndexRefineFlat's k_factor, LanceDB's refine_factor); null = PQ distances as they are
    seed: int = 1234  # k-means training seed (FAISS's default); part of an index's store key
    threads: int | None = None  # FAISS/engine threads; null = every core
    latency_queries: int = 100  # engines: queries sent again one request at a time (median and p95 latency); 0 = none
    batch_size: int = 256  # engines: queries per request for the lists themselves
    keep_db: bool = False  # engines: keep the engine's database in the run dir (engine_db/); false = removed after
    target_recall: float | None = None  # faiss ivf_*/hnsw: the smallest nprobe / ef_search whose neighbour recall at
    #   the list depth reaches this (0 < t <= 1) on queries outside every reported metric; null = as set
    tune_queries: str = "auto"  # target_recall's queries: split (the dataset's other split: Karpathy val, a sim val
    #   draw) | held_out (test images held out of every reported metric) | auto (split where there is one)
    tune_images: int = 200  # target_recall: images of those queries (their captions: t2i; themselves: i2t); held_out
    #   takes at most 10% of the test images with captions

    def __post_init__(self):
        checks.text(self.backend, "search.backend")
        checks.choice(self.index, "search.index", INDEXES)
        checks.optional_integer(self.nlist, "search.nlist", 1, "null = min(4 sqrt(n), n / 39)")
        checks.integer(self.nprobe, "search.nprobe", 1, "inverted lists visited per query")
        checks.integer(self.hnsw_m, "search.hnsw_m", 2, "links per node; 16-64 usual")
        checks.integer(self.ef_construction, "search.ef_construction", 1)
        checks.integer(self.ef_search, "search.ef_search", 1, "at least the list depth (fusion.top_k, eval.save_topk)")
        checks.optional_integer(self.pq_m, "search.pq_m", 1, "at most each model's width; null = width / 4")
        checks.integer(self.nbits, "search.nbits", 4)
        checks.optional_integer(self.refine_factor, "search.refine_factor", 1, "null = no re-ranking")
        if self.nbits > 12:
            raise FusebenchError(f"search.nbits={self.nbits} is not valid; valid: 4..12 (bits per PQ code).")
        checks.integer(self.seed, "search.seed", 0)
        checks.optional_integer(self.threads, "search.threads", 1, "null = every core")
        checks.integer(self.latency_queries, "search.latency_queries", 0)
        checks.integer(self.batch_size, "search.batch_size", 1)
        checks.boolean(self.keep_db, "search.keep_db")
        for backend in BACKENDS.items():  # each backend's own keys, checked (and normalised) by its params dataclass
            own = self.params_of(backend)
            for key in own_keys(backend):
                setattr(self, key, getattr(own, key))
        self._check_target()
        if self.nlist is not None and self.index in IVF_INDEXES and self.target_recall is None:
            check_nprobe(self, self.nlist, f"search.nlist={self.nlist}")

    def _check_target(self) -> None:
        """``target_recall`` in (0, 1], with a backend that has an index to tune, and not beside the setting it
        chooses (an index type without one, or an engine, is refused by the backends' ``unread`` check)."""
        checks.choice(self.tune_queries, "search.tune_queries", TUNE_QUERIES)
        checks.integer(self.tune_images, "search.tune_images", 1, "images whose captions tune the index")
        if self.target_recall is None:
            for key in ("tune_queries", "tune_images"):
                if getattr(self, key) != getattr(SearchKeys, key):
                    raise FusebenchError(f"search.{key}={getattr(self, key)} is read only with search.target_recall "
                                         "set (the queries it tunes an index on): set search.target_recall, or leave "
                                         f"search.{key} unset.")
            return
        checks.number(self.target_recall, "search.target_recall", 0, 1, open_low=True,
                      hint="neighbour recall at the list depth, e.g. 0.95; null = nprobe / ef_search as set")
        self.target_recall = float(self.target_recall)
        if self.backend == "exact":
            raise FusebenchError(f"search.target_recall={self.target_recall:g} picks an index's nprobe or ef_search, "
                                 "and search=exact searches every item: valid with search.backend=faiss and "
                                 "search.index=ivf_flat | ivf_pq | hnsw; leave it unset (null) with search=exact.")
        if self.index not in TUNED:
            return  # refused by the backend's check (backends.base.check_search: the index never reads it)
        setting, key = TUNED[self.index]
        if getattr(self, key) != getattr(SearchKeys, key):
            raise FusebenchError(f"search.{key}={getattr(self, key)} is chosen by search.target_recall="
                                 f"{self.target_recall:g} when that is set: leave search.{key} unset, or set "
                                 "search.target_recall=null to search with it as set.")

    def params_of(self, backend):
        """``backend``'s own parameters (an instance of its ``params`` dataclass, checked) as this config sets them;
        None for a backend without any."""
        if backend.params is None:
            return None
        return backend.params(**{key: getattr(self, key) for key in own_keys(backend)})

    @property
    def tuned(self) -> str | None:
        """The search-time parameter (FAISS's name) ``target_recall`` chooses, or None when it is not set."""
        return TUNED[self.index][0] if self.target_recall is not None and self.index in TUNED else None

    @property
    def approximate(self) -> bool:
        """True for every backend but ``exact``: lists from an index, ranks past the list missed."""
        return self.backend != "exact"

    def label(self) -> str:
        """The backend and the parameters that ran, for tables and plots: 'faiss hnsw M=32 efSearch=256'."""
        if self.backend == "exact":
            return "exact"
        params = self.index_params()
        if self.tuned:  # chosen per model and direction (the record's params): the target names the setting
            params = {k: v for k, v in params.items() if k != self.tuned} | {"target_recall": self.target_recall}
        if self.index.startswith("ivf") and self.seed != SearchKeys.seed:  # another k-means: another index
            params["seed"] = self.seed
        flags = BACKENDS.get(self.backend).label_flags  # its settings said in every label (a patched engine's times)
        words = [word for key, word in flags.items() if getattr(self, key)]
        return " ".join([self.backend, self.index, *(f"{k}={v}" for k, v in params.items()), *words])

    def index_params(self) -> dict:
        """The parameters the index type reads (FAISS names), as set (nlist/pq_m may be null = automatic)."""
        if self.index == "hnsw":
            return {"M": self.hnsw_m, "efConstruction": self.ef_construction, "efSearch": self.ef_search}
        if self.index == "ivf_flat":
            return {"nlist": self.nlist or "auto", "nprobe": self.nprobe}
        if self.index in PQ_INDEXES:
            refine = {"refine_factor": self.refine_factor} if self.refine_factor else {}  # absent: earlier labels hold
            return {"nlist": self.nlist or "auto", "m": self.pq_m or "auto", "nbits": pq_bits(self),
                    "nprobe": self.nprobe, **refine}
        return {}


def own_keys(backend) -> tuple[str, ...]:
    """The ``search.*`` keys only ``backend`` reads: its params dataclass's fields."""
    return tuple(f.name for f in fields(backend.params)) if backend.params is not None else ()


def _assembled() -> type:
    """:class:`SearchKeys` with every registered backend's own keys added flat (in the backends' order): the
    ``search`` group's schema (Hydra's ``schema_search``) and typed form."""
    own, taken = [], {f.name: "every backend" for f in fields(SearchKeys)}
    for backend in BACKENDS.items():
        if backend.params is None:
            continue
        hints = typing.get_type_hints(backend.params)  # the real types (a plugin's annotations are strings)
        for f in fields(backend.params):
            if f.name in taken:  # a plugin's bug, not a user's mistake
                raise RuntimeError(f"search.{f.name} of backend {backend.name!r} is already {taken[f.name]}'s")
            taken[f.name] = backend.name
            own.append((f.name, hints[f.name], field(default=f.default)))
    config = make_dataclass("SearchConfig", own, bases=(SearchKeys,))
    config.__module__ = __name__
    config.__doc__ = ("The ``search`` config group: the keys several backends read (:class:`SearchKeys`) and each "
                      "backend's own (its ``params``), one level deep.")
    return config


def auto_nlist(n_items: int) -> int:
    """The default number of inverted lists for ``n_items`` vectors: FAISS's 4 sqrt(n) guideline, capped so that
    every list trains on at least 39 points (k-means' minimum), and at least 1."""
    return max(1, min(round(4 * math.sqrt(n_items)), n_items // IVF_MIN_POINTS))


def fastscan_nlist(n_items: int) -> int:
    """``ivf_pqfs``'s (and a list-major ``ivf_flat``'s) default number of inverted lists: sqrt(n), capped at 39
    items a list, at least 1. Fast-scan codes are scanned 32 at a time with a lookup table built per query and
    list, so fewer, longer lists than :func:`auto_nlist`'s amortise it (at 205,000 clustered sim items: 452 lists
    scanned 3x faster a code than 1,811 for the same neighbour recall, docs/search.md); a list-major scan
    (``search.list_major``) multiplies each list by the queries that probe it, which longer lists make a larger,
    faster matmul."""
    return max(1, min(round(math.sqrt(n_items)), n_items // IVF_MIN_POINTS))


def default_nlist(index: str, n_items: int, list_major: bool = False) -> int:
    """``search.nlist: null``'s lists for an index of ``index`` over ``n_items`` items (``list_major``: FAISS's
    ``search.list_major`` scan, which wants longer lists)."""
    return fastscan_nlist(n_items) if index == "ivf_pqfs" or list_major else auto_nlist(n_items)


def _list_major(config: SearchConfig) -> bool:
    """FAISS's own ``search.list_major`` (kinds.faiss's params, flat on SearchConfig), which sizes nlist's default."""
    return bool(getattr(config, "list_major", False))


def resolved_nlist(config: SearchConfig, n_items: int) -> int:
    return config.nlist if config.nlist is not None else default_nlist(config.index, n_items, _list_major(config))


def check_nprobe(config: SearchConfig, nlist: int, lists: str) -> None:
    """An IVF index visits at most its ``nlist`` lists (``lists`` says which, for the message)."""
    if config.nprobe > nlist:
        raise FusebenchError(f"search.nprobe={config.nprobe} is more than the {nlist} lists of {lists}: valid "
                             f"search.nprobe is 1..{nlist} (nprobe = nlist visits every list).")


def check_depth(config: SearchConfig, depth: int) -> None:
    """HNSW returns at most ``ef_search`` neighbours: refused below the list depth the run needs (``fusion.top_k``,
    ``eval.lists.depth``, ``eval.save_topk``), when the config is checked."""
    if config.index == "hnsw" and config.ef_search < depth and config.target_recall is None:
        raise FusebenchError(f"search.ef_search={config.ef_search} is below the list depth {depth} (fusion.top_k, "
                             f"eval.lists.depth, eval.save_topk): HNSW returns at most ef_search neighbours; valid "
                             f"search.ef_search >= {depth}.")


def check_sizes(config: SearchConfig, n_items: dict[str, int], depth: int) -> None:
    """What the index cannot do for this corpus, refused once its size is known and before any embedding work
    (every backend's index: FAISS's and the engines'): ``nlist`` over the items an index of each direction holds,
    ``nprobe`` over its lists, IVF-PQ's codebooks over the items they train on, ``ef_search`` over the largest
    index's items (``depth``: the list depth, for the message)."""
    if config.index in IVF_INDEXES:
        for direction, n in n_items.items():
            nlist = resolved_nlist(config, n)
            if nlist > n:
                raise FusebenchError(f"search.nlist={config.nlist} is more than the {n:,} items a {direction} index "
                                     f"holds: valid search.nlist is 1..{n} (or null = "
                                     f"{default_nlist(config.index, n, _list_major(config))}).")
            if config.target_recall is None:  # else nprobe is chosen in 1..nlist
                check_nprobe(config, nlist, f"the {direction} index ({n:,} items, search.nlist="
                                            f"{config.nlist if config.nlist else 'null = auto'})")
    if config.index == "ivf_pqfs":  # 16 centroids a sub-quantizer (4-bit codes: no setting to lower)
        for direction, n in n_items.items():
            if n < 2 ** FASTSCAN_BITS:
                raise FusebenchError(f"search.index=ivf_pqfs needs at least {2 ** FASTSCAN_BITS} items to train its "
                                     f"4-bit PQ codebooks, and the {direction} index holds {n:,}: valid here "
                                     "search.index=flat | ivf_flat | hnsw.")
    if config.index == "ivf_pq":  # k-means on 2^nbits centroids per sub-quantizer (FAISS refuses fewer rows;
        for direction, n in n_items.items():  # LanceDB silently leaves every row unindexed)
            if n < 2 ** config.nbits:
                top = max(4, n.bit_length() - 1)
                raise FusebenchError(f"search.nbits={config.nbits} needs at least {2 ** config.nbits:,} items to train its "
                                     f"PQ codebooks, and the {direction} index holds {n:,}: valid search.nbits is 4..{top} "
                                     f"here (or search.index=flat | hnsw).")
    largest = max(n_items.values())
    if config.index == "hnsw" and config.ef_search > largest and config.target_recall is None:
        raise FusebenchError(f"search.ef_search={config.ef_search} is more than the {largest:,} items the largest "
                             f"index holds: HNSW never visits more than every item, and a larger value only costs "
                             f"time; valid search.ef_search is {depth}..{largest}.")


def resolve_pq_m(config: SearchConfig, dim: int, model: str) -> int:
    """The sub-quantizer count for a model ``dim`` wide where the vectors cannot be padded (an engine's IVF_PQ):
    ``pq_m``, which must divide it, or width / 4 capped at 64 (the largest divisor of ``dim`` that is at most both).
    FAISS pads instead: :func:`pq_layout`."""
    if config.pq_m is not None:
        if dim % config.pq_m:
            divisors = [m for m in range(1, dim + 1) if dim % m == 0]
            raise FusebenchError(f"search.pq_m={config.pq_m} does not divide model {model}'s width {dim}; valid: a "
                                 f"divisor of {dim} ({', '.join(map(str, divisors))}), or null (automatic).")
        return config.pq_m
    return _largest_divisor(dim, _pq_cap(dim))


def _pq_cap(dim: int) -> int:
    return max(1, min(dim // 4, 64))  # sub-vectors at least 4 wide, at most 64 codebooks


def _largest_divisor(dim: int, cap: int) -> int:
    return max(m for m in range(1, cap + 1) if dim % m == 0)


def pq_bits(config: SearchConfig) -> int:
    """Bits per PQ code: 4 for ``ivf_pqfs`` (fast-scan), ``search.nbits`` for ``ivf_pq``."""
    return FASTSCAN_BITS if config.index == "ivf_pqfs" else config.nbits


def pq_layout(config: SearchConfig, dim: int, model: str) -> tuple[int, int]:
    """FAISS IVF-PQ's (sub-quantizers m, coded width) for a model ``dim`` wide. The coded width is ``dim`` zero-padded
    up to a multiple of m (zeros change no inner product), so m need not divide the width: ``pq_m`` as set (at most
    ``dim``), or automatically width / 4 capped at 64: the largest divisor of ``dim`` up to that cap when it is at
    least half the cap (no padding: 768, 1024, 1152, 1280 and 1026 keep their divisor), else the cap itself over
    padded vectors (width 1154 = 2 x 577 gets m = 64 over 1,216 dims where a divisor would give m = 2). ``ivf_pqfs``
    (4-bit codes, FAISS's fast scan): automatically ``FASTSCAN_SUBDIMS`` dimensions a sub-quantizer, m = ceil(width /
    that) at most 256, the width zero-padded to m times that."""
    if config.pq_m is not None:
        if config.pq_m > dim:
            raise FusebenchError(f"search.pq_m={config.pq_m} is more than model {model}'s width {dim}: each "
                                 f"sub-quantizer codes at least one dimension; valid: 1..{dim}, or null (automatic).")
        m = config.pq_m
    elif config.index == "ivf_pqfs":
        m = min(-(-dim // FASTSCAN_SUBDIMS), FASTSCAN_MAX_M)
    else:
        cap = _pq_cap(dim)
        divisor = _largest_divisor(dim, cap)
        m = divisor if 2 * divisor >= cap else cap
    return m, -(-dim // m) * m


SearchConfig = _assembled()  # last: the backends' modules import this module's functions above while it is read
