"""One run, as data flowing through it: config -> corpus -> embeddings -> lists -> fusion -> metrics -> files.

``run(cfg, out_dir)`` is the whole flow; every stage is a call into a pure module except the two edges
(loading inputs, writing outputs).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from fusebench import FUSED, FusebenchError, __version__
from fusebench.app import interrupts
from fusebench.app.progress import bar as progress_bar
from fusebench.app.retrieval import ListSource, SearchSettings, retrieve
from fusebench.app.rundir import check_writable
from fusebench.app.tracking import check_logger, log_run
from fusebench.config import checks
from fusebench.config.specs import check_spec, registry
from fusebench.data import load_corpus
from fusebench.encoders import drop_unreadable, finalize, load_raw, model_weight
from fusebench.encoders.devices import check_device_name, resolve_device
from fusebench.encoders.real import Runtime
from fusebench.evaluation.comparisons import oracle_metrics, paired_comparisons, retriever_result
from fusebench.evaluation.positives import POSITIVE_SETS, load_positives, needed_depth
from fusebench.evaluation.positives import evaluate as evaluate_positives
from fusebench.evaluation.record import RunRecord
from fusebench.evaluation.tuning import TuneSettings, apply, best, grid, run_grid, seeded_split, slice_embeddings, tune_settings
from fusebench.fusion.combine import FusionConfig
from fusebench.fusion.presets import config_folders, true_label
from fusebench.report.article import reference_row
from fusebench.report.outputs import write_run_outputs
from fusebench.report.table import format_table
from fusebench.search.exact import MATMULS

log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _plain(cfg):
    """A composed config node as plain Python (dicts, lists, values), interpolations resolved."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg) if isinstance(cfg, Mapping) else cfg


EVAL_KEYS = ("ks", "bootstrap", "device", "chunk_size", "item_chunk_size", "save_topk", "lists", "positives")


def eval_settings(cfg: Mapping) -> dict:
    """The eval group's values, checked (defaults: :class:`fusebench.config.schema.EvalSchema`)."""
    def need(mapping, key, where="eval"):
        return checks.required(mapping, key, where)

    checks.known_keys(cfg, "eval", EVAL_KEYS)
    ks = checks.integer_list(need(cfg, "ks"), "eval.ks")
    boot = checks.mapping(need(cfg, "bootstrap"), "eval.bootstrap")
    checks.known_keys(boot, "eval.bootstrap", ("draws", "level", "seed"))
    draws = checks.integer(need(boot, "draws", "eval.bootstrap"), "eval.bootstrap.draws", 1,
                           "resamples per comparison, e.g. 2000")
    level = checks.number(need(boot, "level", "eval.bootstrap"), "eval.bootstrap.level", 0, 1, open_low=True,
                          open_high=True, hint="the interval's coverage, e.g. 0.95")
    seed = checks.integer(need(boot, "seed", "eval.bootstrap"), "eval.bootstrap.seed", 0)
    save_topk = checks.optional_integer(need(cfg, "save_topk"), "eval.save_topk", 1, "null = whole lists")
    chunks = {key: checks.integer(need(cfg, key), f"eval.{key}", 1) for key in ("chunk_size", "item_chunk_size")}
    lists = checks.mapping(need(cfg, "lists"), "eval.lists")
    checks.known_keys(lists, "eval.lists", ("store", "depth", "max_scores_mb"))
    depth = checks.integer(need(lists, "depth", "eval.lists"), "eval.lists.depth", 1, "list length stored per query")
    max_mb = checks.integer(need(lists, "max_scores_mb", "eval.lists"), "eval.lists.max_scores_mb", 0,
                            "0: never store score matrices")
    store = checks.boolean(need(lists, "store", "eval.lists"), "eval.lists.store")
    device = check_device_name(need(cfg, "device"), "eval.device")
    positives = cfg.get("positives") or []
    if not isinstance(positives, list):
        raise FusebenchError(f"eval.positives={positives!r} is not valid: give a list, e.g. eval.positives=[eccv,cxc] "
                             f"(valid sets: {', '.join(POSITIVE_SETS)}).")
    for name in positives:
        checks.choice(name, "eval.positives", POSITIVE_SETS)
    return {"ks": sorted(set(ks)), "draws": draws, "level": level, "seed": seed, "save_topk": save_topk, **chunks,
            "lists": {"store": store, "depth": depth, "max_scores_mb": max_mb}, "device": device,
            "positives": list(dict.fromkeys(positives))}


def fusion_settings(cfg: Mapping, ks: list[int]) -> FusionConfig:
    known = list(FusionConfig.__dataclass_fields__)
    checks.known_keys(cfg, "fusion", known)
    fusion = FusionConfig(**{k: checks.required(cfg, k, "fusion") for k in known})
    fusion.check_ks(ks)
    return fusion


