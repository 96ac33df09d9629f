"""One run, as data flowing through it: config -> corpus -> embeddings -> lists -> fusion -> metrics -> files.

:func:`run` is the whole flow over one typed :class:`~fusebench.config.run.RunConfig` (the CLI converts the
composed config with :func:`~fusebench.app.run_config.run_config` first), a sequence of named stages on one
screen; each stage below it owns its policy (what it checks, loads, computes) and hands the next what it made in
the :class:`Job`. Every stage is a call into a pure module except the two edges (loading inputs, writing outputs);
with no ``out_dir`` (the Python API without one) the last writes nothing.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from omegaconf import DictConfig

from fusebench import DIRECTIONS, FUSED, FusebenchError, __version__
from fusebench.app import interrupts, views
from fusebench.app.gallery_stage import attach_gallery, attach_manifest, distractor_sources, manifest_raws, manifest_split
from fusebench.app.index_tuning import HELD_OUT_KEY, tuning_queries
from fusebench.app.run_config import run_config
from fusebench.app.rundir import check_writable
from fusebench.app.slice_job import search_slice
from fusebench.app.tune_stage import progress_updates, tune_on_split
from fusebench.backends import base as backends
from fusebench.backends.engine_dirs import check_engine_dir
from fusebench.backends.retrieval import ListSource, SearchSettings
from fusebench.config.run import RunConfig
from fusebench.config.schema import EvalConfig
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
from fusebench.evaluation.record import (
    DatasetSummary,
    FusionRecord,
    GalleryRecord,
    ModelRecord,
    RunInfo,
    RunRecord,
    TuneRecord,
)
from fusebench.evaluation.search_record import EXACT_FUSED
from fusebench.fusion.config import FusionConfig
from fusebench.report.outputs import write_run_outputs
from fusebench.report.table import format_table
from fusebench.runtime import state

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


@dataclass
class Job:
    """What the stages of one run hand on: the corpus and its positives, each model's embeddings, the fusion (tuning
    may choose it), and what the search found."""

    config: RunConfig
    out_dir: str | None
    device: object = None  # torch.device, resolved before any embedding work
    corpus: Corpus | None = None
    split: object = None  # a manifest's caption-less lines streamed as a gallery (gallery_stage.ManifestSplit)
    raws: list[RawEmbeddings] | None = None  # rows given or read with the manifest split, else loaded by kind
    manifest_rows: object = None
    extra: list = field(default_factory=list)  # eval.positives, mapped onto the corpus as it is now
    keep_k: int | None = None  # how long each retriever's returned lists are
    backend: object = None
    embeddings: list = field(default_factory=list)
    index_tuning: object = None
    gallery: GalleryRecord | None = None
    fusion: FusionConfig | None = None
    tuned: TuneRecord | None = None
    search: SearchSettings | None = None


@dataclass
class Found:
    """The search's answer: every retriever's lists, where the lists came from, the extra run-dir files."""

    lists: dict
    answered: object  # backends.base.BackendResult
    source: ListSource
    extra_files: dict[str, str]
    seconds: float
    similarity_blocks: int


def run(config: RunConfig | DictConfig, out_dir: str | None, inputs: Inputs | None = None) -> RunRecord:
    """Evaluate every selected model and their fusion on the dataset; write outputs into ``out_dir`` (None: write
    nothing, keep the lists in memory: :func:`measure`); return the run record (what metrics.json holds).
    ``config``: the job's typed config (a composed DictConfig is converted first, as the CLI does); ``inputs``: the
    corpus and rows the caller holds, in place of loading."""
    return measure(config, out_dir, inputs)[0]


def measure(config: RunConfig | DictConfig, out_dir: str | None, inputs: Inputs | None = None) -> tuple[RunRecord, dict]:
    """:func:`run`, returning the record and every retriever's lists ({name: {direction: RankedLists}})."""
    started = time.perf_counter()
    config = config if isinstance(config, RunConfig) else run_config(config)
    job = Job(config, out_dir, fusion=config.fusion)
    check_places(job)  # the run dir, the stores' dir and the device, before any work
    load_inputs(job, inputs)  # the corpus (a manifest's test split), its positives, the lists' length
    check_backend(job)  # the backend's package and sizes, before any embedding work
    embed(job, inputs)  # each model's rows; index-tuning queries held out; the gallery's distractors attached
    job.search = search_settings(job)
    if config.gallery.slice is not None:  # a slice job: its slice of each model's search, stored; nothing evaluated
        search_slice(config, job.embeddings, job.corpus.caption_image, job.search, job.keep_k, job.out_dir)
        return None, {}
    tune(job)  # tune=...: the fusion's weights chosen on the tuning split
    found = find_lists(job)  # every retriever's ranked lists, by the backend
    record = evaluate(job, found, started)  # recall, paired comparisons, the oracle; extra positives
    write(job, found, record)  # ranks/, topk/, metrics.json, the table, plots, the logger
    return record, found.lists


