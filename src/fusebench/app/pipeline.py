"""One run, as data flowing through it: config -> corpus -> embeddings -> lists -> fusion -> metrics -> files.

``run(config, out_dir)`` is the whole flow, over one typed :class:`~fusebench.config.run.RunConfig` (the CLI
converts the composed config with :func:`~fusebench.app.run_config.run_config` first); every stage is a call into a
pure module except the two edges (loading inputs, writing outputs).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
from omegaconf import DictConfig

from fusebench import DIRECTIONS, FUSED, FusebenchError, __version__
from fusebench.app import interrupts
from fusebench.app.gallery_stage import attach_gallery, attach_manifest, distractor_sources, manifest_raws, manifest_split
from fusebench.app.index_tuning import HELD_OUT_KEY, tuning_queries
from fusebench.app.run_config import run_config
from fusebench.app.rundir import check_writable
from fusebench.app.tracking import log_run
from fusebench.backends import base as backends
from fusebench.backends.retrieval import ListSource, SearchSettings, retrieve
from fusebench.config.run import RunConfig
from fusebench.config.schema import DATASET_KINDS, EvalConfig, TuneConfig
from fusebench.config.search import check_sizes
from fusebench.config.specs import RealModel
from fusebench.data import load_corpus
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import RawEmbeddings
from fusebench.encoders.devices import resolve_device
from fusebench.encoders.models import drop_unreadable, finalize, load_raw
from fusebench.evaluation.comparisons import oracle_metrics, paired_comparisons, retriever_result
from fusebench.evaluation.positives import evaluate as evaluate_positives
from fusebench.evaluation.positives import load_positives, needed_depth
from fusebench.evaluation.record import DatasetSummary, FusionRecord, ModelRecord, RunInfo, RunRecord, TuneRecord
from fusebench.evaluation.search_record import EXACT_FUSED
from fusebench.evaluation.tuning import apply, best, grid, run_grid, seeded_split, slice_embeddings
from fusebench.fusion.config import FusionConfig
from fusebench.fusion.presets import true_label
from fusebench.report.outputs import write_run_outputs
from fusebench.report.table import format_table
from fusebench.runtime import state
from fusebench.runtime.progress import bar as progress_bar

log = logging.getLogger(__name__)


def _list_length(settings: EvalConfig, fusion: FusionConfig, extra: list, corpus, n_models: int) -> int | None:
    """How long each retriever's returned lists must be: ``eval.save_topk``, or longer when extra positives read
    deeper (ECCV's mAP@R reads up to 48 captions); a fused list shorter than that is refused, naming the key."""
    need = needed_depth(extra, settings.ks)
    if not need:
        return settings.save_topk
    for direction, n_items in (("t2i", corpus.n_images), ("i2t", corpus.n_captions)):
        length = fusion.final_k(n_items, n_models) if n_models > 1 else fusion.per_model_k(n_items)
        wanted = max(p.depth(direction, settings.ks) for p in extra)
        if length < min(wanted, n_items):
            key = "fusion.final_top_k" if fusion.final_top_k is not None else "fusion.top_k"
            raise FusebenchError(f"eval.positives={settings.positives} reads {direction} lists {wanted} deep "
                                 f"(the largest number of positives, plus captions outside the gallery), but the "
                                 f"lists hold {length}: raise {key} to at least {wanted}.")
    return None if settings.save_topk is None else max(settings.save_topk, need)


@dataclass
class Inputs:
    """A corpus and each model's rows that the caller already holds (the Python API, ``fusebench.evaluate``): the
    run takes them in place of loading ``config.dataset`` and ``config.models``; everything after is the same."""

    corpus: Corpus
    raws: list[RawEmbeddings]


def _embeddings(config: RunConfig, corpus, raws: list[RawEmbeddings] | None = None):
    """Every model's embeddings of ``corpus`` (less the images no model could read) and that corpus; ``raws``:
    rows the caller holds (else each model's are loaded by its kind)."""
    if raws is None:
        raws = [load_raw(name, spec, corpus, config.embed) for name, spec in config.models.items()]
    raws, corpus = drop_unreadable(raws, corpus)
    embeddings = []
    while raws:  # one model's raw rows at a time beside the normalised ones (a 100k-image corpus is GBs)
        raw = raws.pop(0)
        embeddings.append(finalize(raw, corpus, config.models[raw.name].weight))
    return embeddings, corpus


def _tune(tuning: TuneConfig, config: RunConfig, corpus, embeddings, fusion, search):
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
        tune_models, tune_corpus = _embeddings(config, load_corpus(
            DATASET_KINDS.get(config.dataset.kind).split_params(config.dataset, tuning.split)))
    points = grid(tuning, [m.name for m in embeddings], fusion)
    log.info("tuning on %s (%d images, %d captions): %d settings by %s", tuning.split, tune_corpus.n_images,
             tune_corpus.n_captions, len(points), tuning.criterion)
    quiet = replace(search, progress=None)
    started = time.perf_counter()
    source = ListSource()  # one source for the grid: each model's lists are built once, reused by every point

    def lists_of(models, point_fusion):
        return retrieve(models, tune_corpus.caption_image, point_fusion, keep_k=1, settings=quiet, source=source)

    curve = run_grid(points, tune_models, fusion, tuning, lists_of,
                     progress=_progress_bar("tuning", len(points), unit="setting"))
    chosen = best(curve)
    embeddings, fusion = apply(chosen, embeddings, fusion)
    fusion = true_label(fusion, weights=[m.weight for m in embeddings])  # tuned settings may leave a preset
    seeded = tuning.split == "seeded"
    record = TuneRecord(split=tuning.split, criterion=tuning.criterion, n_images=tune_corpus.n_images,
                        n_captions=tune_corpus.n_captions, curve=curve, chosen=chosen, singles=curve[0].singles or {},
                        seconds=round(time.perf_counter() - started, 3), fraction=tuning.fraction if seeded else None,
                        seed=tuning.seed if seeded else None)
    return record, corpus, embeddings, fusion


def _progress_bar(desc: str, total: int, unit: str = "query"):
    """A tqdm bar for one stage of the search; closed when it reaches its total."""
    bar = progress_bar(total=total, desc=desc, unit=unit, leave=False)

    def update(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()

    return update


def run(config: RunConfig | DictConfig, out_dir: str, inputs: Inputs | None = None) -> RunRecord:
    """Evaluate every selected model and their fusion on the dataset; write outputs into ``out_dir``; return
    the run record (what metrics.json holds). ``config``: the job's typed config (a composed DictConfig is
    converted first, as the CLI does); ``inputs``: the corpus and rows the caller holds, in place of loading."""
    started = time.perf_counter()
    config = config if isinstance(config, RunConfig) else run_config(config)
    check_writable(out_dir)
    settings, fusion, draw_plots = config.eval, config.fusion, config.plots
    device = resolve_device(settings.device, "eval.device")  # checked before any embedding work
    if settings.lists.store or any(isinstance(spec, RealModel) for spec in config.models.values()):
        check_writable(config.embed.cache.dir, "embed.cache.dir")  # before any work: the stores write there
    corpus = load_corpus(config.dataset) if inputs is None else inputs.corpus
    log.info("corpus %s: %d images, %d captions", corpus.name, corpus.n_images, corpus.n_captions)
    split = manifest_split(config, corpus) if inputs is None else None  # caption-less lines: a streamed gallery
    raws, manifest_rows = manifest_raws(split, config) if split is not None else (None, None)
    corpus = corpus if split is None else split.test
    extra = [load_positives(name, corpus) for name in settings.positives]  # refused before any embedding work
    keep_k = _list_length(settings, fusion, extra, corpus, len(config.models))
    backend = backends.get(config.search.backend)
    if config.search.approximate:  # the backend's package and its index sizes, before any embedding work
        backends.require(backend.name)
        if backend.engine:  # a user's file in RUN_DIR/engine_db is never removed: refused now
            from fusebench.backends.engine_dirs import check_engine_dir

            check_engine_dir(out_dir)
        gallery_size = config.gallery.size if config.gallery.active else 0  # at most (before near-duplicates)
        images = (split.n_images if split is not None else corpus.n_images) + gallery_size
        if config.search.max_memory_gb is not None and split is None and not config.gallery.active:
            raise FusebenchError(f"search={backend.name} reads search.max_memory_gb only over a gallery, and this "
                                 "manifest's images are all searched in memory (no caption-less lines streamed as a "
                                 "gallery): leave it unset (null).")
        if backend.engine:
            backends.check_capacity(backend, len(config.models), config.fusion.fuse_on == "document", gallery_size,
                                    images - gallery_size, corpus.n_captions)
        check_sizes(config.search, {"t2i": images, "i2t": corpus.n_captions},
                    max(settings.lists.depth, fusion.top_k or 0, keep_k or 0))

    # the distractors' sources first: a bad one is refused before the test split is embedded
    sources = distractor_sources(config, corpus) if config.gallery.active else None
    embeddings, corpus = _embeddings(config, corpus, raws if inputs is None else inputs.raws)
    if extra and corpus.meta.get("dropped_images"):  # unreadable images left out: map the positives again
        extra = [load_positives(name, corpus) for name in settings.positives]
        keep_k = _list_length(settings, fusion, extra, corpus, len(config.models))
    index_tuning, corpus, embeddings = tuning_queries(config, corpus, embeddings, _embeddings, inputs is not None)
    if extra and HELD_OUT_KEY in corpus.meta:  # the test split lost the images the index is tuned on
        extra = [load_positives(name, corpus) for name in settings.positives]
    store_dir = config.embed.cache.dir if settings.lists.store else None
    if split is None:
        embeddings, corpus, gallery = attach_gallery(config, corpus, embeddings, sources, device,
                                                      settings.item_chunk_size, store_dir)
    else:
        embeddings, corpus, gallery = attach_manifest(split, corpus, embeddings, manifest_rows)
    search = SearchSettings(device=device, chunk_size=settings.chunk_size, item_chunk_size=settings.item_chunk_size,
                            depth=settings.lists.depth, max_scores_mb=settings.lists.max_scores_mb,
                            store_dir=store_dir,
                            precision=None if settings.search_precision == "auto" else settings.search_precision,
                            progress=_progress_bar, tuning=index_tuning)
    tuned, tuning = None, config.tune
    if tuning is not None:  # choose the weights on the tuning split, then evaluate that one setting below
        tuned, corpus, embeddings, fusion = _tune(tuning, config, corpus, embeddings, fusion, search)
        if extra and tuning.split == "seeded":  # the test corpus lost the held-out images
            extra = [load_positives(name, corpus) for name in settings.positives]
    search_started = time.perf_counter()
    source, matmuls_before = ListSource(), state.current().similarity_blocks
    answered = backend.run(embeddings, corpus.caption_image, fusion, keep_k, config.search, search, source, out_dir)
    lists, extra_files = answered.lists, {}  # more files of the run dir, by path, written with the outputs
    if answered.differences:
        extra_files["topk/engine_differences.jsonl"] = "".join(json.dumps(r) + "\n" for r in answered.differences)
        for block in answered.record.parity.values():
            block.file = "topk/engine_differences.jsonl"
    search_seconds = time.perf_counter() - search_started
    if gallery is not None:  # a t2i list's item index past the test split is a distractor: its own id, line by line
        extra_files["topk/gallery_items.jsonl"] = "".join(json.dumps(image_id) + "\n" for image_id in corpus.image_ids)
    ranks = {name: {d: lists[name][d].ranks for d in DIRECTIONS} for name in lists}
    singles = [e.name for e in embeddings]
    by_name = {e.name: e for e in embeddings}
    clusters = {"t2i": corpus.caption_image, "i2t": corpus.i2t_query_images}
    retrievers = {}
    for name in lists:
        if name in (FUSED, EXACT_FUSED):
            spec, info = FusionRecord(singles, fusion), None
        else:
            model = by_name[name]
            spec = ModelRecord({**model.spec, "weight": model.weight, "dim": model.index_dim})  # what ran
            info = model.info
        retrievers[name] = retriever_result(name, ranks[name], settings.ks, spec, info)
    boot = settings.bootstrap
    record = RunRecord(
        dataset=DatasetSummary.from_json({**corpus.summary(), "digest": corpus.content_digest(
            corpus.n_images - (gallery.distractors if gallery is not None else 0))}),
        retrievers=retrievers,
        comparisons=paired_comparisons(ranks, [FUSED] if FUSED in lists else [], singles, clusters,
                                       settings.ks, boot.draws, boot.level, boot.seed)
        + (paired_comparisons(ranks, [EXACT_FUSED], [FUSED], clusters, settings.ks, boot.draws, boot.level, boot.seed)
           if EXACT_FUSED in lists else []),
        oracle=oracle_metrics({n: ranks[n] for n in singles}, settings.ks) if len(singles) > 1 else None,
        fusion=fusion,
        eval=settings,
        run=RunInfo(device=str(device), seconds=round(time.perf_counter() - started, 3),
                    search_seconds=round(search_seconds, 3), lists=source.records,
                    similarity_blocks=state.current().similarity_blocks - matmuls_before,
                    query_ms=round(1000 * search_seconds / (corpus.n_captions + len(clusters["i2t"])), 4),
                    versions={"fusebench": __version__, "torch": torch.__version__, "numpy": np.__version__}),
        reference=config.reference,
        tune=tuned,
        gallery=gallery,
        search=answered.record,
    )
    if gallery is not None:  # each model's t2i search time over the whole gallery, when computed in this run
        for name, seconds in source.direction_seconds.items():
            gallery.models[name].search_ms_per_query = round(1000 * seconds["t2i"] / corpus.n_captions, 4)
    if extra:
        blocks, record.positive_comparisons = evaluate_positives(
            extra, lists, clusters["i2t"], corpus.caption_image, settings.ks, [FUSED] if FUSED in lists else [],
            singles, boot.draws, boot.level, boot.seed)
        for name, block in blocks.items():
            record.retrievers[name].positives = block
        record.positives = {p.name: p.summary() for p in extra}
    try:
        interrupts.check()  # a Ctrl-C Python dropped during the run: stop before writing anything
        write_run_outputs(out_dir, lists, record, settings.save_topk, queries=clusters, extra=extra_files)
    except OSError as err:
        raise FusebenchError(f"could not write the outputs to {out_dir}: {err.strerror or err} "
                             f"({err.filename or 'run dir'}); nothing was left half-written. Free space or choose "
                             "another dir (hydra.run.dir=...) and rerun.") from None
    print(format_table(record))
    plots = []
    if draw_plots:
        try:
            from fusebench.report.plots import run_plots

            plots = run_plots(out_dir, record)
        except Exception as err:  # noqa: BLE001 - plots are a view of the outputs, never a reason to fail
            log.warning("could not draw plots: %s", err)
    log_run(config.logger, record, out_dir, plots, resolved=config.resolved)
    log.info("outputs written to %s", out_dir)
    return record
