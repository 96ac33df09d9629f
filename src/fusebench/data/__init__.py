"""Corpus loaders, one per source, behind ``load_corpus(dataset)``: a dataset kind is one module of
:mod:`fusebench.data.kinds` (its keys, checks and loader), dispatched by its registry; the loaders' file reading
(Karpathy's annotations, manifests, parquet, the simulation) sits beside it here. Light on purpose (the CLI scans
the kinds, and so imports this package, before any heavy import)."""

from __future__ import annotations

from fusebench.config.schema import DATASET_KINDS, DatasetConfig


def load_corpus(dataset: DatasetConfig):
    """The :class:`~fusebench.data.corpus.Corpus` a typed ``dataset`` config describes
    (:func:`fusebench.config.run.dataset_config` makes one), read by its kind's loader."""
    kind = DATASET_KINDS.get(getattr(dataset, "kind", None))
    if not isinstance(dataset, kind.params):
        raise TypeError(f"load_corpus takes a dataset kind's params ({kind.params.__name__} for {kind.name}), "
                        f"not {type(dataset).__name__}")
    return kind.load(dataset)


def other_split(dataset: DatasetConfig) -> str | None:
    """The split of ``dataset`` that is not the one reported on, where its kind has one (``tuning``): ``val``
    (``test`` when the run reports on val) for Karpathy and sim corpora; None for a kind with one split only."""
    if DATASET_KINDS.get(dataset.kind).tuning is None:
        return None
    return "test" if dataset.split == "val" else "val"


def tuning_split(dataset: DatasetConfig, n_images: int, seed: int):
    """Images and captions of the dataset's other split (:func:`other_split`), at most ``n_images`` images: queries
    outside every reported metric, for choosing a setting on (``search.target_recall``), as the kind's ``tuning``
    gives them (Karpathy: a seeded sample of that split's images, checked as a non-standard split; sim: a fresh draw
    of ``n_images`` images from the same world). None without another split."""
    split = other_split(dataset)
    if split is None:
        return None
    return DATASET_KINDS.get(dataset.kind).tuning(dataset, split, n_images, seed)


__all__ = ["load_corpus", "other_split", "tuning_split"]
