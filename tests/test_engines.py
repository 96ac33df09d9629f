"""Engine fusion presets against the engines' own code: qdrant-client's local mode runs Qdrant's fusion
(prefetch + FusionQuery) in-process, on the same vectors.

Parity: equal fused scores (to float rounding: fusebench sums in float32, Qdrant's local mode in float64)
and equal ids within every group of tied scores; groups are compared as sets, because exactly tied RRF
sums (1/14 + 1/35 = 1/10) are ordered by rounding. Every fused item is compared (the limit covers them all).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers.tiers import fast_first
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from fusebench.config import CONFIG_DIR
from fusebench.fusion.combine import fuse
from fusebench.fusion.config import FusionConfig

N_IMAGES, N_QUERIES, DEPTH = 300, 200, 20


def preset(name: str, fuse_on: str) -> FusionConfig:
    """The preset as the CLI composes it (fusion=NAME)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
        cfg = compose(config_name="config", overrides=[f"fusion={name}", f"fusion.fuse_on={fuse_on}",
                                                       f"fusion.top_k={DEPTH}"])
    GlobalHydra.instance().clear()
    return FusionConfig(**OmegaConf.to_container(cfg.fusion))


def _qdrant():
    """qdrant-client, imported by the tests that run it (over a second to import: the hand-computed and transcribed
    engines' tests below need only fusebench)."""
    return pytest.importorskip("qdrant_client", reason="qdrant-client is a dev dependency (pip install -e '.[dev]')")


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
    qdrant = _qdrant()
    from qdrant_client import models

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


@pytest.mark.slow  # runs Qdrant's local mode
def test_qdrant_lists_are_the_exact_top_k(case):
    """Qdrant's per-model lists are the cosine top k fusebench computes (up to near-tied neighbours)."""
    images, texts = case
    client = _client(images, "source_object")
    ids, scores = _qdrant_lists(client, texts, "source_object")
    for m, (i, s) in zip(images, zip(ids, scores)):
        sims = torch.from_numpy(texts[m]) @ torch.from_numpy(images[m]).T
        assert torch.allclose(sims.gather(1, i), s, atol=1e-5)  # their scores are these items' cosines
        assert torch.allclose(torch.topk(sims, DEPTH, dim=1).values, s, atol=1e-5)  # and the top DEPTH of them