def model_specs(cfg: Mapping) -> dict[str, dict]:
    specs = {str(name): checks.mapping(spec, f"models.{name}") for name, spec in checks.mapping(cfg, "models").items()}
    if not specs:
        raise FusebenchError("no models selected: pick some with models=[a,b] or +models.NAME.kind=... overrides.")
    names = registry(config_folders())
    for name, spec in specs.items():
        if name == FUSED or not _NAME.match(name):
            raise FusebenchError(f"model name {name!r} is not allowed: use letters, digits, '_', '.', '-' "
                                 f"(and not {FUSED!r}, the fused retriever's name).")
        check_spec(name, spec, names)
        model_weight(name, spec)
    return specs


def check_fusion_models(fusion: FusionConfig, specs: dict[str, dict], tuning: TuneSettings | None) -> None:
    """Refuse fusions that cannot mean anything with these models; say when a fusion is skipped."""
    if tuning is not None and (len(specs) < 2 or fusion.method == "none"):
        raise FusebenchError("tune tunes a fusion's weights: select at least two models and a fusion method "
                             "(e.g. fusion=dbsf), or set tune=none.")
    if len(specs) < 2:
        if fusion.method != "none":
            log.warning("fusion.method=%s is skipped: one model is selected (%s), and fusion needs two or more",
                        fusion.method, next(iter(specs)))
        return
    weights = {name: model_weight(name, spec) for name, spec in specs.items()}
    if fusion.method != "none" and tuning is None and not any(weights.values()):
        raise FusebenchError(f"every model weight is 0 ({', '.join(f'models.{n}.weight' for n in weights)}): "
                             "every fused score would be 0. Give at least one model a weight > 0.")


TOP_KEYS = ("paths", "dataset", "models", "fusion", "eval", "embed", "logger", "tune", "plots", "reference")


def check_top_keys(cfg: Mapping) -> None:
    """A key added at the top (``+bogus=1``) is read by nothing: an error naming it."""
    unknown = sorted(str(k) for k in cfg if k not in TOP_KEYS and k != "hydra")
    if unknown:
        raise FusebenchError(f"unknown top-level key(s) {', '.join(unknown)} (nothing reads them); valid: "
                             f"{', '.join(TOP_KEYS)} (each a config group: fusebench --help lists them).")


def _list_length(settings: dict, fusion: FusionConfig, extra: list, corpus, n_models: int) -> int | None:
    """How long each retriever's returned lists must be: ``eval.save_topk``, or longer when extra positives read
    deeper (ECCV's mAP@R reads up to 48 captions); a fused list shorter than that is refused, naming the key."""
    need = needed_depth(extra, settings["ks"])
    if not need:
        return settings["save_topk"]
    for direction, n_items in (("t2i", corpus.n_images), ("i2t", corpus.n_captions)):
        length = fusion.final_k(n_items, n_models) if n_models > 1 else fusion.per_model_k(n_items)
        wanted = max(p.depth(direction, settings["ks"]) for p in extra)
        if length < min(wanted, n_items):
            key = "fusion.final_top_k" if fusion.final_top_k is not None else "fusion.top_k"
            raise FusebenchError(f"eval.positives={settings['positives']} reads {direction} lists {wanted} deep "
                                 f"(the largest number of positives, plus captions outside the gallery), but the "
                                 f"lists hold {length}: raise {key} to at least {wanted}.")
    return None if settings["save_topk"] is None else max(settings["save_topk"], need)