def check_places(job: Job) -> None:
    """Refuse an unwritable run dir or store dir and an unusable device before any work."""
    config, settings = job.config, job.config.eval
    if job.out_dir is not None:
        check_writable(job.out_dir)
    job.device = resolve_device(settings.device, "eval.device")  # checked before any embedding work
    if settings.lists.store or any(isinstance(spec, RealModel) for spec in config.models.values()):
        check_writable(config.embed.cache.dir, "embed.cache.dir")  # before any work: the stores write there


def load_inputs(job: Job, inputs: Inputs | None) -> None:
    """The corpus (the caller's, or ``config.dataset``'s; a manifest's caption-less lines split off as a streamed
    gallery), the extra positives on it (refused before any embedding work) and the returned lists' length."""
    config = job.config
    corpus = load_corpus(config.dataset) if inputs is None else inputs.corpus
    log.info("corpus %s: %d images, %d captions", corpus.name, corpus.n_images, corpus.n_captions)
    job.split = manifest_split(config, corpus) if inputs is None else None  # caption-less lines: a streamed gallery
    job.raws, job.manifest_rows = manifest_raws(job.split, config) if job.split is not None else (None, None)
    job.corpus = corpus if job.split is None else job.split.test
    job.extra = [load_positives(name, job.corpus) for name in config.eval.positives]
    job.keep_k = _list_length(config.eval, job.fusion, job.extra, job.corpus, len(config.models))


def _remap_positives(job: Job) -> None:
    """The extra positives mapped again onto the corpus, after a stage left images out of it."""
    if job.extra:
        job.extra = [load_positives(name, job.corpus) for name in job.config.eval.positives]


def check_backend(job: Job) -> None:
    """The search backend; an approximate one's package, its engine dir and its index sizes are checked now."""
    config, corpus, split, settings = job.config, job.corpus, job.split, job.config.eval
    job.backend = backend = backends.get(config.search.backend)
    if not config.search.approximate:
        return
    backends.require(backend.name)
    if backend.engine:  # a user's file in RUN_DIR/engine_db is never removed: refused now
        if job.out_dir is None:
            raise FusebenchError(f"search={backend.name} keeps the engine's database in the run dir "
                                 "(RUN_DIR/engine_db): give the run a folder.")
        check_engine_dir(job.out_dir)
        if backend.preflight is not None:  # an engine's server: it answers, no one else's collection in the way
            backend.preflight(config.search, job.out_dir)
    gallery_size = config.gallery.size if config.gallery.active else 0  # at most (before near-duplicates)
    images = (split.n_images if split is not None else corpus.n_images) + gallery_size
    if config.search.max_memory_gb is not None and split is None and not config.gallery.active:
        raise FusebenchError(f"search={backend.name} reads search.max_memory_gb only over a gallery, and this "
                             "manifest's images are all searched in memory (no caption-less lines streamed as a "
                             "gallery): leave it unset (null).")
    if backend.engine:
        backends.check_capacity(backend, len(config.models), config.fusion.fuse_on == "document", gallery_size,
                                images - gallery_size, corpus.n_captions, config.search)
    check_sizes(config.search, {"t2i": images, "i2t": corpus.n_captions},
                max(settings.lists.depth, job.fusion.top_k or 0, job.keep_k or 0))


