"""Model kind ``sim``: a simulated embedding model over the ``sim`` dataset (see fusebench.data.simulated), and
its view of simulated distractors (``gallery=sim``).

A simulated model's rows are a pure function of its spec and the corpus parameters, so they are kept in
memory for the next job of the same process (a sweep on Hydra's basic launcher runs every job in one
process; ``runtime.state.SharedArrays``: a model of at most 256 MB, a COCO-size sim model is ~130 MB, 768 MB in all,
so that a large corpus of 100,000 images never holds a second copy of its rows). Returned read-only.

Simulated distractors are never held whole (a million rows of a 1152-dim model are 4.6 GB): :class:`SimDistractorRows`
draws the blocks a read needs (``DISTRACTOR_BLOCK`` rows each, every block from its own seeded generator), so any
range reads the same rows and galleries of one seed nest.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig
from fusebench.config.specs import SimParams
from fusebench.data.corpus import Corpus
from fusebench.data.simulated import (
    DISTRACTOR_BLOCK,
    distractor_latents,
    image_placement,
    image_rows,
    model_projection,
    model_rng,
    off_caption_basis,
    off_caption_rows,
    require_sim_corpus,
    seen_latents,
    sim_latents,
    sim_model_embeddings,
    sim_structure,
    topic_world,
)
from fusebench.encoders.distractors import normalised
from fusebench.runtime import state

SIM_DISTRACTORS_VERSION = 1  # bump when the rows a key describes change


def _key(params: SimParams, corpus: Corpus) -> str:
    sim_meta = {k: v for k, v in corpus.meta.items() if k.startswith("sim_")}
    settings = {"dim": params.dim, "image_noise": params.image_noise, "text_noise": params.text_noise,
                "seed": params.seed, "score": params.score}
    return json.dumps({**settings, **sim_meta, "n": [corpus.n_images, corpus.n_captions]}, sort_keys=True)


def sim_arrays(params: SimParams, corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """A sim model's (image, text) rows on a sim corpus, read-only (``params``: checked by its spec)."""
    require_sim_corpus(corpus)
    return state.current().shared.get(_key(params, corpus), lambda: _make(params, corpus))


def _make(params: SimParams, corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    image, text = sim_model_embeddings(corpus, params.dim, params.image_noise, params.text_noise, params.seed,
                                       params.score)
    image.setflags(write=False)
    text.setflags(write=False)
    return image, text


class SimDistractorRows:
    """``n`` simulated distractors as one sim model sees them (the DistractorRows interface of
    :mod:`fusebench.encoders.distractors`): every distractor's latent is shared by all models
    (:func:`~fusebench.data.simulated.distractor_latents`); the model sees it through its own image noise and
    projection and places its scores as it does its test images' (:func:`~fusebench.data.simulated.seen_latents`,
    :func:`~fusebench.data.simulated.image_rows`). On a clustered corpus the latents are drawn around its topic
    centres and the rows placed in its image cone, as its test images are. Distractors that are not hard keep only ``relevance`` of their
    embedding on what captions describe (:func:`~fusebench.data.simulated.off_caption_rows`).
    ``corpus``: the sim test split the model embeds (before distractors are appended)."""

    def __init__(self, params: SimParams, corpus: Corpus, gallery: GalleryConfig):
        if not corpus.meta.get("simulated"):
            raise FusebenchError(f"gallery=sim simulates distractors for dataset=sim; dataset {corpus.name!r} is "
                                 "real data: use gallery=folder | webdataset | paths | vectors for real distractors.")
        self.params, self.settings = params, gallery.sim
        self.n = int(gallery.size)
        self.corpus_seed, self.gallery_seed = int(corpus.meta["sim_seed"]), int(gallery.seed)
        latent_dim = int(corpus.meta["sim_latent_dim"])
        self.proj = model_projection(model_rng(self.corpus_seed, params.seed), params.dim, latent_dim)
        self.basis = off_caption_basis(self.corpus_seed, params.seed, self.proj)
        if self.settings.relevance < 1 and len(self.basis) == 0:
            raise FusebenchError(
                f"gallery.sim.relevance={self.settings.relevance} puts part of each distractor outside what the "
                f"captions describe, which needs a sim model wider than the latent space: dim={params.dim} <= "
                f"dataset.latent_dim={latent_dim}; raise the model's dim, lower dataset.latent_dim, or set "
                "gallery.sim.relevance=1.")
        self.placement = image_placement(corpus, params.score)  # the test images' (a clustered corpus: its cone)
        self.dim = params.dim + (0 if self.placement is None else 2)
        self._world = None if sim_structure(corpus) == "isotropic" else topic_world(corpus)
        self._corpus = corpus
        self._test_latents: np.ndarray | None = None
        self._last: tuple[int, np.ndarray] | None = None  # the block read last (reads in order share blocks)
        sim_meta = {k: v for k, v in corpus.meta.items() if k.startswith("sim_")}
        self._key = {"kind": "sim", "version": SIM_DISTRACTORS_VERSION, "block": DISTRACTOR_BLOCK,
                     "model": {"dim": params.dim, "image_noise": params.image_noise, "seed": params.seed,
                               "score": None if params.score is None else list(params.score)},
                     "corpus": {**sim_meta, "n_images": corpus.n_images, "n_captions": corpus.n_captions},
                     "gallery_seed": self.gallery_seed, "sim": asdict(self.settings), "n": self.n}

    @property
    def key(self) -> dict:
        """Everything the rows depend on (the image side of the model: its text noise changes no distractor)."""
        return self._key

    def read(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, int(start)), min(int(stop), self.n)
        if stop <= start:
            return np.empty((0, self.dim), dtype=np.float32)
        first, last = start // DISTRACTOR_BLOCK, (stop - 1) // DISTRACTOR_BLOCK
        offset = first * DISTRACTOR_BLOCK
        if first == last:  # a copy: the block is kept (read-only) for the next read
            return self.block(first)[start - offset:stop - offset].copy()
        return np.vstack([self.block(b) for b in range(first, last + 1)])[start - offset:stop - offset]

    def block(self, index: int) -> np.ndarray:
        """Block ``index`` of this model's distractor rows, whole (DISTRACTOR_BLOCK rows), normalised."""
        last = self._last
        if last is not None and last[0] == index:
            return last[1]
        if self._test_latents is None:
            self._test_latents = sim_latents(self._corpus)[0]
        s = self.settings
        latents, hard = distractor_latents(self.corpus_seed, self.gallery_seed, index, self._test_latents,
                                           s.hard_fraction, s.closeness, self._world)
        rng = np.random.default_rng([self.corpus_seed, 3, self.gallery_seed, self.params.seed, index])
        seen = seen_latents(latents, self.params.image_noise, rng)  # as its test images: seen_rows, image_rows
        if s.relevance < 1:  # hard distractors keep all of it: photos of the kinds of scene captions describe
            keep = np.where(hard, np.float32(1), np.float32(s.relevance))
            rows = off_caption_rows(seen, self.proj, self.basis, keep, rng)
        else:
            rows = seen @ self.proj
        rows = normalised(image_rows(rows, self.placement))
        rows.setflags(write=False)
        self._last = (index, rows)
        return rows


def sim_distractor_rows(params: SimParams, corpus: Corpus, gallery: GalleryConfig) -> SimDistractorRows:
    """The ``gallery.size`` simulated distractors of ``gallery`` (kind sim) as the sim model ``params`` sees them."""
    return SimDistractorRows(params, corpus, gallery)
