"""A small two-model corpus for the engine tests, the EngineRequest an engine module takes, and fusebench's own
exact preset over the same vectors (what each engine's fused lists are compared with)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from fusebench.backends.engine_steps import EngineRequest
from fusebench.config import CONFIG_DIR
from fusebench.config.search import SearchConfig
from fusebench.fusion.combine import fuse_in_blocks
from fusebench.fusion.config import FusionConfig


def preset(name: str, **settings) -> FusionConfig:
    """The preset as the CLI composes it (fusion=NAME), with run settings (top_k, final_top_k, fuse_on) over it."""
    from fusebench.config.schema import register

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
        cfg = compose(config_name="config", overrides=[f"fusion={name}"] + [f"fusion.{k}={v}" for k, v in settings.items()])
    GlobalHydra.instance().clear()
    return FusionConfig(**OmegaConf.to_container(cfg.fusion))


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def corpus(n_items: int = 400, n_queries: int = 150, dims: tuple[int, ...] = (24, 16), seed: int = 11
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(items, queries): per model ("a", "b", ...) unit float32 rows; the queries resemble some items."""
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((n_items, 12))
    target = rng.integers(0, n_items, n_queries)
    items, queries = {}, {}
    for name, dim in zip("abcdefgh", dims):
        proj = rng.standard_normal((12, dim))
        items[name] = _unit(latent @ proj + 0.6 * rng.standard_normal((n_items, dim)))
        queries[name] = _unit(latent[target] @ proj + 0.8 * rng.standard_normal((n_queries, dim)))
    return items, queries


def request(items: dict, queries: dict, fusion: FusionConfig, workdir: Path, search: SearchConfig | None = None,
            weights: dict | None = None, direction: str = "t2i") -> EngineRequest:
    n_items = len(next(iter(items.values())))
    search = search or SearchConfig(backend="qdrant")
    return EngineRequest(direction=direction, items=items, queries=queries,
                         weights=weights or {m: 1.0 for m in items}, fusion=fusion,
                         per_model_k=fusion.per_model_k(n_items), final_k=fusion.final_k(n_items, len(items)),
                         search=replace(search), workdir=workdir)


def exact_singles(req: EngineRequest) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each model's exact cosine top ``per_model_k`` (ids int64, scores float32), ties by lower id."""
    out = {}
    for m in req.models:
        sims = torch.from_numpy(req.queries[m]) @ torch.from_numpy(req.items[m]).T
        top = torch.topk(sims, req.per_model_k, dim=1)
        out[m] = (top.indices.numpy(), top.values.numpy())
    return out


def exact_preset(req: EngineRequest, singles: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """fusebench's fusion of the preset over ``singles`` (default: the exact lists): (ids, scores) final_k wide."""
    singles = singles or exact_singles(req)
    ids = [torch.from_numpy(np.asarray(singles[m][0], dtype=np.int64)) for m in req.models]
    scores = [torch.from_numpy(np.asarray(singles[m][1], dtype=np.float32)) for m in req.models]
    fused = fuse_in_blocks(ids, scores, req.fusion, req.final_k, [req.weights[m] for m in req.models])
    return fused.ids.numpy(), fused.scores.numpy()
