"""``kind: karpathy``: COCO 5k and Flickr30k 1k, the Karpathy splits, read exactly as the annotation files give
them (:mod:`fusebench.data.karpathy`), with the standard counts as a protocol guard."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fusebench import FusebenchError
from fusebench.data.kinds import DatasetKind, register
from fusebench.runtime import checks

VERIFY_IMAGES = ("none", "header", "full")


@dataclass
class KarpathyDatasetConfig:
    name: str = "karpathy"
    kind: str = "karpathy"
    annotations: str | None = None  # Karpathy's dataset_*.json, or CLIP_benchmark's files
    image_root: str | None = None
    split: str = "test"  # test | val | restval | train
    expected: dict = field(default_factory=dict)  # {images, captions}: the protocol guard; {} = none
    allow_nonstandard: bool = False  # true: run a differing corpus, marked non-standard
    verify_images: str = "header"  # none | header | full (decode every image)

    def __post_init__(self):
        self.name = checks.text(self.name, "dataset.name")
        for key in ("annotations", "image_root"):
            if not getattr(self, key):
                raise FusebenchError(f"dataset.{key} is not set (see conf/dataset/{self.name}.yaml and paths.data_root).")
        checks.choice(self.verify_images, "dataset.verify_images", VERIFY_IMAGES)
        self.expected = checks.mapping(self.expected, "dataset.expected")
        checks.known_keys(self.expected, "dataset.expected", ("images", "captions"))
        for key, value in self.expected.items():
            checks.integer(value, f"dataset.expected.{key}", 1)
        if len(self.expected) == 1:
            raise FusebenchError(f"dataset.expected={self.expected} is not valid: give both images and captions "
                                 "(the standard split's counts), or {} for no check.")
        self.annotations = checks.text(self.annotations, "dataset.annotations")
        self.image_root = checks.text(self.image_root, "dataset.image_root")
        self.split = checks.text(self.split, "dataset.split")
        self.allow_nonstandard = checks.boolean(self.allow_nonstandard, "dataset.allow_nonstandard")


def load(params: KarpathyDatasetConfig):
    from fusebench.data.karpathy import (
        load_karpathy,  # lazy: heavy (numpy, PIL); numpy and PIL: the CLI scans the kinds before heavy imports
    )

    return load_karpathy(params.annotations, params.image_root, split=params.split, name=params.name,
                         expected=params.expected or None, allow_nonstandard=params.allow_nonstandard,
                         verify=params.verify_images)


def split_params(params: KarpathyDatasetConfig, split: str) -> KarpathyDatasetConfig:
    """Split ``split`` of the same annotation file: its counts are not the standard test split's, so unchecked and
    marked non-standard."""
    return replace(params, split=split, expected={}, allow_nonstandard=True)


def tuning(params: KarpathyDatasetConfig, split: str, n_images: int, seed: int):
    """A seeded sample of at most ``n_images`` of split ``split``'s images with their captions."""
    from fusebench.data.corpus import (
        sample_images,  # lazy: heavy (numpy); numpy: the CLI scans the kinds before heavy imports
    )

    return sample_images(load(split_params(params, split)), n_images, seed)


KIND = register(DatasetKind("karpathy", KarpathyDatasetConfig, load, "Karpathy's COCO and Flickr30k splits "
                            "(dataset_*.json or CLIP_benchmark's files); `dataset=coco5k`, `flickr1k`",
                            tuning=tuning, split_params=split_params))
