"""The one interface every search backend implements, and the registry that holds them.

A backend is one module of :mod:`fusebench.backends.kinds` that registers one :class:`Backend`: what it is (its
name and ``order``, the index types it builds, the shared ``search.*`` settings it reads, its own settings as a
``params`` dataclass, for an engine the fusion presets it runs, the pip extra it needs), its own rules, checked once
when the config is checked and before any work (``check``), and its run (``run``: every retriever's
:class:`~fusebench.search.ranked.RankedLists` and, for an approximate backend, the record's ``search`` block). The
registry (:data:`REGISTRY`, ``config.search.BACKENDS``) finds them by a scan of that package; a module's top level
imports nothing heavy (no torch, faiss or engine package: those are imported when it runs), so that checking a
config stays fast. Adding a backend: one module in ``kinds/``, one ``conf/search/NAME.yaml``, one line in
docs/search.md.

Every table the config layer reads about backends (the valid backends, the indexes each builds, the settings each
reads, the ``search`` schema's own keys, the engines' presets and extras) is derived from the registry, never
written beside it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fusebench import FusebenchError
from fusebench.config.search import BACKENDS, INDEX_READS, own_keys
from fusebench.fusion import presets
from fusebench.runtime import checks
from fusebench.runtime.plugins import Registry

if TYPE_CHECKING:
    from fusebench.config.search import SearchConfig
    from fusebench.evaluation.search_record import SearchRecord
    from fusebench.fusion.config import FusionConfig
    from fusebench.search.ranked import RankedLists

ENGINE_READS = ("latency_queries", "batch_size", "keep_db")  # the shared settings every engine reads


@dataclass
class BackendResult:
    lists: dict[str, dict[str, RankedLists]]  # retriever (models, fused, exact_fused) -> direction -> its lists
    record: SearchRecord | None = None  # the record's search block (None: exact search)
    differences: list[dict] = field(default_factory=list)  # engines: the queries whose top 10 differ from the preset


@dataclass(frozen=True)
class Capacity:
    """The most items an embedded engine holds in one run on the machine class fusebench is checked on (2 cores,
    24 GB), and the measurement that set it (scripts/bench_engine_gallery.py; docs/search.md)."""

    items: int  # gallery items (test images and distractors) at most
    measured: str  # what was measured, for the message: "ingest 1,090 s and 5.1 GB at 200,000 items ..."
    server: str  # the engine's server form, for sizes past it: "Milvus standalone or distributed"


@dataclass(frozen=True)
class Backend:
    name: str  # search.backend
    indexes: tuple[str, ...]  # the search.index values it builds (the first is what it builds by default)
    reads: tuple[str, ...] = ()  # the shared search.* settings it reads beside its index's own (INDEX_READS) and,
    #   for an engine, ENGINE_READS
    params: type | None = None  # a dataclass of the search.* settings only it reads (type, default, check in its
    #   __post_init__); SearchConfig adds them flat (config.search)
    label_flags: dict[str, str] = field(default_factory=dict)  # its own true/false setting -> the word the run's
    #   label ends in when it is true (a patched engine's times: "lean_rows")
    order: int = 50  # where it stands in every list of backends (messages, docs): exact first
    presets: tuple[str, ...] = ()  # an engine: the fusion presets it fuses by (conf/fusion/NAME.yaml); none: fusebench fuses
    extra: str | None = None  # the pip extra it needs ('fusebench[EXTRA]')
    module: str | None = None  # the library it imports, through require()
    document: bool = False  # an engine: whether it holds one entry per model's hit (fusion.fuse_on=document)
    index_note: str = ""  # why an index outside ``indexes`` is not one it builds, for the message
    reads_note: str = ""  # what it does instead of reading another backend's settings, for the message
    check: Callable[[SearchConfig, FusionConfig, list[float]], None] | None = None  # its own rules (config time)
    run: Callable[..., BackendResult] | None = None  # (models, caption_image, fusion, keep_k, search, settings,
    #   source, out_dir) -> BackendResult
    version: Callable[[], str] | None = None  # the library's version, for the record
    capacity: Capacity | None = None  # an engine: the most items it holds here (None: as many as the gallery has)
    served: Callable[[SearchConfig], bool] | None = None  # an engine: whether this config drives its server form
    #   (whose capacity is the server's: ``capacity`` is then not checked; its own rules are in ``check``)
    preflight: Callable[[SearchConfig, str], None] | None = None  # an engine: what it checks for the run dir
    #   before any work (a server that answers, no collection of someone else's under the run's names)

    @property
    def engine(self) -> bool:
        """An embedded engine: it answers with its own hybrid search and its own fusion of a preset."""
        return bool(self.presets)

    @property
    def settings(self) -> tuple[str, ...]:
        """Every search.* setting it reads beside its index's own: the shared ones, an engine's, its own."""
        return (*self.reads, *(ENGINE_READS if self.engine else ()), *own_keys(self))


REGISTRY: Registry[Backend] = BACKENDS  # filled by a scan of fusebench.backends.kinds (held by config.search, whose
#   schema adds each backend's params)
register = REGISTRY.register


def names() -> tuple[str, ...]:
    return REGISTRY.names()


def get(name: str) -> Backend:
    """The backend ``search.backend`` names (a name no backend registered is refused, naming the valid ones)."""
    return REGISTRY.get(name)


def engines() -> tuple[str, ...]:
    return tuple(b.name for b in REGISTRY.items() if b.engine)


def engine_presets() -> dict[str, tuple[str, ...]]:
    """engine -> the fusion presets it runs."""
    return {b.name: b.presets for b in REGISTRY.items() if b.engine}


def require(name: str):
    """Import the library backend ``name`` needs, or a FusebenchError naming the extra to install (exit 2)."""
    backend = get(name)
    if backend.module is None:
        return None
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its INFO lines list the CPU builds it tried
    try:
        return importlib.import_module(backend.module)
    except ImportError as err:
        raise FusebenchError(f"search={name} needs {backend.module}, which is not installed ({err}): pip install "
                             f"'fusebench[{backend.extra}]'.") from None


def check_search(search: SearchConfig, fusion: FusionConfig, weights: list[float]) -> Backend:
    """The search group against its backend, once, when the config is checked: the index is one the backend builds,
    no setting is set that neither the index nor the backend reads, and the backend's own rules hold."""
    backend = get(search.backend)
    if search.index not in backend.indexes:
        raise FusebenchError(f"search.index={search.index} is not an index search.backend={search.backend} builds; "
                             f"valid: {', '.join(backend.indexes)}{backend.index_note}.")
    checks.unread(search, "search", "index", INDEX_READS, " (a flat index compares every item)"
                  if search.index == "flat" else "")
    checks.unread(search, "search", "backend", {b.name: b.settings for b in REGISTRY.items()}, backend.reads_note)
    if backend.engine:
        check_engine(backend, search, fusion, weights)
    if backend.check is not None:
        backend.check(search, fusion, weights)
    return backend


