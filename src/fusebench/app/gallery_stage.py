"""The gallery stage of a run: each model's distractor rows attached, near-duplicates of test images dropped, the
corpus extended with the distractors' ids, and what the gallery is and costs for the record.

Between embedding (the test split's rows, every model) and search. With ``gallery=none`` nothing changes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, replace

import numpy as np

from fusebench import FusebenchError
from fusebench.config.gallery import FILE_KINDS, NEAR_DUPLICATE, GalleryConfig
from fusebench.config.run import RunConfig
from fusebench.config.specs import RealModel
from fusebench.data.corpus import Corpus
from fusebench.data.distractor_items import with_distractors
from fusebench.encoders.base import ModelEmbeddings
from fusebench.encoders.distractors import DistractorRows, KeptRows
from fusebench.evaluation.subrecords import GalleryModelCost, GalleryRecord
from fusebench.runtime.progress import bar as progress_bar

log = logging.getLogger(__name__)


def _sim_rows(config: RunConfig, name: str, corpus: Corpus) -> DistractorRows:
    from fusebench.encoders import sim_stand_in
    from fusebench.encoders.simulated import sim_distractor_rows

    spec = config.models[name]
    params = sim_stand_in(spec) if isinstance(spec, RealModel) else spec.params
    return sim_distractor_rows(params, corpus, config.gallery)


def distractor_sources(config: RunConfig, corpus: Corpus) -> tuple[dict[str, DistractorRows], list[str], dict, dict]:
    """Per model, its rows of the first ``gallery.size`` distractors; their ids; the source's description; and
    per model what storing them costs (dtype name, bytes per value, embedding throughput when embedded here)."""
    gallery = config.gallery
    names = list(config.models)
    if gallery.kind == "sim":
        rows = {name: _sim_rows(config, name, corpus) for name in names}
        ids = [f"simd{i:07d}" for i in range(gallery.size)]
        source = {"kind": "sim", "seed": gallery.seed, **asdict(gallery.sim)}
        return rows, ids, source, {name: {"stored_dtype": "none (generated)", "value_bytes": 0} for name in names}
    if gallery.kind == "vectors":
        from fusebench.encoders.vector_dumps import dump_rows

        return dump_rows(gallery, names, corpus.image_ids)
    if gallery.kind in FILE_KINDS:
        from fusebench.data.distractor_sources import distractor_items
        from fusebench.encoders.real import real_run
        from fusebench.encoders.shards import ShardPlan, embedding_cost, shard_rows, without_failed

        not_real = [n for n, spec in config.models.items() if not isinstance(spec, RealModel)]
        if not_real:
            raise FusebenchError(f"gallery={gallery.kind} holds image files, which only a real model (kind open_clip "
                                 f"or hf) can embed; models {', '.join(not_real)} cannot: use gallery=vectors with "
                                 "their embedding dumps.")
        items = distractor_items(gallery, corpus.image_ids)
        plan = ShardPlan(items, gallery.shard_size)
        rows = {name: shard_rows(real_run(config.models[name], config.embed), plan) for name in names}
        costs = {name: embedding_cost(r, config.embed.cache.dtype) for name, r in rows.items()}
        rows, items, failed = without_failed(rows, items)
        if failed:
            log.warning("gallery: %d distractor image(s) could not be decoded and are left out (first: %s)",
                        len(failed), failed[0])
        return rows, list(items.ids), {**items.source, "undecodable": len(failed)}, costs
    raise FusebenchError(f"gallery.kind={gallery.kind!r} has no distractor source")  # GalleryConfig checks kinds


def near_duplicate_drops(gallery: GalleryConfig, embeddings: list[ModelEmbeddings], rows: dict[str, DistractorRows],
                         device, item_chunk: int, store_dir: str | None) -> np.ndarray:
    """Distractors whose cosine to some test image exceeds ``gallery.near_duplicate`` under any model; a threshold
    that drops every distractor is refused, naming the least threshold that keeps one."""
    n = next(iter(rows.values())).n
    if gallery.near_duplicate is None or n == 0:
        return np.zeros(n, dtype=bool)
    from fusebench.encoders.duplicate_scan import near_duplicate_drops as drops
    from fusebench.encoders.duplicate_scan import stored_max_cosine

    maxima = []
    for m in embeddings:
        with progress_bar(total=n, desc=f"near-duplicates {m.name}", unit="img", leave=False) as bar:
            maxima.append(stored_max_cosine(m.image, rows[m.name], m.name, item_chunk, device, store_dir, bar.update))
    dropped = drops(maxima, gallery.near_duplicate)
    if dropped.all():
        least = math.ceil(float(np.maximum.reduce([np.asarray(m, dtype=np.float32) for m in maxima]).min()) * 1e4) / 1e4
        raise FusebenchError(f"gallery.near_duplicate={gallery.near_duplicate} drops all {n:,} distractors (every one "
                             f"has a cosine above it to some test image under some model; the least such cosine rounds up to "
                             f"{least:.4f}), which would leave the test split alone: valid gallery.near_duplicate is "
                             f"{least:.4f}..1 (the default {NEAR_DUPLICATE} is clip-retrieval's), or null to keep "
                             "every distractor.")
    if dropped.sum() * 2 >= n:
        log.warning("gallery: %d of %d distractors (%.0f%%) are near-duplicates of test images (cosine > %s) and "
                    "are dropped", int(dropped.sum()), n, 100 * dropped.mean(), gallery.near_duplicate)
    return dropped


def attach_gallery(config: RunConfig, corpus: Corpus, embeddings: list[ModelEmbeddings], sources: tuple | None,
                   device, item_chunk: int, store_dir: str | None
                   ) -> tuple[list[ModelEmbeddings], Corpus, GalleryRecord | None]:
    """``embeddings`` with their distractor rows (``sources``: what :func:`distractor_sources` gave, read before the
    test split was embedded, so that a bad source is refused before that work), the corpus with the distractors' ids
    after its images, and the gallery's record; unchanged (and no record) when the run adds no distractors."""
    gallery = config.gallery
    if not gallery.active:
        return embeddings, corpus, None
    rows, ids, source, costs = sources
    for model in embeddings:
        if rows[model.name].dim != model.dim:
            raise FusebenchError(f"model {model.name!r}: its distractor rows have dimension {rows[model.name].dim} "
                                 f"but its test embeddings {model.dim}: the gallery's vectors must come from the "
                                 "same model.")
    dropped = near_duplicate_drops(gallery, embeddings, rows, device, item_chunk, store_dir)
    if dropped.any():
        keep = np.flatnonzero(~dropped)
        rows = {name: KeptRows(r, keep) for name, r in rows.items()}
        ids = [ids[i] for i in keep]
        log.info("gallery: %d of %d distractors dropped as near-duplicates of test images (cosine > %s)",
                 int(dropped.sum()), gallery.size, gallery.near_duplicate)
    n_test = corpus.n_images
    record = GalleryRecord(kind=gallery.kind, size=gallery.size, distractors=len(ids),
                           near_duplicates=int(dropped.sum()), near_duplicate=gallery.near_duplicate,
                           seed=gallery.seed, source=source)
    for model in embeddings:
        cost = costs[model.name]
        n_rows, dim = n_test + len(ids), model.index_dim
        record.models[model.name] = GalleryModelCost(
            dim=dim, bytes_fp32=4 * n_rows * dim, bytes_stored=int(cost["value_bytes"]) * len(ids) * dim,
            stored_dtype=cost["stored_dtype"], embed_device=cost.get("embed_device"),
            images_per_second=cost.get("images_per_second"))
    summary = {"gallery_kind": gallery.kind, "gallery_size": gallery.size, "gallery_distractors": len(ids),
               "gallery_seed": gallery.seed, "test_images": n_test}
    embeddings = [replace(m, distractors=rows[m.name]) for m in embeddings]
    log.info("gallery: %d test images + %d distractors (%s)", n_test, len(ids), gallery.kind)
    return embeddings, with_distractors(corpus, ids, summary), record
