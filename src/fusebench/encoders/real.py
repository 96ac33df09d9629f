"""Embed a corpus with a real model (a kind with an encoder backend), through the embedding cache.

The model is only loaded when the cache misses; image embeddings do not depend on the text
preprocessing, so text variants (as typed, lowercase, ...) share one set of image embeddings.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fusebench.config.schema import EmbedConfig
from fusebench.config.specs import MODEL_KINDS, RealModel
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import Encoder, RawEmbeddings, to_device
from fusebench.encoders.devices import resolve_device
from fusebench.encoders.fingerprint import images_fingerprint, texts_fingerprint
from fusebench.encoders.images import bad_image_error, image_batches, open_rgb
from fusebench.encoders.query_text import preprocess_texts
from fusebench.runtime.progress import bar as progress_bar
from fusebench.stores.embeddings import EmbeddingCache

log = logging.getLogger(__name__)


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


class LazyModel:
    """Loads the encoder the first time a cache miss needs it, never otherwise."""

    def __init__(self, encoder: Encoder, device: torch.device):
        self.encoder, self.device, self.loaded = encoder, device, False
        self.load_seconds = 0.0

    def get(self) -> Encoder:
        if not self.loaded:
            started = time.perf_counter()
            log.info("loading %s model %s on %s", self.encoder.backend, self.encoder.name, self.device)
            self.encoder.load(self.device)
            self.loaded = True
            self.load_seconds = time.perf_counter() - started
        return self.encoder


def settle_skipped(rows: np.ndarray, stats: Mapping, corpus: Corpus, on_bad_image: str,
                   compute_images) -> tuple[np.ndarray, int]:
    """Image rows from the cache (or from chunks a run left) may hold images skipped as unreadable (all-NaN rows)
    under embed.on_bad_image=skip; they stand in for this run only as a fresh computation would: each skipped
    file is read again, and under ``fail`` the first still unreadable one raises BadImageError; one that reads
    now is embedded now (``compute_images``). Returns the rows and how many stay skipped."""
    if not stats.get("skipped_images"):
        return rows, 0
    paths = corpus.image_paths or [None] * corpus.n_images
    skipped = np.flatnonzero(np.isnan(rows).all(axis=1))
    readable = []
    for row in skipped:
        try:
            open_rgb(paths[row])
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad image, as in image_batches
            if on_bad_image == "fail":
                raise bad_image_error(int(row), paths[row], err) from None
        else:
            readable.append(row)
    if readable:
        log.info("%d image(s) skipped as unreadable when cached read now; embedding them", len(readable))
        rows = rows.copy()  # the cached rows are shared and read-only
        rows[readable] = np.concatenate([block for block, _ in compute_images(np.array(readable))])
    return rows, int(np.isnan(rows).all(axis=1).sum())


@dataclass
class RealRun:
    """One real model set up to embed on this machine: its backend (loaded on first use), device, precision,
    the embedding cache, and ``common``, the key material every entry of its rows shares (weights fingerprint,
    library versions, precision)."""

    name: str
    encoder: Encoder
    device: torch.device
    precision: str
    lazy: LazyModel
    cache: EmbeddingCache
    runtime: EmbedConfig
    common: dict

    def image_material(self) -> dict:
        """What keys image rows besides which images: ``common`` and the backend's image preprocessing."""
        return {**self.common, "image": self.encoder.image_preprocessing()}


def real_run(spec: RealModel, runtime: EmbedConfig) -> RealRun:
    """``spec``'s backend set up with the embed group's device, precision and cache (nothing loaded yet)."""
    encoder = MODEL_KINDS.get(spec.kind).backend(spec.name, spec)
    device = resolve_device(runtime.device, "embed.device")
    precision = runtime.resolved_precision(device)
    cache = EmbeddingCache(runtime.cache.dir, runtime.cache.dtype, runtime.cache.chunk_rows)
    common = {"model": encoder.fingerprint(), "versions": encoder.versions(), "precision": precision}
    return RealRun(spec.name, encoder, device, precision, LazyModel(encoder, device), cache, runtime, common)


