"""Corpus loaders, one per source, behind ``load_corpus(dataset)``: a dataset kind is a loader here and a config
class in :data:`fusebench.config.schema.DATASETS` (its keys and checks)."""

from __future__ import annotations

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


__all__ = ["Corpus", "DATASET_KINDS", "load_corpus", "validate_corpus"]
