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
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from fusebench import DIRECTIONS, FUSED, FusebenchError
from fusebench.config import checks
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import ModelEmbeddings, fusion_weight
from fusebench.evaluation.metrics import recall_at_k
from fusebench.fusion.combine import FusionConfig

TUNE_KEYS = ("enabled", "split", "fraction", "seed", "criterion", "weights", "rrf_k", "ddof", "max_points")
TUNE_DIRECTIONS = (*DIRECTIONS, "mean")  # a criterion's direction: one of them or their mean


@dataclass(frozen=True)
class TuneSettings:
    split: str  # a Karpathy split name, or "seeded"
    fraction: float  # seeded: share of images held out for tuning
    seed: int
    direction: str  # criterion: t2i | i2t | mean
    k: int  # criterion: recall@k
    weights: tuple[float, ...]
    rrf_k: tuple[float, ...]
    ddof: tuple[int, ...]
    max_points: int

    @property
    def criterion(self) -> str:
        return f"{self.direction} R@{self.k}"


def tune_settings(cfg: Mapping | None, dataset_kind: str, dataset_split: str | None) -> TuneSettings | None:
    """The ``tune`` group's values, checked; None when tuning is off."""
    if not cfg:
        return None
    cfg = checks.mapping(cfg, "tune")
    checks.known_keys(cfg, "tune", TUNE_KEYS)
    if not checks.boolean(checks.required(cfg, "enabled", "tune"), "tune.enabled"):
        return None
    split = checks.text(checks.required(cfg, "split", "tune"), "tune.split", hint="auto, val (Karpathy) or seeded")
    if split == "auto":
        split = "val" if dataset_kind == "karpathy" else "seeded"
    if dataset_kind == "karpathy" and split == "seeded":
        raise FusebenchError("tune.split=seeded holds out part of the test corpus; a Karpathy dataset has its own "
                             "tuning split: use tune.split=val.")
    if dataset_kind != "karpathy" and split != "seeded":
        raise FusebenchError(f"tune.split={split!r}: a {dataset_kind} corpus has no named splits; use "
                             "tune.split=seeded (a seeded share of its images, tune.fraction).")
    if dataset_kind == "karpathy" and split == dataset_split:
        raise FusebenchError(f"tune.split={split!r} is the split the run reports on (dataset.split={dataset_split}): "
                             "tuning on the test split inflates the gain. Tune on val (tune.split=val).")
    criterion = checks.text(checks.required(cfg, "criterion", "tune"), "tune.criterion", hint="e.g. 't2i R@1'")
    parts = criterion.replace("R@", " ").split()
    if len(parts) != 2 or parts[0] not in TUNE_DIRECTIONS or not parts[1].isdigit() or int(parts[1]) < 1:
        raise FusebenchError(f"tune.criterion={criterion!r} is not valid: give a direction ({', '.join(TUNE_DIRECTIONS)}) "
                             "and a recall, e.g. 't2i R@1' or 'mean R@5'.")

    def values(key, kind):
        raw = checks.required(cfg, key, "tune")
        if not isinstance(raw, (list, tuple)):
            raise FusebenchError(f"tune.{key}={raw!r} is not valid: give a list (an empty list keeps the fusion's own).")
        return tuple(kind(v, f"tune.{key}") for v in raw)

    weights = values("weights", fusion_weight)
    if not weights:
        raise FusebenchError("tune.weights=[] is not valid: give the weights to try for models 2..M, "
                             "e.g. tune.weights=[0.5,1,2] (the first model stays at 1).")
    return TuneSettings(split=split, fraction=checks.number(checks.required(cfg, "fraction", "tune"), "tune.fraction", 0, 1,
                                                            open_low=True, open_high=True, hint="e.g. 0.2"),
                        seed=checks.integer(checks.required(cfg, "seed", "tune"), "tune.seed", 0),
                        direction=parts[0], k=int(parts[1]), weights=weights,
                        rrf_k=values("rrf_k", lambda v, key: checks.number(v, key, 0, hint="rrf_k >= 0")),
                        ddof=values("ddof", lambda v, key: checks.choice(v, key, (0, 1))),
                        max_points=checks.integer(checks.required(cfg, "max_points", "tune"), "tune.max_points", 1))


def grid(settings: TuneSettings, models: list[str], fusion: FusionConfig) -> list[dict]:
    """Every setting to try, in order: {"weights": {model: w}, "fusion": {key: value}}."""
    weight_axes = [(1.0,)] + [settings.weights] * (len(models) - 1)
    fusion_axes = {key: axis for key, axis in (("rrf_k", settings.rrf_k), ("ddof", settings.ddof)) if axis}
    points = []
    for weights in itertools.product(*weight_axes):
        for values in itertools.product(*fusion_axes.values()):
            points.append({"weights": dict(zip(models, map(float, weights))), "fusion": dict(zip(fusion_axes, values))})
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


def criterion_value(ranks: dict[str, np.ndarray], settings: TuneSettings) -> float:
    """The criterion (recall in percent) of one retriever's per-query ranks."""
    if settings.direction == "mean":
        return (recall_at_k(ranks["t2i"], settings.k) + recall_at_k(ranks["i2t"], settings.k)) / 2
    return recall_at_k(ranks[settings.direction], settings.k)


def apply(point: dict, models: list[ModelEmbeddings], fusion: FusionConfig) -> tuple[list[ModelEmbeddings], FusionConfig]:
    """The models and fusion of one grid point."""
    return ([replace(m, weight=point["weights"].get(m.name, m.weight)) for m in models], replace(fusion, **point["fusion"]))


def run_grid(points: list[dict], models: list[ModelEmbeddings], caption_image: np.ndarray, fusion: FusionConfig,
             settings: TuneSettings, search, progress=None) -> list[dict]:
    """Each grid point's criterion on the tuning split (the fused retriever's), in grid order."""
    from fusebench.app.retrieval import ListSource, retrieve

    source, curve = ListSource(), []
    for point in points:
        tuned_models, tuned_fusion = apply(point, models, fusion)
        lists = retrieve(tuned_models, caption_image, tuned_fusion, keep_k=1, settings=search, source=source)
        values = {name: criterion_value({d: lists[name][d].ranks for d in ("t2i", "i2t")}, settings) for name in lists}
        curve.append({**point, "value": values.pop(FUSED), **({} if curve else {"singles": values})})
        if progress is not None:
            progress(1)
    return curve


def best(curve: list[dict]) -> dict:
    """The grid point with the highest criterion; the first in grid order on ties."""
    top = curve[max(range(len(curve)), key=lambda i: (curve[i]["value"], -i))]
    return {key: top[key] for key in ("weights", "fusion", "value")}


def describe_point(point: dict) -> str:
    """'b=0.5, rrf_k=60' for a grid point (the first model's weight, always 1, left out)."""
    weights = list(point["weights"].items())[1:]
    return ", ".join([f"{name}={w:g}" for name, w in weights] + [f"{k}={v:g}" for k, v in point["fusion"].items()])