def embed(job: Job, inputs: Inputs | None) -> None:
    """Each model's embeddings of the corpus (less the images no model could read), the index-tuning queries held
    out of it, and the gallery: distractors attached (their sources read first, so that a bad one is refused before
    the test split is embedded) or a manifest's streamed images."""
    config, settings = job.config, job.config.eval
    sources = distractor_sources(config, job.corpus) if config.gallery.active else None
    job.embeddings, job.corpus = _embeddings(config, job.corpus, job.raws if inputs is None else inputs.raws)
    if job.corpus.meta.get("dropped_images"):  # unreadable images left out: map the positives again
        _remap_positives(job)
        job.keep_k = _list_length(settings, job.fusion, job.extra, job.corpus, len(config.models))
    job.index_tuning, job.corpus, job.embeddings = tuning_queries(config, job.corpus, job.embeddings, _embeddings,
                                                                  inputs is not None)
    if HELD_OUT_KEY in job.corpus.meta:  # the test split lost the images the index is tuned on
        _remap_positives(job)
    if job.split is None:
        job.embeddings, job.corpus, job.gallery = attach_gallery(config, job.corpus, job.embeddings, sources,
                                                                 job.device, settings.item_chunk_size, _store_dir(job))
    else:
        job.embeddings, job.corpus, job.gallery = attach_manifest(job.split, job.corpus, job.embeddings,
                                                                  job.manifest_rows)


def _store_dir(job: Job) -> str | None:
    """Where the list store (and the gallery's stores) keep their files: ``embed.cache.dir``, or None."""
    return job.config.embed.cache.dir if job.config.eval.lists.store else None


def search_settings(job: Job) -> SearchSettings:
    """How the search runs: device, tiles, stored depth, the list store, the index-tuning queries."""
    settings = job.config.eval
    return SearchSettings(device=job.device, chunk_size=settings.chunk_size, item_chunk_size=settings.item_chunk_size,
                          depth=settings.lists.depth, max_scores_mb=settings.lists.max_scores_mb,
                          store_dir=_store_dir(job),
                          precision=_precision(job),
                          progress=progress_updates, tuning=job.index_tuning, slices=job.config.gallery.slices,
                          whole_rows=(fuses_whole_rankings(job.fusion or job.config.fusion)
                                      or state.current().whole_rankings_ahead))


def fuses_whole_rankings(fusion) -> bool:
    """Whether a job fuses whole rankings (``fusion.top_k: null``), reading whole score matrices."""
    return fusion.top_k is None and fusion.method != "none"


def _precision(job: Job) -> str | None:
    """The distractor tiles' precision: None = auto (bf16 on cuda, fp32 elsewhere); fp32 for a sliced gallery
    (run_config.check_slices: a slice must score every entry as one process would, to the bit)."""
    chosen = job.config.eval.search_precision
    if job.config.gallery.slices is not None:
        return "fp32"
    return None if chosen == "auto" else chosen


def tune(job: Job) -> None:
    """With ``tune``: choose the weights on the tuning split, then evaluate that one setting (the test corpus of a
    seeded split loses the held-out images)."""
    tuning = job.config.tune
    if tuning is None:
        return
    job.tuned, job.corpus, job.embeddings, job.fusion = tune_on_split(tuning, job.config, job.corpus, job.embeddings,
                                                                      job.fusion, job.search, _embeddings)
    if tuning.split == "seeded":
        _remap_positives(job)


def find_lists(job: Job) -> Found:
    """Every retriever's ranked lists and ranks, by the backend; the run dir's extra files (an engine's differences
    from the preset, a gallery's item ids)."""
    started = time.perf_counter()
    source, blocks_before = ListSource(), state.current().similarity_blocks
    answered = job.backend.run(job.embeddings, job.corpus.caption_image, job.fusion, job.keep_k, job.config.search,
                               job.search, source, job.out_dir)
    extra_files = {}  # more files of the run dir, by path, written with the outputs
    if answered.differences:
        extra_files["topk/engine_differences.jsonl"] = "".join(json.dumps(r) + "\n" for r in answered.differences)
        for block in answered.record.parity.values():
            block.file = "topk/engine_differences.jsonl"
    seconds = time.perf_counter() - started
    if job.gallery is not None:  # a t2i list's item index past the test split is a distractor: its own id, line by line
        extra_files["topk/gallery_items.jsonl"] = "".join(json.dumps(image_id) + "\n" for image_id in job.corpus.image_ids)
    return Found(answered.lists, answered, source, extra_files, seconds,
                 state.current().similarity_blocks - blocks_before)


