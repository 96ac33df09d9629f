"""``kind: sim``: a seeded synthetic corpus, COCO 5k-sized by default (docs/simulated.md); its latents are drawn by
:mod:`fusebench.data.simulated`, which the ``sim`` model kind and ``gallery=sim`` read as well."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fusebench.data.kinds import DatasetKind, register
from fusebench.runtime import checks

SIM_SPLITS = ("test", "val")  # dataset.split of a sim corpus: two independent draws from one world
SIM_STRUCTURES = ("isotropic", "clustered")  # dataset.structure (docs/simulated.md)
# The keys only dataset.structure=clustered reads (any other structure must leave them at their defaults)
SIM_STRUCTURE_READS = {"isotropic": (), "clustered": ("topics", "subtopics", "topic_spread", "subtopic_spread", "own_spread",
                                                      "spectrum_decay", "cone", "gap", "caption_noise_decay")}
# Keys a structure gained after its first release: a corpus records them only when they differ from these defaults,
# so the keys and digests of every corpus drawn without them stay as they were
SIM_RECORDED_WHEN_SET = {"caption_noise_decay": 0.0}


@dataclass
class SimDatasetConfig:
    name: str = "sim"
    kind: str = "sim"
    n_images: int = 5000
    n_captions: int = 25010
    latent_dim: int = 64
    caption_noise: float = 1.3  # what each caption adds or misses on its own
    shared_caption_noise: float = 1.36  # what all captions of an image miss alike
    seed: int = 0
    split: str = "test"  # test | val: val is a fresh draw of images and captions from the same world and models
    #   (what search.target_recall tunes an index on: docs/search.md), never the test split's
    structure: str = "isotropic"  # isotropic | clustered: latents shaped like real embeddings (docs/simulated.md)
    # structure=clustered only: a topic hierarchy, an anisotropic spectrum, a cone and a modality gap
    topics: int = 32  # coarse topics
    subtopics: int = 32  # sub-topics per topic (images are drawn around the topics x subtopics centres)
    topic_spread: float = 0.64  # sd of the topic centres (an isotropic latent's is 1)
    subtopic_spread: float = 0.64  # sd of each sub-topic's offset from its topic's centre
    own_spread: float = 0.6  # sd of each image's own part around its sub-topic's centre
    spectrum_decay: float = 1.0  # latent variance along dimension j is proportional to (j + 1) ** -decay
    cone: float = 0.35  # share of each image row's squared norm on the images' common direction (mean cosine)
    gap: float = 0.8  # distance between the image and the text centroids (models with no score placement)
    caption_noise_decay: float = 0.0  # caption noise variance along latent dimension j ~ (j + 1) ** -decay: 0 =
    #   isotropic; < 0 puts it where images vary least (text queries further out of distribution: docs/simulated.md)

    def __post_init__(self):
        self.name = checks.text(self.name, "dataset.name")
        for key in ("n_images", "n_captions", "latent_dim"):
            setattr(self, key, checks.integer(getattr(self, key), f"dataset.{key}", 1))
        for key in ("caption_noise", "shared_caption_noise"):
            setattr(self, key, checks.number(getattr(self, key), f"dataset.{key}", 0))
        self.seed = checks.integer(self.seed, "dataset.seed", 0)
        checks.choice(self.split, "dataset.split", SIM_SPLITS)
        checks.choice(self.structure, "dataset.structure", SIM_STRUCTURES)
        for key in ("topics", "subtopics"):
            setattr(self, key, checks.integer(getattr(self, key), f"dataset.{key}", 1))
        for key in ("topic_spread", "subtopic_spread", "own_spread"):
            setattr(self, key, checks.number(getattr(self, key), f"dataset.{key}", 0, 100, open_low=key == "own_spread"))
        self.spectrum_decay = checks.number(self.spectrum_decay, "dataset.spectrum_decay", 0, 8,
                                            hint="0 = every latent dimension alike")
        self.cone = checks.number(self.cone, "dataset.cone", 0, 1, open_low=True, open_high=True)
        self.caption_noise_decay = checks.number(self.caption_noise_decay, "dataset.caption_noise_decay", -8, 8,
                                                 hint="0 = caption noise alike in every direction")
        self.gap = checks.number(self.gap, "dataset.gap", 0, 2 * self.cone ** 0.5,
                                 hint=f"at most 2 * sqrt(dataset.cone) = {2 * self.cone ** 0.5:.4g}")
        checks.unread(self, "dataset", "structure", SIM_STRUCTURE_READS, " (latents drawn alike in every direction)")


def load(params: SimDatasetConfig):
    from fusebench.data.simulated import (
        make_sim_corpus,  # lazy: heavy (numpy); numpy: the CLI scans the kinds before heavy imports
    )

    return make_sim_corpus(params)


def tuning(params: SimDatasetConfig, split: str, n_images: int, seed: int):
    """A fresh draw of at most ``n_images`` images of the same world (split ``split``), with the test split's
    captions per image."""
    n = min(n_images, params.n_images)
    captions = max(n, round(n * params.n_captions / params.n_images))
    return load(replace(params, split=split, n_images=n, n_captions=captions))


KIND = register(DatasetKind("sim", SimDatasetConfig, load, "a seeded synthetic corpus (no files); `dataset=sim`, "
                            "`sim_clustered`, `sim_clustered_calibrated`", tuning=tuning))
