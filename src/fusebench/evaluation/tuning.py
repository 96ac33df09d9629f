"""Honest tuning: fusion weights and method parameters chosen on a tuning split, then evaluated once on test.

Tuning on the test split and reporting on it inflates the gain. With ``tune=weights`` (or any ``tune`` option
with ``enabled: true``) a run first evaluates a grid of settings on a tuning split, keeps the best by a
stated criterion (``t2i R@1`` by default; the first in grid order on ties), and only then evaluates that one
setting on the test split. The tuning split is Karpathy's ``val`` for COCO and Flickr (``tune.split``), or a
seeded share of the images of a manifest or sim corpus (``tune.split: seeded``; the test evaluation then runs
on the other images, and says so). The test split itself is refused as a tuning split.

The grid: each model after the first takes every value of ``tune.weights`` (the first stays at 1: a weighted
sum's ranking depends only on the weights' ratios), crossed with ``tune.rrf_k`` and ``tune.ddof`` (empty:
keep the fusion's own). Per-model lists do not depend on these settings, so every grid point after the first
only fuses (the list store keeps the lists).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fusebench import DIRECTIONS, FUSED, FusebenchError
from fusebench.config.schema import TuneConfig
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import ModelEmbeddings
from fusebench.evaluation.metrics import recall_at_k
from fusebench.evaluation.subrecords import TunePoint
from fusebench.fusion.config import FusionConfig


def grid(settings: TuneConfig, models: list[str], fusion: FusionConfig) -> list[TunePoint]:
    """Every setting to try, in order: each model's weight and the fusion settings it changes."""
    weight_axes = [(1.0,)] + [settings.weights] * (len(models) - 1)
    fusion_axes = {key: axis for key, axis in (("rrf_k", settings.rrf_k), ("ddof", settings.ddof)) if axis}
    points = []
    for weights in itertools.product(*weight_axes):
        for values in itertools.product(*fusion_axes.values()):
            points.append(TunePoint(dict(zip(models, map(float, weights))), dict(zip(fusion_axes, values))))
    if len(points) < 2:
        raise FusebenchError(f"the tuning grid has {len(points)} setting, so there is nothing to choose: give "
                             "tune.weights (or tune.rrf_k / tune.ddof) two or more values, or set tune=none.")
    if len(points) > settings.max_points:
        raise FusebenchError(f"the tuning grid has {len(points)} settings, more than tune.max_points="
                             f"{settings.max_points}: shorten tune.weights / tune.rrf_k / tune.ddof or raise it.")
    return points


def seeded_split(corpus: Corpus, fraction: float, seed: int) -> np.ndarray:
    """(n_images,) bool: the images held out for tuning (at least one, never all of those with captions)."""
    rng = np.random.default_rng(seed)
    with_captions = corpus.i2t_query_images
    n = min(max(1, int(round(fraction * len(with_captions)))), len(with_captions) - 1)
    if n < 1:
        raise FusebenchError("tune.split=seeded needs at least two images with captions.")
    held = np.zeros(corpus.n_images, dtype=bool)
    held[rng.choice(with_captions, size=n, replace=False)] = True
    return held


def slice_embeddings(models: list[ModelEmbeddings], images: np.ndarray, captions: np.ndarray) -> list[ModelEmbeddings]:
    return [replace(m, image=m.image[images], text=m.text[captions]) for m in models]


def criterion_value(ranks: dict[str, np.ndarray], settings: TuneConfig) -> float:
    """The criterion (recall in percent) of one retriever's per-query ranks."""
    if settings.direction == "mean":
        return (recall_at_k(ranks["t2i"], settings.k) + recall_at_k(ranks["i2t"], settings.k)) / 2
    return recall_at_k(ranks[settings.direction], settings.k)


def apply(point: TunePoint, models: list[ModelEmbeddings],
          fusion: FusionConfig) -> tuple[list[ModelEmbeddings], FusionConfig]:
    """The models and fusion of one grid point."""
    tuned = replace(fusion, params={**fusion.params, **point.fusion})  # rrf_k, ddof: the method's own settings
    return [replace(m, weight=point.weights.get(m.name, m.weight)) for m in models], tuned


def run_grid(points: list[TunePoint], models: list[ModelEmbeddings], fusion: FusionConfig, settings: TuneConfig,
             lists_of: Callable[[list[ModelEmbeddings], FusionConfig], dict], progress=None) -> list[TunePoint]:
    """Each grid point with its criterion on the tuning split (the fused retriever's), in grid order; the first
    also with the single models'. ``lists_of(models, fusion)``: each retriever's lists at that point, name ->
    direction -> lists with ``ranks`` (the app's retrieval step: this module runs no search of its own)."""
    curve = []
    for point in points:
        tuned_models, tuned_fusion = apply(point, models, fusion)
        lists = lists_of(tuned_models, tuned_fusion)
        values = {name: criterion_value({d: lists[name][d].ranks for d in DIRECTIONS}, settings) for name in lists}
        curve.append(replace(point, value=values.pop(FUSED), singles=None if curve else values))
        if progress is not None:
            progress(1)
    return curve


def best(curve: list[TunePoint]) -> TunePoint:
    """The grid point with the highest criterion; the first in grid order on ties."""
    top = curve[max(range(len(curve)), key=lambda i: (curve[i].value, -i))]
    return replace(top, singles=None)