def _queries(corpus: Corpus) -> dict[str, np.ndarray]:
    """Each direction's query clusters: a caption's image (t2i), the query images (i2t)."""
    return {"t2i": corpus.caption_image, "i2t": corpus.i2t_query_images}


def evaluate(job: Job, found: Found, started: float) -> RunRecord:
    """The run record: each retriever's recall from its ranks, fusion's paired comparisons with each model (and an
    engine's fusion with fusebench's exact one), the oracle, the run's facts; the extra positives' metrics."""
    config, corpus, settings, lists, gallery = job.config, job.corpus, job.config.eval, found.lists, job.gallery
    ranks = {name: {d: lists[name][d].ranks for d in DIRECTIONS} for name in lists}
    singles = [e.name for e in job.embeddings]
    by_name = {e.name: e for e in job.embeddings}
    clusters = _queries(corpus)
    retrievers = {}
    for name in lists:
        if name in (FUSED, EXACT_FUSED):
            spec, info = FusionRecord(singles, job.fusion), None
        else:
            model = by_name[name]
            spec = ModelRecord({**model.spec, "weight": model.weight, "dim": model.index_dim})  # what ran
            info = model.info
        retrievers[name] = retriever_result(name, ranks[name], settings.ks, spec, info)
    boot, fused = settings.bootstrap, [FUSED] if FUSED in lists else []
    comparisons = paired_comparisons(ranks, fused, singles, clusters, settings.ks, boot.draws, boot.level, boot.seed)
    if EXACT_FUSED in lists:
        comparisons += paired_comparisons(ranks, [EXACT_FUSED], [FUSED], clusters, settings.ks, boot.draws, boot.level,
                                          boot.seed)
    record = RunRecord(
        dataset=DatasetSummary.from_json({**corpus.summary(), "digest": corpus.content_digest(
            corpus.n_images - (gallery.distractors if gallery is not None else 0))}),
        retrievers=retrievers,
        comparisons=comparisons,
        oracle=oracle_metrics({n: ranks[n] for n in singles}, settings.ks) if len(singles) > 1 else None,
        fusion=job.fusion,
        eval=settings,
        run=RunInfo(device=str(job.device), seconds=round(time.perf_counter() - started, 3),
                    search_seconds=round(found.seconds, 3), lists=found.source.records,
                    similarity_blocks=found.similarity_blocks,
                    query_ms=round(1000 * found.seconds / (corpus.n_captions + len(clusters["i2t"])), 4),
                    versions={"fusebench": __version__, "torch": str(torch.__version__), "numpy": np.__version__}),
        reference=config.reference,
        tune=job.tuned,
        gallery=gallery,
        search=found.answered.record,
    )
    if gallery is not None:  # each model's t2i search time over the whole gallery, when computed in this run
        for name, seconds in found.source.direction_seconds.items():
            gallery.models[name].search_ms_per_query = round(1000 * seconds["t2i"] / corpus.n_captions, 4)
    if job.extra:
        blocks, record.positive_comparisons = evaluate_positives(
            job.extra, lists, clusters["i2t"], corpus.caption_image, settings.ks, fused, singles, boot.draws,
            boot.level, boot.seed)
        for name, block in blocks.items():
            record.retrievers[name].positives = block
        record.positives = {p.name: p.summary() for p in job.extra}
    return record


def write(job: Job, found: Found, record: RunRecord) -> None:
    """The run dir's files, all or nothing (none without ``out_dir``), the table, the plots and the logger."""
    config, out_dir = job.config, job.out_dir
    if out_dir is not None:
        try:
            interrupts.check()  # a Ctrl-C Python dropped during the run: stop before writing anything
            write_run_outputs(out_dir, found.lists, record, config.eval.save_topk, queries=_queries(job.corpus),
                              extra=found.extra_files)
        except OSError as err:
            raise FusebenchError(f"could not write the outputs to {out_dir}: {err.strerror or err} "
                                 f"({err.filename or 'run dir'}); nothing was left half-written. Free space or choose "
                                 "another dir (hydra.run.dir=...) and rerun.") from None
    print(format_table(record), flush=True)
    if out_dir is None:
        return
    log.info("outputs written to %s", out_dir)
    views.dispatch(config.views, out_dir, record, config.plots, config.logger, config.resolved)  # plots, W&B
