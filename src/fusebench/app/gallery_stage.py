"""The gallery stage of a run: each model's distractor rows attached, near-duplicates of test images dropped, the
corpus extended with the distractors' ids, and what the gallery is and costs for the record.

Between embedding (the test split's rows, every model) and search. With ``gallery=none`` nothing changes, except
for a manifest's caption-less lines with ``vectors`` models (:func:`manifest_split`): those are the distractors of
a gallery of kind ``manifest``, searched by the same streamed path, every one kept (docs/galleries.md).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from fusebench import FusebenchError
from fusebench.config.gallery import FILE_KINDS, NEAR_DUPLICATE, GalleryConfig
from fusebench.config.run import RunConfig
from fusebench.config.specs import RealModel
from fusebench.data.corpus import Corpus
from fusebench.data.distractor_items import with_distractors
from fusebench.data.distractor_sources import distractor_items, listing_digest
from fusebench.encoders.base import ModelEmbeddings, RawEmbeddings
from fusebench.encoders.distractors import DistractorRows, KeptRows
from fusebench.encoders.models import sim_stand_in
from fusebench.encoders.simulated import sim_distractor_rows
from fusebench.encoders.vector_dumps import dump_rows
from fusebench.encoders.vectors import ManifestRows, checked_rows, vector_arrays
from fusebench.evaluation.subrecords import GalleryModelCost, GalleryRecord
from fusebench.runtime.progress import bar as progress_bar

log = logging.getLogger(__name__)


def _sim_rows(config: RunConfig, name: str, corpus: Corpus) -> DistractorRows:
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
        return dump_rows(gallery, names, corpus.image_ids)
    if gallery.kind in FILE_KINDS:
        from fusebench.encoders.real import real_run  # lazy: heavy (torch, numba, PIL)
        from fusebench.encoders.shards import (  # lazy: heavy (torch, numba, PIL)
            ShardPlan,
            embedding_cost,
            shard_rows,
            without_failed,
        )

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
    from fusebench.encoders.duplicate_scan import near_duplicate_drops as drops  # lazy: heavy (torch, numba)
    from fusebench.encoders.duplicate_scan import stored_max_cosine  # lazy: heavy (torch, numba)

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
    record = GalleryRecord(kind=gallery.kind, size=gallery.size, distractors=len(ids),
                           near_duplicates=int(dropped.sum()), near_duplicate=gallery.near_duplicate,
                           seed=gallery.seed, source=source)
    return _attached(record, corpus, embeddings, rows, ids, costs)


def _attached(record: GalleryRecord, corpus: Corpus, embeddings: list[ModelEmbeddings],
              rows: dict[str, DistractorRows], ids: list[str], costs: dict
              ) -> tuple[list[ModelEmbeddings], Corpus, GalleryRecord]:
    """Each model with its distractor ``rows``, the corpus with their ``ids`` after its images, and ``record`` with
    what each model's gallery costs."""
    n_test = corpus.n_images
    for model in embeddings:
        cost = costs[model.name]
        n_rows, dim = n_test + len(ids), model.index_dim
        record.models[model.name] = GalleryModelCost(
            dim=dim, bytes_fp32=4 * n_rows * dim, bytes_stored=int(cost["value_bytes"]) * len(ids) * dim,
            stored_dtype=cost["stored_dtype"], embed_device=cost.get("embed_device"),
            images_per_second=cost.get("images_per_second"))
    summary = {"gallery_kind": record.kind, "gallery_size": record.size, "gallery_distractors": len(ids),
               "gallery_seed": record.seed, "test_images": n_test}
    embeddings = [replace(m, distractors=rows[m.name]) for m in embeddings]
    log.info("gallery: %d test images + %d distractors (%s)", n_test, len(ids), record.kind)
    return embeddings, with_distractors(corpus, ids, summary), record


