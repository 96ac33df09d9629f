"""Corpus loaders, one per source, behind ``load_corpus(dataset_cfg)``."""

from __future__ import annotations

from collections.abc import Mapping

from fusebench import FusebenchError
from fusebench.config import checks
from fusebench.config.schema import SimDatasetSchema
from fusebench.data.corpus import Corpus, validate_corpus
from fusebench.data.karpathy import load_karpathy
from fusebench.data.manifest import load_manifest
from fusebench.data.simulated import make_sim_corpus
from fusebench.data.tiny import load_tiny

DATASET_KINDS = ("karpathy", "manifest", "sim", "tiny")


DATASET_KEYS = {
    "manifest": ("name", "kind", "manifest", "image_root"),
    "karpathy": ("name", "kind", "annotations", "image_root", "split", "expected", "allow_nonstandard", "verify_images"),
    "tiny": ("name", "kind", "limit"),
    "sim": ("name", "kind", "n_images", "n_captions", "latent_dim", "caption_noise", "shared_caption_noise", "seed"),
}


def load_corpus(cfg: Mapping) -> Corpus:
    """The corpus a ``dataset`` config describes (every key set: sim's defaults are
    :class:`fusebench.config.schema.SimDatasetSchema`, the other kinds' their YAML files)."""
    cfg = checks.mapping(cfg, "dataset")
    kind = checks.choice(checks.required(cfg, "kind", "dataset"), "dataset.kind", DATASET_KINDS)
    checks.known_keys(cfg, "dataset", DATASET_KEYS[kind])
    need = {key: checks.required(cfg, key, "dataset") for key in DATASET_KEYS[kind]}
    name = checks.text(need["name"], "dataset.name")
    if kind == "manifest":
        if not need["manifest"]:
            raise FusebenchError("dataset.manifest is not set: pass dataset.manifest=/path/to/manifest.jsonl.")
        return load_manifest(checks.text(need["manifest"], "dataset.manifest"), name=name,
                             image_root=checks.text(need["image_root"], "dataset.image_root", allow_none=True))
    if kind == "karpathy":
        for key in ("annotations", "image_root"):
            if not need[key]:
                raise FusebenchError(f"dataset.{key} is not set (see conf/dataset/{name}.yaml and paths.data_root).")
        verify = checks.choice(need["verify_images"], "dataset.verify_images", ("none", "header", "full"))
        expected = checks.mapping(need["expected"], "dataset.expected")
        checks.known_keys(expected, "dataset.expected", ("images", "captions"))
        for key, value in expected.items():
            checks.integer(value, f"dataset.expected.{key}", 1)
        return load_karpathy(checks.text(need["annotations"], "dataset.annotations"),
                             checks.text(need["image_root"], "dataset.image_root"),
                             split=checks.text(need["split"], "dataset.split"), name=name, expected=expected or None,
                             allow_nonstandard=checks.boolean(need["allow_nonstandard"], "dataset.allow_nonstandard"),
                             verify=verify)
    if kind == "tiny":
        return load_tiny(limit=checks.optional_integer(need["limit"], "dataset.limit", 1, "null = all images"), name=name)
    return make_sim_corpus(SimDatasetSchema(
        name=name, n_images=checks.integer(need["n_images"], "dataset.n_images", 1),
        n_captions=checks.integer(need["n_captions"], "dataset.n_captions", 1),
        latent_dim=checks.integer(need["latent_dim"], "dataset.latent_dim", 1),
        caption_noise=checks.number(need["caption_noise"], "dataset.caption_noise", 0),
        shared_caption_noise=checks.number(need["shared_caption_noise"], "dataset.shared_caption_noise", 0),
        seed=checks.integer(need["seed"], "dataset.seed", 0)))


__all__ = ["Corpus", "DATASET_KINDS", "load_corpus", "validate_corpus"]
