"""Corpus loaders, one per source, behind ``load_corpus(dataset)``: a dataset kind is a loader here and a config
class in :data:`fusebench.config.schema.DATASETS` (its keys and checks)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fusebench.config.schema import (
    DATASETS,
    DatasetConfig,
    KarpathyDatasetConfig,
    ManifestDatasetConfig,
    SimDatasetConfig,
    TinyDatasetConfig,
)
from fusebench.data.corpus import Corpus, validate_corpus
from fusebench.data.karpathy import load_karpathy
from fusebench.data.manifest import load_manifest
from fusebench.data.simulated import make_sim_corpus
from fusebench.data.tiny import load_tiny

DATASET_KINDS = tuple(DATASETS)


def load_corpus(dataset: DatasetConfig) -> Corpus:
    """The corpus a typed ``dataset`` config describes (:func:`fusebench.config.run.dataset_config` makes one)."""
    if isinstance(dataset, ManifestDatasetConfig):
        return load_manifest(dataset.manifest, name=dataset.name, image_root=dataset.image_root)
    if isinstance(dataset, KarpathyDatasetConfig):
        return load_karpathy(dataset.annotations, dataset.image_root, split=dataset.split, name=dataset.name,
                             expected=dataset.expected or None, allow_nonstandard=dataset.allow_nonstandard,
                             verify=dataset.verify_images)
    if isinstance(dataset, TinyDatasetConfig):
        return load_tiny(limit=dataset.limit, name=dataset.name)
    if isinstance(dataset, SimDatasetConfig):
        return make_sim_corpus(dataset)
    raise TypeError(f"load_corpus takes a dataset config ({', '.join(c.__name__ for c in DATASETS.values())}), "
                    f"not {type(dataset).__name__}")


def other_split(dataset: DatasetConfig) -> str | None:
    """The split of ``dataset`` that is not the one reported on, where it has one: ``val`` (``test`` when the run
    reports on val) for Karpathy and sim corpora; None for a manifest or the tiny photos (one split only)."""
    if isinstance(dataset, (KarpathyDatasetConfig, SimDatasetConfig)):
        return "test" if dataset.split == "val" else "val"
    return None


def sample_images(corpus: Corpus, n_images: int, seed: int) -> Corpus:
    """At most ``n_images`` of ``corpus``'s images that have captions, a seeded sample in corpus order, with their
    captions (the whole corpus's images with captions when it has no more)."""
    with_captions = corpus.i2t_query_images
    if len(with_captions) <= n_images:
        keep = with_captions
    else:
        keep = np.sort(np.random.default_rng(seed).choice(with_captions, size=n_images, replace=False))
    drop = np.ones(corpus.n_images, dtype=bool)
    drop[keep] = False
    return corpus.without_images(drop)[0]


def tuning_split(dataset: DatasetConfig, n_images: int, seed: int) -> Corpus | None:
    """Images and captions of the dataset's other split (:func:`other_split`), at most ``n_images`` images: queries
    outside every reported metric, for choosing a setting on (``search.target_recall``). Karpathy: a seeded sample of
    that split's images (checked as a non-standard split: its counts are not the test split's); sim: a fresh draw of
    ``n_images`` images from the same world, with the test split's captions per image. None without another split."""
    split = other_split(dataset)
    if split is None:
        return None
    if isinstance(dataset, SimDatasetConfig):
        n = min(n_images, dataset.n_images)
        captions = max(n, round(n * dataset.n_captions / dataset.n_images))
        return make_sim_corpus(replace(dataset, split=split, n_images=n, n_captions=captions))
    corpus = load_corpus(replace(dataset, split=split, expected={}, allow_nonstandard=True))
    return sample_images(corpus, n_images, seed)


__all__ = ["Corpus", "DATASET_KINDS", "load_corpus", "other_split", "sample_images", "tuning_split",
           "validate_corpus"]