def top_lists(images: dict, texts: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each model's exact cosine top DEPTH per query: the lists every engine test fuses."""
    tops = [torch.topk(torch.from_numpy(texts[m]) @ torch.from_numpy(images[m]).T, DEPTH, dim=1) for m in images]
    return [t.indices for t in tops], [t.values for t in tops]


def ranx_runs(ranx, ids: list[torch.Tensor], scores: list[torch.Tensor]) -> list:
    """The same lists as ranx runs (one per model; queries q0.., documents d0..)."""
    return [ranx.Run({f"q{q}": {f"d{int(i)}": float(s) for i, s in zip(ids[m][q].tolist(), scores[m][q].tolist())}
                      for q in range(N_QUERIES)}) for m in range(len(ids))]


def _groups(entries: list[tuple[object, float]], tol: float) -> list[tuple[float, set]]:
    """Consecutive entries with equal scores (within ``tol``) as (score, set of ids)."""
    out: list[tuple[float, set]] = []
    for key, score in entries:
        if out and abs(out[-1][0] - score) <= tol:
            out[-1][1].add(key)
        else:
            out.append((score, {key}))
    return out


@pytest.mark.slow  # runs Qdrant's local mode
@pytest.mark.parametrize("name,fusion,fuse_on", [("qdrant_dbsf", "dbsf", "document"), ("qdrant_rrf", "rrf", "source_object"),
                                               ("qdrant_rrf", "rrf", "document"), ("qdrant_dbsf", "dbsf", "source_object")])
def test_qdrant_presets_match_qdrant_local_mode(case, name, fusion, fuse_on):
    _qdrant()
    from qdrant_client import models

    fusion = models.Fusion(fusion)  # qdrant-client's enum, by its value
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


@pytest.mark.slow  # imports qdrant-client (over a second)
def test_qdrant_rrf_weights_divide_the_rank():
    """Qdrant: 1 / (rank / w + k - 1) (k = 2), 0 for w <= 0; fusebench's default RRF multiplies instead."""
    _qdrant()
    from qdrant_client import models
    from qdrant_client.hybrid.fusion import reciprocal_rank_fusion

    a = [models.ScoredPoint(id=i, version=0, score=1.0 - i / 10) for i in (1, 2, 3)]
    b = [models.ScoredPoint(id=i, version=0, score=1.0 - i / 10) for i in (3, 4)]
    theirs = {p.id: p.score for p in reciprocal_rank_fusion([a, b], limit=10, weights=[2.0, 0.5])}
    config = FusionConfig(method="rrf", params={"rrf_k": 1, "rrf_weighting": "rank"}, fuse_on="source_object")
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
    ids, scores = top_lists(images, texts)
    ours = fuse(ids, scores, config, 2 * DEPTH)
    runs = ranx_runs(ranx, ids, scores)
    fused = ranx.fuse(runs=runs, method=method, norm="min-max", params=params).to_dict()
    for q in range(N_QUERIES):
        got = {f"d{int(i)}": float(s) for i, s in zip(ours.ids[q].tolist(), ours.scores[q].tolist()) if i >= 0}
        assert got.keys() == fused[f"q{q}"].keys()
        assert np.allclose([got[k] for k in got], [fused[f"q{q}"][k] for k in got], atol=1e-6)


# --- the other engines: hand-computed cases, then each engine's code transcribed literally --------------------

# Two lists of cosines: a holds images 1, 2, 3 (0.9, 0.5, 0.1), b holds 3, 4 (0.8, 0.2). Lucene's kNN score
# (1 + cos) / 2 makes them a: 0.95, 0.75, 0.55 and b: 0.9, 0.6.
_NA, _NB = math.sqrt(0.95**2 + 0.75**2 + 0.55**2), math.sqrt(0.9**2 + 0.6**2)
_ZA = math.sqrt((0.4**2 + 0 + 0.4**2) / 3)  # population sd of a's cosines (mean 0.5); b's is 0.3
_SA, _SB = math.sqrt((0.4**2 + 0 + 0.4**2) / 2), math.sqrt((0.3**2 + 0.3**2) / 1)  # sample sds (Qdrant's DBSF)


def _dbsf(s, mean, sd):
    return (s - (mean - 3 * sd)) / (6 * sd)


HAND = {
    "qdrant_rrf": {1: 1 / 2, 2: 1 / 3, 3: 1 / 4 + 1 / 2, 4: 1 / 3},  # 1 / (rank / w + 2 - 1)
    "qdrant_dbsf": {1: _dbsf(0.9, 0.5, _SA), 2: _dbsf(0.5, 0.5, _SA), 3: _dbsf(0.1, 0.5, _SA) + _dbsf(0.8, 0.5, _SB),
                    4: _dbsf(0.2, 0.5, _SB)},
    "elasticsearch_rrf": {1: 1 / 61, 2: 1 / 62, 3: 1 / 63 + 1 / 61, 4: 1 / 62},
    "ranx_combmnz": {1: 1.0, 2: 0.5, 3: (0.0 + 1.0) * 2, 4: 0.0},  # min-max, summed, times the lists holding it
    "ranx_combmax": {1: 1.0, 2: 0.5, 3: max(0.0, 1.0), 4: 0.0},
    "ranx_isr": {1: 1.0, 2: 1 / 4, 3: (1 / 9 + 1) * 2, 4: 1 / 4},
    "elasticsearch_linear_minmax": {1: 1.0, 2: 0.5, 3: 0.0 + 1.0, 4: 0.0},
    "elasticsearch_linear_l2": {1: 0.95 / _NA, 2: 0.75 / _NA, 3: 0.55 / _NA + 0.9 / _NB, 4: 0.6 / _NB},
    "opensearch_minmax": {1: 1.0 / 2, 2: 0.5 / 2, 3: (0.001 + 1.0) / 2, 4: 0.001 / 2},  # 0 -> 0.001; mean of 2
    "opensearch_minmax_geometric": {1: 1.0, 2: 0.5, 3: math.sqrt(0.001 * 1.0), 4: 0.001},
    "opensearch_minmax_harmonic": {1: 1.0, 2: 0.5, 3: 2 / (1 / 0.001 + 1 / 1.0), 4: 0.001},
    "opensearch_l2": {1: 0.95 / _NA / 2, 2: 0.75 / _NA / 2, 3: (0.55 / _NA + 0.9 / _NB) / 2, 4: 0.6 / _NB / 2},
    "opensearch_zscore": {1: 0.4 / _ZA / 2, 2: 0.001 / 2, 3: (0.001 + 0.3 / 0.3) / 2, 4: 0.001 / 2},
    "weaviate_ranked": {1: 1 / 60, 2: 1 / 61, 3: 1 / 62 + 1 / 60, 4: 1 / 61},  # w / (60 + 0-based position)
    "weaviate_relative_score": {1: 1.0, 2: 0.5, 3: 0.0 + 1.0, 4: 0.0},
    "milvus_rrf": {1: 1 / 61, 2: 1 / 62, 3: 1 / 63 + 1 / 61, 4: 1 / 62},
    "milvus_weighted": {1: 0.95, 2: 0.75, 3: 0.55 + 0.9, 4: 0.6},
    "milvus_weighted_ip": {i: sum(0.5 + math.atan(s) / math.pi for s in v)
                           for i, v in {1: [0.9], 2: [0.5], 3: [0.1, 0.8], 4: [0.2]}.items()},
    "lancedb_rrf": {1: 1 / 61, 2: 1 / 62, 3: 1 / 63 + 1 / 61, 4: 1 / 62},  # each list ranked on its own (0.40)
    # n = 4 candidates: a gives 4, 3, 2 and (4 - 3 + 1) / 2 = 1 to image 4; b gives 4, 3 and 1.5 to 1 and 2
    "ranx_borda": {1: 4 + 1.5, 2: 3 + 1.5, 3: 2 + 4, 4: 1 + 3},
}


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("name", fast_first(list(HAND)))  # a composition each
def test_presets_by_hand(name):
    config = preset(name, "source_object")
    ids = [torch.tensor([[1, 2, 3]]), torch.tensor([[3, 4, -1]])]
    scores = [torch.tensor([[0.9, 0.5, 0.1]]), torch.tensor([[0.8, 0.2, float("-inf")]])]
    ours = fuse(ids, scores, config, 4)
    got = {int(i): float(s) for i, s in zip(ours.ids[0].tolist(), ours.scores[0].tolist()) if i >= 0}
    assert got == pytest.approx(HAND[name], rel=1e-5), name
    assert ours.scores[0].tolist() == sorted(ours.scores[0].tolist(), reverse=True)


def _opensearch(lists, weights, normalization: str, combination: str) -> dict:
    """neural-search's NormalizationProcessor transcribed: float32 normalisation per sub-query, a zero-filled
    score array per document, then ArithmeticMean / GeometricMean / HarmonicMean ScoreCombinationTechnique."""
    f32 = np.float32
    normalised = []
    for ids, cosines in lists:
        scores = [f32((1 + c) / 2) for c in cosines]  # Lucene's cosine kNN score
        out = {}
        if normalization == "min_max":
            low, high = min(scores), max(scores)
            for i, s in zip(ids, scores):
                if high == low and s == high:
                    out[i] = f32(1.0)
                else:
                    v = f32(f32(s - low) / f32(high - low))
                    out[i] = f32(0.001) if v == 0 else v
        elif normalization == "l2":
            norm = f32(math.sqrt(sum(f32(s * s) for s in scores)))
            out = {i: f32(0.0) if norm == 0 else f32(s / norm) for i, s in zip(ids, scores)}
        else:  # z_score
            mean = f32(sum(scores) / f32(len(scores)))
            sd = f32(math.sqrt(sum((float(s) - float(mean)) ** 2 for s in scores) / len(scores)))
            for i, s in zip(ids, scores):
                if s == mean:
                    out[i] = f32(1.0)
                elif sd == 0:
                    out[i] = f32(0.001)
                else:
                    z = f32((s - mean) / sd)
                    out[i] = f32(0.001) if z <= 0 else z
        normalised.append(out)
    fused = {}
    for doc in {i for ids, _ in lists for i in ids}:
        row = [normalised[j].get(doc, f32(0.0)) for j in range(len(lists))]
        if combination == "arithmetic_mean":
            pairs = [(w, s) for w, s in zip(weights, row) if s >= 0.0]
            fused[doc] = sum(w * s for w, s in pairs) / sum(w for w, _ in pairs)
        elif combination == "geometric_mean":
            pairs = [(w, s) for w, s in zip(weights, row) if s > 0]
            fused[doc] = math.exp(sum(w * math.log(s) for w, s in pairs) / sum(w for w, _ in pairs))
        else:
            pairs = [(w, s) for w, s in zip(weights, row) if s > 0]
            fused[doc] = sum(w for w, _ in pairs) / sum(w / s for w, s in pairs)
    return fused


def _per_set(lists, weights, normalise) -> dict:
    """Weighted sum over the result sets that hold the document (Elasticsearch linear, Weaviate, Milvus)."""
    fused: dict = {}
    for (ids, cosines), w in zip(lists, weights):
        for i, v in zip(ids, normalise(list(cosines))):
            fused[i] = fused.get(i, 0.0) + w * v
    return fused


def _minmax(scores, flat):
    low, high = min(scores), max(scores)
    return [flat if high - low <= 0 else (s - low) / (high - low) for s in scores]


def _by_rank(lists, weights, value) -> dict:
    fused: dict = {}
    for m, ((ids, _), w) in enumerate(zip(lists, weights)):
        for position, i in enumerate(ids):
            fused[i] = fused.get(i, 0.0) + w * value(m, position)
    return fused


ENGINES = {  # each engine's fusion of one query's lists, transcribed from its code (see conf/fusion/NAME.yaml)
    "opensearch_minmax": lambda L, W: _opensearch(L, W, "min_max", "arithmetic_mean"),
    "opensearch_minmax_geometric": lambda L, W: _opensearch(L, W, "min_max", "geometric_mean"),
    "opensearch_minmax_harmonic": lambda L, W: _opensearch(L, W, "min_max", "harmonic_mean"),
    "opensearch_l2": lambda L, W: _opensearch(L, W, "l2", "arithmetic_mean"),
    "opensearch_zscore": lambda L, W: _opensearch(L, W, "z_score", "arithmetic_mean"),
    "elasticsearch_linear_minmax": lambda L, W: _per_set(L, W, lambda c: _minmax([(1 + x) / 2 for x in c], 1.0)),
    "elasticsearch_linear_l2": lambda L, W: _per_set(
        L, W, lambda c: [(1 + x) / 2 / math.sqrt(sum(((1 + y) / 2) ** 2 for y in c)) for x in c]),
    "weaviate_relative_score": lambda L, W: _per_set(L, W, lambda c: _minmax(c, 1.0)),
    "milvus_weighted": lambda L, W: _per_set(L, W, lambda c: [(1 + x) * 0.5 for x in c]),
    "milvus_weighted_ip": lambda L, W: _per_set(L, W, lambda c: [0.5 + math.atan(x) / math.pi for x in c]),
    "weaviate_ranked": lambda L, W: _by_rank(L, W, lambda m, i: 1 / (i + 60)),
    "milvus_rrf": lambda L, W: _by_rank(L, W, lambda m, i: 1 / (60 + i + 1)),
    "lancedb_rrf": lambda L, W: _by_rank(L, W, lambda m, i: 1 / (i + 1 + 60)),  # rerank_multivector (0.40)
}


FAST_ENGINES = ("opensearch_zscore", "lancedb_rrf")  # the two with their own quirks stay in the fast tier


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("name", fast_first([*FAST_ENGINES, *(e for e in ENGINES if e not in FAST_ENGINES)], 2))
def test_presets_match_the_engines_code(case, name):
    """Every fused image and score of 200 queries equals the engine's own computation (transcribed from its
    source: OpenSearch neural-search, Elasticsearch x-pack rank, Weaviate, Milvus, LanceDB) to float
    rounding; weights 1 and 0.5 where the engine takes weights."""
    images, texts = case
    config = preset(name, "source_object")
    weights = [1.0, 1.0] if name == "lancedb_rrf" else [1.0, 0.5]  # LanceDB's RRF takes no weights
    ids, scores = top_lists(images, texts)
    ours = fuse(ids, scores, config, 2 * DEPTH, weights=weights)
    for q in range(N_QUERIES):
        lists = [(ids[m][q].tolist(), scores[m][q].tolist()) for m in range(len(ids))]
        theirs = ENGINES[name](lists, weights)
        got = {int(i): float(s) for i, s in zip(ours.ids[q].tolist(), ours.scores[q].tolist()) if i >= 0}
        assert got.keys() == theirs.keys(), q
        # OpenSearch's z_score sums 20 float32 scores near 0.75 (error ~1e-6) and divides by an sd near 0.02:
        # its own rounding reaches ~1e-4 there; fusebench accumulates the mean in float64
        tol = 1e-4 if name == "opensearch_zscore" else 1e-6
        assert [got[k] for k in got] == pytest.approx([theirs[k] for k in got], rel=2e-5, abs=tol), (name, q)


@pytest.mark.slow  # ranx compiles its numba kernels on first use
def test_borda_matches_ranx_bordafuse(case):
    ranx = pytest.importorskip("ranx", reason="ranx is a dev dependency")
    images, texts = case
    config = preset("ranx_borda", "source_object")
    ids, scores = top_lists(images, texts)
    ours = fuse(ids, scores, config, 2 * DEPTH)
    runs = ranx_runs(ranx, ids, scores)
    fused = ranx.fuse(runs=runs, method="bordafuse").to_dict()
    for q in range(N_QUERIES):
        got = {f"d{int(i)}": float(s) for i, s in zip(ours.ids[q].tolist(), ours.scores[q].tolist()) if i >= 0}
        assert got == pytest.approx(fused[f"q{q}"], abs=1e-6)
