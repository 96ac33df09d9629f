"""The interface every embedded engine implements: :class:`EngineRequest` in, :class:`EngineLists` out.

An engine module (``fusebench.engines.milvus``, ``lancedb``, ``qdrant``) has ``run(request) -> EngineLists`` and
``version() -> str``. It loads ``request.items`` into its engine (item id = row index), builds the index
``request.search`` names, and sends every query through the engine's own search: each model alone (``singles``,
``per_model_k`` deep) and the engine's hybrid search over all models with its own fusion of the preset
``request.fusion`` (``fused``, ``final_k`` deep, the same limits the preset has in fusebench). It writes only
under ``request.workdir`` (an empty folder the caller made and removes). Importing an engine's package happens
inside ``run``/``version``, through :func:`require`, so that a missing extra is one line (exit 2).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.config.search import EXTRAS, SearchConfig
from fusebench.fusion.config import FusionConfig

Progress = Callable[[str, int], Callable[[int], None]]  # (description, total) -> update(n)


@dataclass
class EngineRequest:
    direction: str  # "t2i": items are images, queries captions | "i2t": items are captions, queries images
    items: dict[str, np.ndarray]  # model -> (n_items, dim) float32 L2-normalised rows; item id = row index
    queries: dict[str, np.ndarray]  # model -> (n_queries, dim) float32 L2-normalised rows (same models, same order)
    weights: dict[str, float]  # model -> its weight (engines that take weights pass them on)
    fusion: FusionConfig  # the engine preset (fusion.preset names it; fuse_on says source_object or document)
    per_model_k: int  # each model's search limit (the preset's top_k, at most n_items)
    final_k: int  # the fused list's length (the preset's final_top_k)
    search: SearchConfig  # index type and parameters, threads, batch size, latency_queries
    workdir: Path  # the only folder the engine may write: empty, made by the caller, removed by it
    progress: Progress | None = None

    @property
    def models(self) -> list[str]:
        return list(self.items)

    @property
    def n_items(self) -> int:
        return len(next(iter(self.items.values())))

    @property
    def n_queries(self) -> int:
        return len(next(iter(self.queries.values())))


@dataclass
class EngineLists:
    """What the engine returned. Ids are item ids (row indices; -1 pads a list the engine returned short),
    scores are the engine's own (a distance turned into "higher is better" where the engine returns distances,
    and said so in ``notes``)."""

    singles: dict[str, tuple[np.ndarray, np.ndarray]]  # model -> (ids (q, per_model_k) int64, scores float32)
    fused_ids: np.ndarray  # (q, final_k) int64, best first, -1 padding
    fused_scores: np.ndarray  # (q, final_k) float32, the engine's fused scores
    ingest_seconds: float  # loading the items (inserts, flush)
    build_seconds: float  # building the index (0 for a flat search with no index)
    search_seconds: float  # every query's fused answer (the hybrid search, with the per-model searches it runs), batched
    latency_ms: np.ndarray  # one fused (hybrid) request at a time, for the first latency_queries queries
    disk_bytes: int  # the engine's files under workdir after ingestion and index build
    version: str  # "pymilvus 3.0.2, milvus-lite 3.2.2"
    notes: list[str] = field(default_factory=list)  # what the engine does its own way (ties, score forms, limits)
    fused_models: np.ndarray | None = None  # fuse_on=document: (q, final_k) the model whose hit each entry is, -1 pad


def require(backend: str):
    """Import the module ``backend`` needs, or a FusebenchError naming the extra to install (exit 2)."""
    extra, module = EXTRAS[backend]
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its INFO lines list the CPU builds it tried
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise FusebenchError(f"search={backend} needs {module}, which is not installed ({err}): pip install "
                             f"'fusebench[{extra}]'.") from None


def engine_module(backend: str):
    """The fusebench module that drives ``backend`` (``fusebench.engines.<backend>``)."""
    require(backend)
    return importlib.import_module(f"fusebench.engines.{backend}")


def folder_bytes(folder: Path) -> int:
    """Bytes of every regular file under ``folder`` (the engine's on-disk size)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink())


def pad(rows: list[list[tuple[int, float]]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-query (id, score) hits, best first, as (ids int64, scores float32) arrays ``length`` wide, -1/-inf
    padded: the form every engine module returns."""
    ids = np.full((len(rows), length), -1, dtype=np.int64)
    scores = np.full((len(rows), length), -np.inf, dtype=np.float32)
    for q, hits in enumerate(rows):
        hits = hits[:length]
        if hits:
            ids[q, :len(hits)] = [h[0] for h in hits]
            scores[q, :len(hits)] = [h[1] for h in hits]
    return ids, scores
