"""Engine fusion presets against the engines' own code: qdrant-client's local mode runs Qdrant's fusion
(prefetch + FusionQuery) in-process, on the same vectors.

Parity: equal fused scores (to float rounding: fusebench sums in float32, Qdrant's local mode in float64)
and equal ids within every group of tied scores; groups are compared as sets, because exactly tied RRF
sums (1/14 + 1/35 = 1/10) are ordered by rounding. Every fused item is compared (the limit covers them all).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from fusebench.cli import CONFIG_DIR
from fusebench.fusion import FusionConfig, fuse

qdrant = pytest.importorskip("qdrant_client", reason="qdrant-client is a dev dependency (pip install -e '.[dev]')")
from qdrant_client import models  # noqa: E402

N_IMAGES, N_QUERIES, DEPTH = 300, 200, 20


def preset(name: str, fuse_on: str) -> FusionConfig:
    """The preset as the CLI composes it (fusion=NAME)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
        cfg = compose(config_name="config", overrides=[f"fusion={name}", f"fusion.fuse_on={fuse_on}",
                                                       f"fusion.top_k={DEPTH}"])
    GlobalHydra.instance().clear()
    return FusionConfig(**OmegaConf.to_container(cfg.fusion))


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(11)
    latent = rng.standard_normal((N_IMAGES, 12))
    images, texts = {}, {}
    caption_image = rng.integers(0, N_IMAGES, N_QUERIES)
    for name, dim in (("a", 24), ("b", 16)):
        proj = rng.standard_normal((12, dim))
        images[name] = _unit(latent @ proj + 0.6 * rng.standard_normal((N_IMAGES, dim)))
        texts[name] = _unit(latent[caption_image] @ proj + 0.8 * rng.standard_normal((N_QUERIES, dim)))
    return images, texts


def _client(images: dict, fuse_on: str):
    """source_object: one point per image with a named vector per model; document: one point per model's
    entry (ids N*m + image), so the same image found by both models is two entries."""
    client = qdrant.QdrantClient(":memory:")
    config = {m: models.VectorParams(size=v.shape[1], distance=models.Distance.COSINE) for m, v in images.items()}
    client.create_collection("c", vectors_config=config)
    if fuse_on == "source_object":
        points = [models.PointStruct(id=i, vector={m: images[m][i].tolist() for m in images}) for i in range(N_IMAGES)]
    else:
        points = [models.PointStruct(id=N_IMAGES * k + i, vector={m: images[m][i].tolist()})
                  for k, m in enumerate(images) for i in range(N_IMAGES)]
    client.upsert("c", points=points)
    return client


def _qdrant_lists(client, texts: dict, fuse_on: str):
    """Each model's top DEPTH per query as Qdrant's own search returns them, as (ids, scores) tensors: the
    lists both sides fuse (so the comparison is of fusion alone, not of two matmuls' last bits)."""
    ids, scores = [], []
    for m in texts:
        rows = [client.query_points("c", query=texts[m][q].tolist(), using=m, limit=DEPTH).points
                for q in range(N_QUERIES)]
        ids.append(torch.tensor([[int(p.id) % N_IMAGES for p in r] for r in rows]))
        scores.append(torch.tensor([[p.score for p in r] for r in rows], dtype=torch.float32))
    return ids, scores


def test_qdrant_lists_are_the_exact_top_k(case):
    """Qdrant's per-model lists are the cosine top k fusebench computes (up to near-tied neighbours)."""
    images, texts = case
    client = _client(images, "source_object")
    ids, scores = _qdrant_lists(client, texts, "source_object")
    for m, (i, s) in zip(images, zip(ids, scores)):
        sims = torch.from_numpy(texts[m]) @ torch.from_numpy(images[m]).T
        assert torch.allclose(sims.gather(1, i), s, atol=1e-5)  # their scores are these items' cosines
        assert torch.allclose(torch.topk(sims, DEPTH, dim=1).values, s, atol=1e-5)  # and the top DEPTH of them


def _groups(entries: list[tuple[object, float]], tol: float) -> list[tuple[float, set]]:
    """Consecutive entries with equal scores (within ``tol``) as (score, set of ids)."""
    out: list[tuple[float, set]] = []
    for key, score in entries:
        if out and abs(out[-1][0] - score) <= tol:
            out[-1][1].add(key)
        else:
            out.append((score, {key}))
    return out


