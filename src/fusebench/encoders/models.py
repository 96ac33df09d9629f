"""A model's rows by its kind, and the checked embeddings the evaluator takes.

Each model spec (typed by :mod:`fusebench.config.specs`) has a ``kind``, one module of
:mod:`fusebench.encoders.kinds`; ``load_raw`` runs that kind's ``load``. The real kinds share :func:`load_real`
(the encoder through the embedding cache, or the ``sim:`` stand-in on a simulated corpus). ``finalize``
validates and L2-normalises the rows once every model is loaded (images no model could read are dropped first).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fusebench import FusebenchError
from fusebench.config.specs import MODEL_KINDS, ModelSpec, RealModel, SimParams, model_spec
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import ModelEmbeddings, RawEmbeddings, check_embeddings
from fusebench.encoders.simulated import sim_arrays


def sim_stand_in(spec: RealModel) -> SimParams:
    """On a simulated corpus a real model runs as its ``sim:`` stand-in; its text noise may
    depend on ``text.case`` (so a preprocessing study shows an effect on simulated data too)."""
    if spec.stand_in is None:
        raise FusebenchError(f"models.{spec.name} is a real model ({spec.kind}) and has no 'sim:' stand-in, so it "
                             "cannot run on dataset=sim; add a sim: block (dim, image_noise, text_noise, seed) or "
                             "use a real dataset.")
    return spec.stand_in


RECORD_KEYS = ("weight", "text", "label", "published")  # what a stand-in keeps of the model it stands in for


def stand_in_record(spec: RealModel) -> dict:
    """The spec recorded for a real model run as its sim stand-in: what actually ran (``kind: sim`` and its
    parameters, as configured, its text noise the one of its text case) and, under ``stands_in_for``, the real
    model it replaced; weight, text settings, label and published numbers are kept, so reports treat it as that
    model with that preprocessing."""
    given = spec.given
    real = {k: v for k, v in given.items() if k not in (*RECORD_KEYS, "sim")}
    return {**_stand_in_ran(spec), **{k: given[k] for k in RECORD_KEYS if k in given}, "stands_in_for": real}


def _stand_in_ran(spec: RealModel) -> dict:
    """The stand-in as configured (its ``sim:`` block) with ``kind: sim`` and the text noise of its text case."""
    block = dict(spec.given["sim"])
    noise = block["text_noise"]
    return {**block, "kind": "sim", "text_noise": noise[spec.text.case] if isinstance(noise, Mapping) else noise}


def load_real(spec: RealModel, corpus: Corpus, runtime) -> RawEmbeddings:
    """A real model's rows: its encoder through the embedding cache (``runtime``: the embed group), or on a
    simulated corpus its ``sim:`` stand-in."""
    if corpus.meta.get("simulated"):  # a real model on a simulated corpus runs as its stand-in, and says so
        stand_in = sim_stand_in(spec)
        image, text = sim_arrays(stand_in, corpus)
        source = f"sim stand-in of model {spec.name!r}"
        return RawEmbeddings(spec.name, image, text, source, source, stand_in_record(spec),
                             {"stand_in": _stand_in_ran(spec)}, declared_dim=stand_in.dim)
    from fusebench.encoders.real import (
        embed_real,  # lazy: heavy (torch, numba, PIL); torch: only a real model on real data needs it
    )

    if runtime is None:
        raise ValueError(f"model {spec.name!r} ({spec.kind}) needs the embed group (EmbedConfig) to run")
    return embed_real(spec, corpus, runtime)


def typed_spec(name: str, spec: ModelSpec | Mapping) -> ModelSpec:
    """``spec`` as its kind's typed spec (a mapping, as tests and scripts give one, is converted and checked)."""
    return spec if isinstance(spec, ModelSpec) else model_spec(name, spec, [])


def load_raw(name: str, spec: ModelSpec | Mapping, corpus: Corpus, runtime=None) -> RawEmbeddings:
    """A model's rows for ``corpus``, by its kind (``runtime``: the embed group, for real models)."""
    spec = typed_spec(name, spec)
    return MODEL_KINDS.get(spec.kind).load(spec, corpus, runtime)


def finalize(raw: RawEmbeddings, corpus: Corpus, weight: float) -> ModelEmbeddings:
    """The checked, L2-normalised embeddings the evaluator takes, with the model's ``weight``."""
    embeddings = check_embeddings(raw.name, raw.image, raw.text, corpus.n_images, corpus.n_captions,
                                  raw.image_source, raw.text_source, raw.spec, weight)
    embeddings.info, embeddings.declared_dim = raw.info, raw.declared_dim
    return embeddings


def drop_unreadable(raws: list[RawEmbeddings], corpus: Corpus) -> tuple[list[RawEmbeddings], Corpus]:
    """Leave out images that any model could not read (embed.on_bad_image=skip), with their captions."""
    drop = np.zeros(corpus.n_images, dtype=bool)
    for raw in raws:
        if raw.unreadable_images is not None:
            drop |= raw.unreadable_images
    if not drop.any():
        return raws, corpus
    if drop.all():
        raise FusebenchError(f"embed.on_bad_image=skip: none of the {corpus.n_images} images of {corpus.name} could "
                             "be read, so nothing is left to evaluate; check the image files (with "
                             "embed.on_bad_image=fail the first bad one is named).")
    smaller, keep_images, keep_captions = corpus.without_images(drop)
    for raw in raws:
        raw.image, raw.text = raw.image[keep_images], raw.text[keep_captions]
    return raws, smaller


def embed(name: str, spec: ModelSpec | Mapping, corpus: Corpus, runtime=None) -> ModelEmbeddings:
    """One model's validated, L2-normalised embeddings of ``corpus``."""
    spec = typed_spec(name, spec)
    return finalize(load_raw(name, spec, corpus, runtime), corpus, spec.weight)


__all__ = ["ModelEmbeddings", "RawEmbeddings", "check_embeddings", "drop_unreadable", "embed",
           "finalize", "load_raw", "load_real", "sim_stand_in"]