def embed_images(run: RealRun, paths: Sequence[str | None], rows: np.ndarray, desc: str,
                 digests: list | None = None):
    """The image loop: ``(block, stats)`` for the images ``paths[rows]``, in order, a DataLoader batch at a time
    (decoded in ``embed.num_workers`` processes, under ``embed.on_bad_image``), with a progress bar (images/s);
    an image skipped as unreadable is an all-NaN row of its block, counted in ``skipped_images``. The model is
    loaded on the first batch. Precision is applied here, by autocast around each batch. ``digests``: a list that
    gets each row's content digest (``images.content_digest`` of the bytes decoded; None: unreadable), in order,
    before its block is yielded."""
    model, runtime, device = run.lazy.get(), run.runtime, run.device
    pin = device.type == "cuda"
    with progress_bar(total=len(rows), desc=desc, unit="img", leave=False) as bar:
        for all_rows, good_rows, batch, *found in image_batches(
                paths, rows, model.image_transform, runtime.batch_size, runtime.num_workers, pin,
                runtime.on_bad_image, digests=digests is not None):
            if digests is not None:
                digests.extend(found[0])
            block = np.full((len(all_rows), model.dim), np.nan, dtype=np.float32)
            if good_rows:
                with autocast(device, run.precision):
                    out = model.encode_images(to_device(batch, device, pin)).float().cpu().numpy()
                where = {row: i for i, row in enumerate(all_rows)}
                block[[where[r] for r in good_rows]] = out
            bar.update(len(all_rows))
            yield block, {"skipped_images": len(all_rows) - len(good_rows)}


def embed_real(spec: RealModel, corpus: Corpus, runtime: EmbedConfig, run: RealRun | None = None) -> RawEmbeddings:
    """A real model's rows through the embedding cache (the model is loaded only on a cache miss); precision
    is applied here, by autocast around each batch. ``run``: the model already set up (and maybe loaded) for
    ``runtime``, e.g. by a job that embedded gallery shards with it."""
    name, kind = spec.name, spec.kind
    run = run or real_run(spec, runtime)
    encoder, device, precision, lazy, cache, common = run.encoder, run.device, run.precision, run.lazy, run.cache, run.common
    text = spec.text_record()
    info = {"model": name}
    paths = corpus.image_paths or [None] * corpus.n_images

    def compute_images(rows: np.ndarray):
        return embed_images(run, paths, rows, f"{name} images")

    texts = preprocess_texts(corpus.captions, spec.text.case, spec.text.template)

    def compute_texts(rows: np.ndarray):
        model = lazy.get()
        with progress_bar(total=len(rows), desc=f"{name} texts", unit="text", leave=False) as bar:
            for start in range(0, len(rows), runtime.text_batch_size):
                chunk = [texts[i] for i in rows[start:start + runtime.text_batch_size]]
                truncated = model.count_truncated(chunk)
                with autocast(device, precision):
                    out = model.encode_texts(to_device(model.tokenize(chunk), device, False))
                bar.update(len(chunk))
                yield out.float().cpu().numpy(), {"truncated_captions": truncated}

    image_material = {"kind": "image", **run.image_material(), "images": images_fingerprint(corpus)}
    text_material = {"kind": "text", **common, "text": {**text, **encoder.text_preprocessing()},
                     "captions": texts_fingerprint(corpus.captions)}
    images = cache.get_or_compute(image_material, corpus.n_images, compute_images, f"{name} images", info)
    image_rows, skipped = settle_skipped(images.embeddings, images.stats, corpus, runtime.on_bad_image, compute_images)
    captions = cache.get_or_compute(text_material, corpus.n_captions, compute_texts, f"{name} texts", info)
    if not lazy.loaded:
        log.info("%s: image and text embeddings read from the cache (model not loaded)", name)
    source = f"model {name!r} ({kind})"
    return RawEmbeddings(name, image_rows, captions.embeddings, source, source, dict(spec.given), {
        "cache": {"image_key": images.key, "image_hit": images.hit, "text_key": captions.key, "text_hit": captions.hit,
                  "dir": str(cache.root)},
        "model_loaded": lazy.loaded, "precision": precision, "text": text, **common,
        "skipped_images": skipped,
        "truncated_captions": int(captions.stats.get("truncated_captions", 0)),
        "max_text_tokens": encoder.max_text_tokens() if lazy.loaded else None,
        "embed_seconds": {"images": round(images.seconds, 3), "texts": round(captions.seconds, 3),
                          "model_load": round(lazy.load_seconds, 3)},  # load happens inside the first compute
    })
