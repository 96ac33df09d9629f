import numpy as np
import pytest
import torch
from reference import fuse_one_query, i2t_rank, integer_embeddings, stable_order, t2i_rank

from fusebench.fusion import FUSE_ON, FusionConfig
from fusebench.retrieval import ModelInput, retrieve

N_IMAGES = 23


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(42)
    counts = rng.integers(1, 5, size=N_IMAGES)
    counts[[4, 17]] = 0  # distractors: retrievable, ask no i2t query
    caption_image = np.repeat(np.arange(N_IMAGES), counts)
    models = [ModelInput("a", integer_embeddings(rng, N_IMAGES), integer_embeddings(rng, len(caption_image))),
              ModelInput("b", integer_embeddings(rng, N_IMAGES, dim=5), integer_embeddings(rng, len(caption_image), dim=5),
                         weight=0.7)]
    return models, caption_image


def _scores(model):
    return model.text @ model.image.T  # exact: small integers


def test_single_model_ranks_and_lists_match_reference(case):
    models, caption_image = case
    out = retrieve(models[:1], caption_image, FusionConfig(method="none", top_k=4), keep_k=None, chunk_size=7)
    scores = _scores(models[0])
    query_images = np.unique(caption_image)
    assert query_images.tolist() == [i for i in range(N_IMAGES) if i not in (4, 17)]
    lists = out["a"]
    for q in range(len(caption_image)):
        assert lists["t2i"].ranks[q] == t2i_rank(scores[q].tolist(), caption_image[q])  # exact even beyond top_k
        assert lists["t2i"].ids[q].tolist() == stable_order(scores[q].tolist())[:4]
    for row, image in enumerate(query_images):
        correct = set(np.flatnonzero(caption_image == image).tolist())
        assert lists["i2t"].ranks[row] == i2t_rank(scores[:, image].tolist(), correct)
        assert lists["i2t"].ids[row].tolist() == stable_order(scores[:, image].tolist())[:4]


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_results_do_not_depend_on_chunk_size(case, chunk_size):
    models, caption_image = case
    config = FusionConfig(method="dbsf", top_k=6, final_top_k=8)
    base = retrieve(models, caption_image, config, keep_k=None, chunk_size=1000)
    other = retrieve(models, caption_image, config, keep_k=None, chunk_size=chunk_size)
    for name in base:
        for direction in ("t2i", "i2t"):
            assert np.array_equal(base[name][direction].ranks, other[name][direction].ranks)
            assert torch.equal(base[name][direction].ids, other[name][direction].ids)


@pytest.mark.parametrize("method", ["rrf", "dbsf", "sum", "minmax", "zscore"])
@pytest.mark.parametrize("fuse_on", FUSE_ON)
def test_fused_lists_match_per_query_reference_both_directions(case, method, fuse_on):
    models, caption_image = case
    top_k, final_k = 5, 7
    config = FusionConfig(method=method, fuse_on=fuse_on, top_k=top_k, final_top_k=final_k)
    out = retrieve(models, caption_image, config, keep_k=None, chunk_size=6)
    weights = [m.weight for m in models]
    all_scores = [_scores(m) for m in models]
    query_images = np.unique(caption_image)

    def per_model_lists(rows):
        return [(stable_order(row)[:top_k], [row[j] for j in stable_order(row)[:top_k]]) for row in rows]

    for q in range(len(caption_image)):
        expected = fuse_one_query(per_model_lists([s[q].tolist() for s in all_scores]), method, fuse_on, final_k, weights)
        assert out["fused"]["t2i"].ids[q].tolist()[: len(expected)] == [e[0] for e in expected]
        hits = [p for p, e in enumerate(expected, start=1) if e[0] == caption_image[q]]
        assert out["fused"]["t2i"].ranks[q] == (hits[0] if hits else 0)
    for row, image in enumerate(query_images):
        expected = fuse_one_query(per_model_lists([s[:, image].tolist() for s in all_scores]), method, fuse_on,
                                  final_k, weights)
        assert out["fused"]["i2t"].ids[row].tolist()[: len(expected)] == [e[0] for e in expected]
        hits = [p for p, e in enumerate(expected, start=1) if caption_image[e[0]] == image]
        assert out["fused"]["i2t"].ranks[row] == (hits[0] if hits else 0)


def test_no_fused_retriever_for_one_model_or_method_none(case):
    models, caption_image = case
    assert set(retrieve(models[:1], caption_image, FusionConfig(method="rrf", top_k=5), None)) == {"a"}
    assert set(retrieve(models, caption_image, FusionConfig(method="none", top_k=5), None)) == {"a", "b"}


def test_top_k_none_means_all_items(case):
    models, caption_image = case
    out = retrieve(models, caption_image, FusionConfig(method="rrf", top_k=None), keep_k=None, chunk_size=9)
    assert out["a"]["t2i"].ids.shape == (len(caption_image), N_IMAGES)
    assert out["a"]["i2t"].ids.shape == (N_IMAGES - 2, len(caption_image))
    assert (out["fused"]["t2i"].ranks >= 1).all() and (out["fused"]["i2t"].ranks >= 1).all()


def test_keep_k_cuts_stored_lists_not_ranks(case):
    models, caption_image = case
    config = FusionConfig(method="rrf", top_k=None)
    full = retrieve(models, caption_image, config, keep_k=None, chunk_size=8)
    cut = retrieve(models, caption_image, config, keep_k=3, chunk_size=8)
    for name in full:
        for direction in ("t2i", "i2t"):
            assert np.array_equal(full[name][direction].ranks, cut[name][direction].ranks)
            assert torch.equal(full[name][direction].ids[:, :3], cut[name][direction].ids)