@pytest.mark.parametrize("name,fusion", [("qdrant_rrf", models.Fusion.RRF), ("qdrant_dbsf", models.Fusion.DBSF)])
@pytest.mark.parametrize("fuse_on", ["source_object", "document"])
def test_qdrant_presets_match_qdrant_local_mode(case, name, fusion, fuse_on):
    images, texts = case
    config = preset(name, fuse_on)
    client = _client(images, fuse_on)
    ids, scores = _qdrant_lists(client, texts, fuse_on)
    final_k = 2 * DEPTH  # every fused item
    ours = fuse(ids, scores, config, final_k)
    names = list(images)
    compared = 0
    for q in range(N_QUERIES):
        prefetch = [models.Prefetch(query=texts[m][q].tolist(), using=m, limit=DEPTH) for m in names]
        theirs = client.query_points("c", prefetch=prefetch, query=models.FusionQuery(fusion=fusion),
                                     limit=final_k).points
        # Qdrant's own per-model lists must be the lists fusebench fused (same vectors, cosine)
        if fuse_on == "source_object":
            their_entries = [(int(p.id), float(p.score)) for p in theirs]
            our_entries = [(int(i), float(s)) for i, s in zip(ours.ids[q].tolist(), ours.scores[q].tolist()) if i >= 0]
        else:  # an entry is (model, image): Qdrant's id says the model; fusebench's contributor bit does
            their_entries = [((int(p.id) // N_IMAGES, int(p.id) % N_IMAGES), float(p.score)) for p in theirs]
            our_entries = [((int(c).bit_length() - 1, int(i)), float(s)) for i, s, c in
                           zip(ours.ids[q].tolist(), ours.scores[q].tolist(), ours.contributors[q].tolist()) if i >= 0]
        assert len(their_entries) == len(our_entries)
        mine, yours = _groups(our_entries, 2e-6), _groups(their_entries, 2e-6)
        assert [g[1] for g in mine] == [g[1] for g in yours], q
        assert np.allclose([g[0] for g in mine], [g[0] for g in yours], rtol=0, atol=2e-6)
        compared += 1
    assert compared == N_QUERIES


def test_qdrant_rrf_weights_divide_the_rank():
    """Qdrant: 1 / (rank / w + k - 1) (k = 2), 0 for w <= 0; fusebench's default RRF multiplies instead."""
    from qdrant_client.hybrid.fusion import reciprocal_rank_fusion

    a = [models.ScoredPoint(id=i, version=0, score=1.0 - i / 10) for i in (1, 2, 3)]
    b = [models.ScoredPoint(id=i, version=0, score=1.0 - i / 10) for i in (3, 4)]
    theirs = {p.id: p.score for p in reciprocal_rank_fusion([a, b], limit=10, weights=[2.0, 0.5])}
    config = FusionConfig(method="rrf", rrf_k=1, rrf_weighting="rank", fuse_on="source_object")
    ids = [torch.tensor([[1, 2, 3]]), torch.tensor([[3, 4, -1]])]
    scores = [torch.tensor([[0.9, 0.8, 0.7]]), torch.tensor([[0.7, 0.6, 0.0]])]
    ours = fuse(ids, scores, config, 4, weights=[2.0, 0.5])
    got = {int(i): float(s) for i, s in zip(ours.ids[0].tolist(), ours.scores[0].tolist())}
    assert got == pytest.approx(theirs)
    assert got[3] == pytest.approx(1 / (3 / 2 + 1) + 1 / (1 / 0.5 + 1))  # by hand


@pytest.mark.slow  # ranx compiles its numba kernels on first use (~50 s)
@pytest.mark.parametrize("name,method,params", [("elasticsearch_rrf", "rrf", {"k": 60}), ("ranx_combmnz", "mnz", {}),
                                                ("ranx_combmax", "max", {}), ("ranx_isr", "isr", {})])
def test_presets_match_ranx(case, name, method, params):
    """Elasticsearch's RRF (1 / (rank_constant + rank), rank 1-based, 60) is ranx's rrf with k = 60; CombMNZ,
    CombMAX (both over min-max normalised lists) and ISR are ranx's mnz, max and isr."""
    ranx = pytest.importorskip("ranx", reason="ranx is a dev dependency")
    images, texts = case
    config = preset(name, "source_object")
    ids, scores = [], []
    for m in images:
        top = torch.topk(torch.from_numpy(texts[m]) @ torch.from_numpy(images[m]).T, DEPTH, dim=1)
        ids.append(top.indices)
        scores.append(top.values)
    ours = fuse(ids, scores, config, 2 * DEPTH)
    runs = [ranx.Run({f"q{q}": {f"d{int(i)}": float(s) for i, s in zip(ids[m][q].tolist(), scores[m][q].tolist())}
                      for q in range(N_QUERIES)}) for m in range(len(ids))]
    fused = ranx.fuse(runs=runs, method=method, norm="min-max", params=params).to_dict()
    for q in range(N_QUERIES):
        got = {f"d{int(i)}": float(s) for i, s in zip(ours.ids[q].tolist(), ours.scores[q].tolist()) if i >= 0}
        assert got.keys() == fused[f"q{q}"].keys()
        assert np.allclose([got[k] for k in got], [fused[f"q{q}"][k] for k in got], atol=1e-6)