def _tune(tuning: TuneSettings, dataset_cfg: Mapping, corpus, embeddings, specs, runtime, fusion, search):
    """Evaluate the tuning grid on the tuning split; return the tuning record, the test corpus and models
    (without the held-out images for a seeded split) with the chosen weights, and the chosen fusion."""
    if tuning.split == "seeded":
        held = seeded_split(corpus, tuning.fraction, tuning.seed)
        tune_corpus, tune_images, tune_captions = corpus.without_images(~held)
        test_corpus, test_images, test_captions = corpus.without_images(held)
        test_corpus = replace(test_corpus, meta={**corpus.meta, "tuning_held_out_images": int(held.sum())})
        tune_models = slice_embeddings(embeddings, tune_images, tune_captions)
        corpus, embeddings = test_corpus, slice_embeddings(embeddings, test_images, test_captions)
    else:
        tune_corpus = load_corpus({**dataset_cfg, "split": tuning.split, "expected": {}, "allow_nonstandard": True})
        raws, tune_corpus = drop_unreadable([load_raw(n, spec, tune_corpus, runtime) for n, spec in specs.items()],
                                            tune_corpus)
        tune_models = [finalize(raw, tune_corpus) for raw in raws]
    points = grid(tuning, [m.name for m in embeddings], fusion)
    log.info("tuning on %s (%d images, %d captions): %d settings by %s", tuning.split, tune_corpus.n_images,
             tune_corpus.n_captions, len(points), tuning.criterion)
    quiet = replace(search, progress=None)
    started = time.perf_counter()
    curve = run_grid(points, tune_models, tune_corpus.caption_image, fusion, tuning, quiet,
                     progress=_progress_bar("tuning", len(points), unit="setting"))
    chosen = best(curve)
    embeddings, fusion = apply(chosen, embeddings, fusion)
    fusion = true_label(fusion, weights=[m.weight for m in embeddings])  # tuned settings may leave a preset
    record = {"split": tuning.split, "criterion": tuning.criterion, "n_images": tune_corpus.n_images,
              "n_captions": tune_corpus.n_captions, "curve": curve, "chosen": chosen,
              "singles": curve[0]["singles"] if curve else {}, "seconds": round(time.perf_counter() - started, 3),
              **({"fraction": tuning.fraction, "seed": tuning.seed} if tuning.split == "seeded" else {})}
    return record, corpus, embeddings, fusion


