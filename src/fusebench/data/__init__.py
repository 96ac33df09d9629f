"""Corpus loaders, one per source, behind ``load_corpus(dataset_cfg)``."""

from __future__ import annotations

from collections.abc import Mapping

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus, validate_corpus
from fusebench.data.karpathy import load_karpathy
from fusebench.data.manifest import load_manifest
from fusebench.data.sim import make_sim_corpus
from fusebench.data.tiny import load_tiny

DATASET_KINDS = ("karpathy", "manifest", "sim", "tiny")


def load_corpus(cfg: Mapping) -> Corpus:
    kind = cfg.get("kind")
    name = str(cfg.get("name", kind))
    if kind == "manifest":
        if not cfg.get("manifest"):
            raise FusebenchError("dataset.manifest is not set: pass dataset.manifest=/path/to/manifest.jsonl.")
        return load_manifest(cfg["manifest"], name=name, image_root=cfg.get("image_root"))
    if kind == "karpathy":
        for key in ("annotations", "image_root"):
            if not cfg.get(key):
                raise FusebenchError(f"dataset.{key} is not set (see conf/dataset/{name}.yaml and paths.data_root).")
        verify = cfg.get("verify_images", "header")
        if verify not in ("none", "header", "full"):
            raise FusebenchError(f"dataset.verify_images={verify!r} is not valid; valid: none, header, full.")
        return load_karpathy(cfg["annotations"], cfg["image_root"], split=str(cfg.get("split", "test")), name=name,
                             expected=cfg.get("expected"), allow_nonstandard=bool(cfg.get("allow_nonstandard", False)),
                             verify=verify)
    if kind == "tiny":
        return load_tiny(limit=cfg.get("limit"), name=name)
    if kind == "sim":
        return make_sim_corpus(n_images=int(cfg.get("n_images", 5000)), n_captions=int(cfg.get("n_captions", 25010)),
                               latent_dim=int(cfg.get("latent_dim", 64)),
                               caption_noise=float(cfg.get("caption_noise", 1.3)),
                               shared_caption_noise=float(cfg.get("shared_caption_noise", 1.36)), seed=int(cfg.get("seed", 0)),
                               name=name)
    raise FusebenchError(f"dataset.kind={kind!r} is not a known dataset kind; valid: {', '.join(DATASET_KINDS)}.")


__all__ = ["Corpus", "DATASET_KINDS", "load_corpus", "validate_corpus"]