def _unweighted_preset(backend: Backend, fusion: FusionConfig, weights: list[float]) -> str | None:
    """The engine's preset this fusion is but for unequal weights, which its ranker does not take (its label was
    dropped for them: ``fusion.presets.true_label``); None otherwise."""
    if fusion.preset is not None or len(set(weights)) < 2:
        return None
    for name in backend.presets:
        if name in presets.UNWEIGHTED and not presets.changes(fusion, presets.definition(name, presets.config_folders())):
            return name
    return None


def check_engine(backend: Backend, search: SearchConfig, fusion: FusionConfig, weights: list[float]) -> None:
    """What every engine needs: two or more models, one of its presets unchanged (a preset whose settings or
    weights the engine's ranker would not take is no longer that preset: ``fusion.presets.true_label``), and one
    entry per model's hit for ``fuse_on=document``."""
    what = f"search={backend.name}"
    if len(weights) < 2 or fusion.method == "none":
        raise FusebenchError(f"{what} runs the engine's hybrid search over two or more models: select two or more "
                             "models and one of the engine's presets (fusion=...).")
    unweighted = _unweighted_preset(backend, fusion, weights)
    if unweighted is not None:
        weighted = [p for p in backend.presets if p not in presets.UNWEIGHTED]  # the engine's presets that take them
        raise FusebenchError(f"fusion={unweighted} takes no per-model weights ({presets.UNWEIGHTED[unweighted]}), but the "
                             f"models' weights differ ({'/'.join(f'{w:g}' for w in weights)}): valid: equal weights"
                             + "".join(f", or fusion={p}" for p in weighted) + ".")
    if fusion.preset not in backend.presets:
        why = ("this fusion is no preset: a plain method, or a preset whose settings or weights the engine's ranker "
               "does not take" if fusion.preset is None else f"fusion={fusion.preset} is another engine's")
        raise FusebenchError(f"{what} fuses by the engine's own rule, so the fusion must be one of its presets, "
                             f"unchanged ({why}); valid: {' | '.join(f'fusion={p}' for p in backend.presets)}.")
    if fusion.fuse_on == "document" and not backend.document:
        raise FusebenchError(f"fusion.fuse_on=document needs one entry per model's hit, which {what} does not hold "
                             "(one row per image with every model's vector): valid fusion.fuse_on=source_object.")


def engine_points(n_images: int, n_captions: int, n_models: int, document: bool) -> int:
    """The most items one engine collection holds in a run: the larger direction's (t2i: the images with any
    distractors; i2t: the captions), once per model with ``fusion.fuse_on=document`` (a point per model's vector)."""
    return max(n_images, n_captions) * (n_models if document else 1)


def check_capacity(backend: Backend, n_models: int, document: bool, distractors: int, n_test: int | None = None,
                   n_captions: int = 0, search: SearchConfig | None = None) -> None:
    """Refuse an engine asked to hold more than it serves on this class of machine (its measured :class:`Capacity`),
    before any work: one line with the measurement, what is valid here, and the engine's server form. The one
    rule, checked with what is known: ``n_test`` None when the config is checked (the distractors alone, as a lower
    bound), then the test images and the captions once the corpus is read (:func:`engine_points`). A config that
    drives the engine's server (``Backend.served``) is the server's to hold: not checked here."""
    cap = backend.capacity
    if cap is None or (search is not None and backend.served is not None and backend.served(search)):
        return
    points = engine_points((n_test or 0) + distractors, n_captions, n_models, document)
    if points <= cap.items:
        return
    most = cap.items // (n_models if document else 1)  # images (or captions) one collection may hold
    if n_test is None:
        what, valid = f"gallery.size={distractors:,}", f"gallery.size well under {most:,} (the test images count too)"
    else:
        what = f"{n_test:,} images" + (f" and {distractors:,} distractors" if distractors else "") + \
            f", {n_captions:,} captions"
        valid = (f"gallery.size at most {most - n_test:,}" if distractors and most > n_test and most >= n_captions
                 else f"a corpus of at most {most:,} images and captions")
    raise FusebenchError(f"search={backend.name} with {what} ({points:,} items in one collection) is past the "
                         f"{cap.items:,} its embedded form serves on this class of machine (2 cores, 24 GB; measured: "
                         f"{cap.measured}); valid: {valid}, or the engine's server form ({cap.server}), "
                         "or search=faiss_* for an index over the whole gallery.")
