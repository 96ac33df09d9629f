"""Embedding sources behind one entry point.

Each model spec (one ``conf/models/*.yaml`` or ``+models.NAME.*`` overrides) has a ``kind`` that picks the
backend: ``vectors`` (embeddings the user already has), ``sim`` (simulated), ``open_clip`` and ``hf`` (real
models, through the embedding cache). ``load_raw`` gets a model's rows; ``finalize`` validates and
L2-normalises them once every model is loaded (images no model could read are dropped first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from fusebench import FusebenchError
from fusebench.config import checks
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import ModelEmbeddings, RawEmbeddings, check_embeddings, model_weight
from fusebench.encoders.query_text import text_settings
from fusebench.encoders.simulated import sim_arrays
from fusebench.encoders.vectors import vector_arrays


def sim_stand_in(name: str, spec: Mapping) -> dict:
    """On a simulated corpus a real model (hf, open_clip) runs as its ``sim:`` stand-in; its text noise may
    depend on ``text.case`` (so a preprocessing study shows an effect on simulated data too)."""
    block = spec.get("sim")
    if block and not isinstance(block, Mapping):
        raise FusebenchError(f"models.{name}.sim={block!r} is not valid; valid: a block of dim, image_noise, "
                             "text_noise, seed.")
    if not block:
        raise FusebenchError(f"models.{name} is a real model ({spec.get('kind')}) and has no 'sim:' stand-in, so it "
                             "cannot run on dataset=sim; add a sim: block (dim, image_noise, text_noise, seed) or "
                             "use a real dataset.")
    text_noise = checks.required(block, "text_noise", f"models.{name}.sim")
    if isinstance(text_noise, Mapping):  # per text.case: the preprocessing study's effect on simulated data
        case = text_settings(name, spec)["case"]
        if case not in text_noise:
            raise FusebenchError(f"models.{name}.sim.text_noise has no value for text.case={case!r}; it has "
                                 f"{', '.join(map(str, text_noise))}: add {case}: NOISE.")
        text_noise = text_noise[case]
    return {**block, "kind": "sim", "text_noise": text_noise}


RECORD_KEYS = ("weight", "text", "label", "published")  # what a stand-in keeps of the model it stands in for


def stand_in_record(spec: Mapping, stand_in: Mapping) -> dict:
    """The spec recorded for a real model run as its sim stand-in: what actually ran (``kind: sim`` and its
    parameters) and, under ``stands_in_for``, the real model it replaced; weight, text settings, label and
    published numbers are kept, so reports treat it as that model with that preprocessing."""
    real = {k: v for k, v in spec.items() if k not in (*RECORD_KEYS, "sim")}
    return {**dict(stand_in), **{k: spec[k] for k in RECORD_KEYS if k in spec}, "stands_in_for": real}


def _vectors(name: str, spec: Mapping, corpus: Corpus, runtime) -> RawEmbeddings:
    image, text, image_src, text_src = vector_arrays(name, spec, (corpus.n_images, corpus.n_captions))
    return RawEmbeddings(name, image, text, image_src, text_src, dict(spec))


def _sim(name: str, spec: Mapping, corpus: Corpus, runtime) -> RawEmbeddings:
    image, text = sim_arrays(spec, corpus, f"models.{name}")
    return RawEmbeddings(name, image, text, f"sim model {name!r}", f"sim model {name!r}", dict(spec))


def _real(name: str, spec: Mapping, corpus: Corpus, runtime) -> RawEmbeddings:
    if corpus.meta.get("simulated"):  # a real model on a simulated corpus runs as its stand-in, and says so
        stand_in = sim_stand_in(name, spec)
        image, text = sim_arrays(stand_in, corpus, f"models.{name}.sim")
        source = f"sim stand-in of model {name!r}"
        return RawEmbeddings(name, image, text, source, source, stand_in_record(spec, stand_in), {"stand_in": stand_in})
    from fusebench.encoders.real import embed_real

    if runtime is None:
        raise ValueError(f"model {name!r} ({spec['kind']}) needs a Runtime (the embed config group) to run")
    return embed_real(name, spec, corpus, runtime)


# the one registry of model kinds: kind -> loader (the real kinds' backends: fusebench.encoders.real.ENCODERS)
KINDS: dict[str, Callable[[str, Mapping, Corpus, object], RawEmbeddings]] = {
    "hf": _real, "open_clip": _real, "sim": _sim, "vectors": _vectors}


def load_raw(name: str, spec: Mapping, corpus: Corpus, runtime=None) -> RawEmbeddings:
    """A model's rows for ``corpus``, by its kind (``runtime``: the embed group, for real models)."""
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise FusebenchError(f"models.{name}.kind={kind!r} is not a known model kind; valid kinds: {', '.join(KINDS)}.")
    return KINDS[kind](name, spec, corpus, runtime)


def finalize(raw: RawEmbeddings, corpus: Corpus) -> ModelEmbeddings:
    """The checked, L2-normalised embeddings the evaluator takes, with the model's weight."""
    embeddings = check_embeddings(raw.name, raw.image, raw.text, corpus.n_images, corpus.n_captions,
                                  raw.image_source, raw.text_source, raw.spec, model_weight(raw.name, raw.spec))
    embeddings.info = raw.info
    return embeddings


def drop_unreadable(raws: list[RawEmbeddings], corpus: Corpus) -> tuple[list[RawEmbeddings], Corpus]:
    """Leave out images that any model could not read (embed.on_bad_image=skip), with their captions."""
    drop = np.zeros(corpus.n_images, dtype=bool)
    for raw in raws:
        if raw.unreadable_images is not None:
            drop |= raw.unreadable_images
    if not drop.any():
        return raws, corpus
    smaller, keep_images, keep_captions = corpus.without_images(drop)
    for raw in raws:
        raw.image, raw.text = raw.image[keep_images], raw.text[keep_captions]
    return raws, smaller


def embed(name: str, spec: Mapping, corpus: Corpus, runtime=None) -> ModelEmbeddings:
    """One model's validated, L2-normalised embeddings of ``corpus``."""
    return finalize(load_raw(name, spec, corpus, runtime), corpus)


__all__ = ["KINDS", "ModelEmbeddings", "RawEmbeddings", "check_embeddings", "drop_unreadable", "embed",
           "finalize", "load_raw", "model_weight"]