def _progress_bar(desc: str, total: int, unit: str = "query"):
    """A tqdm bar for one stage of the search; closed when it reaches its total."""
    bar = progress_bar(total=total, desc=desc, unit=unit, leave=False)

    def update(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()

    return update


def _preload_plotting() -> threading.Thread | None:
    """Import matplotlib (about 0.4 s) on a second thread while the search runs, once per process: the
    similarity matmuls release the GIL, so the import overlaps them instead of following them. ``run``
    joins the thread before drawing."""
    if "matplotlib.backends.backend_agg" in sys.modules:
        return None

    def load() -> None:
        try:
            from fusebench.report.plots import load_matplotlib

            load_matplotlib()
        except Exception:  # noqa: BLE001 - the plots step imports it again and reports what is wrong
            pass

    thread = threading.Thread(target=load, name="fusebench-preload-matplotlib", daemon=True)
    thread.start()
    return thread


def run(cfg: DictConfig | Mapping, out_dir: str, next_job_follows: bool = False) -> RunRecord:
    """Evaluate every selected model and their fusion on the dataset; write outputs into ``out_dir``; return
    the run record (what metrics.json holds). ``next_job_follows``: more of a sweep (its next job, or its report)
    runs next in this process, so plots no logger needs are drawn on a second thread meanwhile
    (``report.background``)."""
    started = time.perf_counter()
    check_writable(out_dir)
    check_top_keys(cfg)
    group = {key: _plain(checks.required(cfg, key, "config"))
             for key in ("eval", "fusion", "models", "plots", "logger", "embed", "dataset", "reference", "tune")}
    settings = eval_settings(checks.mapping(group["eval"], "eval"))
    fusion = fusion_settings(checks.mapping(group["fusion"], "fusion"), settings["ks"])
    specs = model_specs(group["models"])
    draw_plots = checks.boolean(group["plots"], "plots")
    logger = checks.mapping(group["logger"], "logger")
    check_logger(logger)
    reference = reference_row(group["reference"])
    device = resolve_device(settings["device"], "eval.device")  # checked before any embedding work
    runtime = Runtime.from_config(group["embed"])
    if settings["lists"]["store"] or any(spec.get("kind") in ("open_clip", "hf") for spec in specs.values()):
        check_writable(runtime.cache_dir, "embed.cache.dir")  # before any work: the stores write there
    dataset_cfg = checks.mapping(group["dataset"], "dataset")
    tuning = tune_settings(group["tune"], dataset_cfg.get("kind"), dataset_cfg.get("split"))
    check_fusion_models(fusion, specs, tuning)
    fusion = true_label(fusion, weights=[model_weight(name, spec) for name, spec in specs.items()])
    if tuning is not None:
        fusion.check_ks([tuning.k], "tune.criterion")
    corpus = load_corpus(dataset_cfg)
    log.info("corpus %s: %d images, %d captions", corpus.name, corpus.n_images, corpus.n_captions)
    extra = [load_positives(name, corpus) for name in settings["positives"]]  # refused before any embedding work
    keep_k = _list_length(settings, fusion, extra, corpus, len(specs))

    raws = [load_raw(name, spec, corpus, runtime) for name, spec in specs.items()]
    raws, corpus = drop_unreadable(raws, corpus)
    if extra and corpus.meta.get("dropped_images"):  # unreadable images left out: map the positives again
        extra = [load_positives(name, corpus) for name in settings["positives"]]
        keep_k = _list_length(settings, fusion, extra, corpus, len(specs))
    embeddings = []
    while raws:  # one model's raw rows at a time beside the normalised ones (a 100k-image corpus is GBs)
        embeddings.append(finalize(raws.pop(0), corpus))
    search = SearchSettings(device=device, chunk_size=settings["chunk_size"],
                            item_chunk_size=settings["item_chunk_size"], depth=settings["lists"]["depth"],
                            max_scores_mb=settings["lists"]["max_scores_mb"],
                            store_dir=runtime.cache_dir if settings["lists"]["store"] else None,
                            progress=_progress_bar)
    tuned = None
    if tuning is not None:  # choose the weights on the tuning split, then evaluate that one setting below
        tuned, corpus, embeddings, fusion = _tune(tuning, dataset_cfg, corpus, embeddings, specs, runtime, fusion, search)
        if extra and tuning.split == "seeded":  # the test corpus lost the held-out images
            extra = [load_positives(name, corpus) for name in settings["positives"]]
    preload = _preload_plotting() if draw_plots else None
    search_started = time.perf_counter()
    source, matmuls_before = ListSource(), MATMULS["blocks"]
    lists = retrieve(embeddings, corpus.caption_image, fusion, keep_k=keep_k, settings=search, source=source)
    search_seconds = time.perf_counter() - search_started
    ranks = {name: {d: lists[name][d].ranks for d in ("t2i", "i2t")} for name in lists}
    singles = [e.name for e in embeddings]
    by_name = {e.name: e for e in embeddings}
    clusters = {"t2i": corpus.caption_image, "i2t": corpus.i2t_query_images}
    retrievers = {}
    for name in lists:
        if name == FUSED:
            spec, info = {"kind": "fusion", "members": singles, **fusion.__dict__}, None
        else:
            model = by_name[name]
            spec = {**model.spec, "weight": model.weight, "dim": model.index_dim}  # what ran
            info = model.info
        retrievers[name] = retriever_result(name, ranks[name], settings["ks"], spec, info)
    record = RunRecord(
        dataset=corpus.summary(),
        retrievers=retrievers,
        comparisons=paired_comparisons(ranks, [FUSED] if FUSED in lists else [], singles, clusters,
                                       settings["ks"], settings["draws"], settings["level"], settings["seed"]),
        oracle=oracle_metrics({n: ranks[n] for n in singles}, settings["ks"]) if len(singles) > 1 else None,
        fusion=dict(fusion.__dict__),
        eval=settings,
        run={"device": str(device), "seconds": round(time.perf_counter() - started, 3),
             "search_seconds": round(search_seconds, 3), "lists": source.records,
             "similarity_blocks": MATMULS["blocks"] - matmuls_before,
             "query_ms": round(1000 * search_seconds / (corpus.n_captions + len(clusters["i2t"])), 4),
             "versions": {"fusebench": __version__, "torch": torch.__version__, "numpy": np.__version__}},
        reference=reference,
        tune=tuned,
    )
    if extra:
        blocks, record.positive_comparisons = evaluate_positives(
            extra, lists, clusters["i2t"], corpus.caption_image, settings["ks"], [FUSED] if FUSED in lists else [],
            singles, settings["draws"], settings["level"], settings["seed"])
        for name, block in blocks.items():
            record.retrievers[name].positives = block
        record.positives = {p.name: p.summary() for p in extra}
    try:
        interrupts.check()  # a Ctrl-C Python dropped during the run: stop before writing anything
        write_run_outputs(out_dir, lists, record, settings["save_topk"], queries=clusters)
    except OSError as err:
        raise FusebenchError(f"could not write the outputs to {out_dir}: {err.strerror or err} "
                             f"({err.filename or 'run dir'}); nothing was left half-written. Free space or choose "
                             "another dir (hydra.run.dir=...) and rerun.") from None
    print(format_table(record))
    plots = []
    if draw_plots and next_job_follows and logger["kind"] != "wandb":  # W&B logs the PNGs with the run
        from fusebench.report.background import draw_later

        draw_later(out_dir, record)
    elif draw_plots:
        if preload is not None:
            preload.join()
        try:
            from fusebench.report.plots import run_plots

            plots = run_plots(out_dir, record)
        except Exception as err:  # noqa: BLE001 - plots are a view of the outputs, never a reason to fail
            log.warning("could not draw plots: %s", err)
    log_run(logger, record, out_dir, plots, resolved=_plain(cfg) if isinstance(cfg, DictConfig) else None)
    log.info("outputs written to %s", out_dir)
    return record
