"""One run, as data flowing through it: config -> corpus -> embeddings -> lists -> fusion -> metrics -> files.

``run(cfg, out_dir)`` is the whole flow; every stage is a call into a pure module except the two edges
(loading inputs, writing outputs).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from fusebench import FusebenchError, __version__
from fusebench.comparisons import oracle_metrics, paired_comparisons, retriever_metrics
from fusebench.data import load_corpus
from fusebench.encoders import drop_unreadable, finalize, load_raw
from fusebench.encoders.real import Runtime
from fusebench.fusion import FusionConfig
from fusebench.report.outputs import write_run_outputs
from fusebench.report.table import format_table
from fusebench.tracking import log_run
from fusebench.retrieval import FUSED, ListSource, ModelInput, SearchSettings, retrieve
from fusebench.search import MATMULS, resolve_device

log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def eval_settings(cfg: Mapping) -> dict:
    ks = list(cfg.get("ks", [1, 5, 10]))
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise FusebenchError(f"eval.ks={ks!r} must be a non-empty list of positive integers, e.g. [1,5,10].")
    boot = cfg.get("bootstrap", {}) or {}
    draws, level = int(boot.get("draws", 2000)), float(boot.get("level", 0.95))
    if draws < 1 or not 0 < level < 1:
        raise FusebenchError(f"eval.bootstrap: draws must be >= 1 and level in (0, 1); got {draws} and {level}.")
    save_topk = cfg.get("save_topk", 25)
    if save_topk is not None and (isinstance(save_topk, bool) or not isinstance(save_topk, int) or save_topk < 1):
        raise FusebenchError(f"eval.save_topk={save_topk!r} must be a positive integer or null (null = whole lists).")
    chunks = {key: cfg.get(key, default) for key, default in (("chunk_size", 4096), ("item_chunk_size", 16384))}
    for key, value in chunks.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FusebenchError(f"eval.{key}={value!r} must be a positive integer.")
    lists = dict(cfg.get("lists", {}) or {})
    unknown = sorted(set(lists) - {"store", "depth", "max_scores_mb"})
    if unknown:
        raise FusebenchError(f"eval.lists: unknown key(s) {unknown}; valid keys: depth, max_scores_mb, store.")
    depth, store, max_mb = lists.get("depth", 100), lists.get("store", True), lists.get("max_scores_mb", 2048)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise FusebenchError(f"eval.lists.depth={depth!r} must be a positive integer (list length stored per query).")
    if isinstance(max_mb, bool) or not isinstance(max_mb, int) or max_mb < 0:
        raise FusebenchError(f"eval.lists.max_scores_mb={max_mb!r} must be an integer >= 0 (0: never store score matrices).")
    if not isinstance(store, bool):
        raise FusebenchError(f"eval.lists.store={store!r} must be true or false.")
    return {"ks": sorted(set(ks)), "draws": draws, "level": level, "seed": int(boot.get("seed", 0)),
            "save_topk": None if save_topk is None else int(save_topk), **chunks,
            "lists": {"store": store, "depth": depth, "max_scores_mb": max_mb}, "device": str(cfg.get("device", "auto"))}


def fusion_settings(cfg: Mapping, ks: list[int]) -> FusionConfig:
    known = set(FusionConfig.__dataclass_fields__)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise FusebenchError(f"fusion: unknown key(s) {unknown}; valid keys: {sorted(known)}.")
    fusion = FusionConfig(**{k: cfg[k] for k in cfg})
    fusion.check_ks(ks)
    return fusion


def model_specs(cfg: Mapping) -> dict[str, dict]:
    specs = {str(name): dict(spec) for name, spec in (cfg or {}).items()}
    if not specs:
        raise FusebenchError("no models selected: pick some with models=[a,b] or +models.NAME.kind=... overrides.")
    for name, spec in specs.items():
        if name == FUSED or not _NAME.match(name):
            raise FusebenchError(f"model name {name!r} is not allowed: use letters, digits, '_', '.', '-' "
                                 f"(and not {FUSED!r}, the fused retriever's name).")
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
            raise FusebenchError(f"models.{name}.weight={weight!r} must be a number >= 0.")
    return specs


def _progress_bar(desc: str, total: int):
    """A tqdm bar for one stage of the search; closed when it reaches its total."""
    bar = tqdm(total=total, desc=desc, unit="query", leave=False)

    def update(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()

    return update


def run(cfg: DictConfig | Mapping, out_dir: str) -> dict:
    """Evaluate every selected model and their fusion on the dataset; write outputs into ``out_dir``."""
    started = time.perf_counter()
    settings = eval_settings(_plain(cfg["eval"]))
    fusion = fusion_settings(_plain(cfg["fusion"]), settings["ks"])
    specs = model_specs(_plain(cfg["models"]))
    device = resolve_device(settings["device"])  # checked before any embedding work
    corpus = load_corpus(_plain(cfg["dataset"]))
    log.info("corpus %s: %d images, %d captions", corpus.name, corpus.n_images, corpus.n_captions)

    runtime = Runtime.from_config(_plain(cfg["embed"]) if "embed" in cfg else None)
    raws = [load_raw(name, spec, corpus, runtime) for name, spec in specs.items()]
    raws, corpus = drop_unreadable(raws, corpus)
    embeddings = []
    while raws:  # one model's raw rows at a time beside the normalised ones (a 100k-image corpus is GBs)
        embeddings.append(finalize(raws.pop(0), corpus))
    inputs = [ModelInput(e.name, e.image, e.text, float(specs[e.name].get("weight", 1.0))) for e in embeddings]
    search_started = time.perf_counter()
    source, matmuls_before = ListSource(), MATMULS["blocks"]
    search = SearchSettings(device=device, chunk_size=settings["chunk_size"],
                            item_chunk_size=settings["item_chunk_size"], depth=settings["lists"]["depth"],
                            max_scores_mb=settings["lists"]["max_scores_mb"],
                            store_dir=runtime.cache_dir if settings["lists"]["store"] else None,
                            progress=_progress_bar)
    lists = retrieve(inputs, corpus.caption_image, fusion, keep_k=settings["save_topk"], settings=search, source=source)
    search_seconds = time.perf_counter() - search_started
    ranks = {name: {d: lists[name][d].ranks for d in ("t2i", "i2t")} for name in lists}
    singles = [e.name for e in embeddings]
    by_name = {e.name: e for e in embeddings}
    clusters = {"t2i": corpus.caption_image, "i2t": corpus.i2t_query_images}
    retrievers = {}
    for name in lists:
        retrievers[name] = retriever_metrics(ranks[name], settings["ks"])
        if name == FUSED:
            retrievers[name]["spec"] = {"kind": "fusion", "members": singles, **fusion.__dict__}
        else:
            model = by_name[name]
            retrievers[name]["spec"] = {**specs[name], "dim": model.dim}
            if model.info:
                retrievers[name]["embedding"] = model.info
    metrics = {
        "dataset": corpus.summary(),
        "retrievers": retrievers,
        "comparisons": paired_comparisons(ranks, [FUSED] if FUSED in lists else [], singles, clusters,
                                          settings["ks"], settings["draws"], settings["level"], settings["seed"]),
        "oracle": oracle_metrics({n: ranks[n] for n in singles}, settings["ks"]) if len(singles) > 1 else None,
        "fusion": fusion.__dict__,
        "eval": settings,
        "run": {"device": str(device), "seconds": round(time.perf_counter() - started, 3),
                "search_seconds": round(search_seconds, 3), "lists": source.records,
                "similarity_blocks": MATMULS["blocks"] - matmuls_before,
                "query_ms": round(1000 * search_seconds / (corpus.n_captions + len(clusters["i2t"])), 4),
                "versions": {"fusebench": __version__, "torch": torch.__version__, "numpy": np.__version__}},
    }
    write_run_outputs(out_dir, lists, metrics, settings["save_topk"], queries=clusters)
    print(format_table(metrics))
    plots = []
    if cfg.get("plots", True):
        try:
            from fusebench.report.plots import run_plots

            plots = run_plots(out_dir, metrics)
        except Exception as err:  # noqa: BLE001 - plots are a view of the outputs, never a reason to fail
            log.warning("could not draw plots: %s", err)
    log_run(_plain(cfg["logger"]) if "logger" in cfg else None, metrics, out_dir, plots,
            resolved=_plain(cfg) if isinstance(cfg, DictConfig) else None)
    log.info("outputs written to %s", out_dir)
    return metrics