@dataclass(frozen=True)
class ManifestSplit:
    """A manifest's caption-less lines as a gallery: ``test`` the corpus of its lines with captions (in order),
    ``test_rows`` and ``distractor_rows`` those lines' image indices in the manifest (rows of each image .npy),
    ``ids`` the caption-less lines' image ids, ``n_images`` the manifest's images in all."""

    test: Corpus
    test_rows: np.ndarray
    distractor_rows: np.ndarray
    ids: list[str]
    n_images: int


def _in_memory_reason(config: RunConfig) -> str | None:
    """Why this run searches a manifest's caption-less lines in memory, among its images, as before (None: it
    streams them as a gallery)."""
    not_vectors = [name for name, spec in config.models.items() if spec.kind != "vectors"]
    reasons = [(bool(not_vectors), f"models {', '.join(not_vectors)} are not kind vectors (their images are "
                                   "embedded with the corpus)"),
               (config.gallery.active, f"gallery={config.gallery.kind} adds distractors of its own"),
               (config.tune is not None, "tune=weights splits the corpus's images"),
               (bool(config.eval.positives), "eval.positives maps extra positives over every image"),
               (config.fusion.top_k is None, "fusion.top_k=null fuses whole rankings")]
    return next((why for bad, why in reasons if bad), None)


def manifest_split(config: RunConfig, corpus: Corpus) -> ManifestSplit | None:
    """A manifest's caption-less lines as a streamed gallery of kind ``manifest`` (None: the corpus has none, or
    the run keeps them among its images, logged with the reason: :func:`_in_memory_reason`)."""
    without = corpus.captions_per_image == 0
    if corpus.kind != "manifest" or not without.any():
        return None
    why = _in_memory_reason(config)
    if why is not None:
        log.info("manifest: its %d caption-less images are searched in memory with the others: %s",
                 int(without.sum()), why)
        return None
    test, test_rows, _ = corpus.without_images(without)
    distractor_rows = np.flatnonzero(without)
    return ManifestSplit(test=replace(test, meta=corpus.meta), test_rows=test_rows, distractor_rows=distractor_rows,
                         ids=[corpus.image_ids[i] for i in distractor_rows], n_images=corpus.n_images)


def manifest_raws(split: ManifestSplit, config: RunConfig) -> tuple[list[RawEmbeddings], dict[str, DistractorRows]]:
    """Each ``vectors`` model's rows of the test split (its .npy files' headers checked against the whole manifest,
    then the test rows read: never the file whole) and its distractor rows (read by tile during the search)."""

    raws, rows = [], {}
    for name, spec in config.models.items():
        _, text, image_src, text_src = vector_arrays(name, spec.image_embeddings, spec.text_embeddings,
                                                     (split.n_images, split.test.n_captions))
        image = ManifestRows(image_src, split.test_rows).raw(0, len(split.test_rows))
        checked_rows(image, split.test_rows, image_src)  # a bad row is named by its row in the .npy
        raws.append(RawEmbeddings(name, image, text, image_src, text_src, dict(spec.given)))
        rows[name] = ManifestRows(image_src, split.distractor_rows)
    return raws, rows


def attach_manifest(split: ManifestSplit, corpus: Corpus, embeddings: list[ModelEmbeddings],
                    rows: dict[str, DistractorRows]) -> tuple[list[ModelEmbeddings], Corpus, GalleryRecord]:
    """``embeddings`` with the manifest's caption-less lines as distractors (every one kept, in manifest order),
    the corpus with their ids after the test images, and the gallery's record (kind ``manifest``)."""

    n = len(split.ids)
    source = {"kind": "manifest", "manifest": str(corpus.meta.get("source")), "available": n,
              "ids_sha256": listing_digest(split.ids, [None] * n)}
    record = GalleryRecord(kind="manifest", size=n, distractors=n, near_duplicates=0, near_duplicate=None, seed=0,
                           source=source)
    costs = {name: {"stored_dtype": str(r.dtype), "value_bytes": r.dtype.itemsize} for name, r in rows.items()}
    return _attached(record, corpus, embeddings, rows, split.ids, costs)
