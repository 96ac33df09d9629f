"""Corpus loaders, one per source, behind ``load_corpus(dataset_cfg)``."""

from __future__ import annotations

from collections.abc import Mapping

from fusebench import FusebenchError, checks
from fusebench.data.corpus import Corpus, validate_corpus
from fusebench.data.karpathy import load_karpathy
from fusebench.data.manifest import load_manifest
from fusebench.data.sim import make_sim_corpus
from fusebench.data.tiny import load_tiny

DATASET_KINDS = ("karpathy", "manifest", "sim", "tiny")


DATASET_KEYS = {
    "manifest": ("name", "kind", "manifest", "image_root"),
    "karpathy": ("name", "kind", "annotations", "image_root", "split", "expected", "allow_nonstandard", "verify_images"),
    "tiny": ("name", "kind", "limit"),
    "sim": ("name", "kind", "n_images", "n_captions", "latent_dim", "caption_noise", "shared_caption_noise", "seed"),
}


def load_corpus(cfg: Mapping) -> Corpus:
    cfg = checks.mapping(cfg, "dataset")
    kind = checks.choice(cfg.get("kind"), "dataset.kind", DATASET_KINDS)
    checks.known_keys(cfg, "dataset", DATASET_KEYS[kind])
    name = checks.text(cfg.get("name", kind), "dataset.name")
    if kind == "manifest":
        if not cfg.get("manifest"):
            raise FusebenchError("dataset.manifest is not set: pass dataset.manifest=/path/to/manifest.jsonl.")
        return load_manifest(checks.text(cfg["manifest"], "dataset.manifest"), name=name,
                             image_root=checks.text(cfg.get("image_root"), "dataset.image_root", allow_none=True))
    if kind == "karpathy":
        for key in ("annotations", "image_root"):
            if not cfg.get(key):
                raise FusebenchError(f"dataset.{key} is not set (see conf/dataset/{name}.yaml and paths.data_root).")
        verify = checks.choice(cfg.get("verify_images", "header"), "dataset.verify_images", ("none", "header", "full"))
        expected = checks.mapping(cfg.get("expected"), "dataset.expected")
        checks.known_keys(expected, "dataset.expected", ("images", "captions"))
        for key, value in expected.items():
            checks.integer(value, f"dataset.expected.{key}", 1)
        return load_karpathy(checks.text(cfg["annotations"], "dataset.annotations"),
                             checks.text(cfg["image_root"], "dataset.image_root"),
                             split=checks.text(cfg.get("split", "test"), "dataset.split"), name=name,
                             expected=expected or None,
                             allow_nonstandard=checks.boolean(cfg.get("allow_nonstandard", False),
                                                              "dataset.allow_nonstandard"),
                             verify=verify)
    if kind == "tiny":
        return load_tiny(limit=checks.optional_integer(cfg.get("limit"), "dataset.limit", 1, "null = all images"),
                         name=name)
    return make_sim_corpus(
        n_images=checks.integer(cfg.get("n_images", 5000), "dataset.n_images", 1),
        n_captions=checks.integer(cfg.get("n_captions", 25010), "dataset.n_captions", 1),
        latent_dim=checks.integer(cfg.get("latent_dim", 64), "dataset.latent_dim", 1),
        caption_noise=checks.number(cfg.get("caption_noise", 1.3), "dataset.caption_noise", 0),
        shared_caption_noise=checks.number(cfg.get("shared_caption_noise", 1.36), "dataset.shared_caption_noise", 0),
        seed=checks.integer(cfg.get("seed", 0), "dataset.seed", 0), name=name)


__all__ = ["Corpus", "DATASET_KINDS", "load_corpus", "validate_corpus"]
