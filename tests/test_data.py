import numpy as np
import pytest
from helpers.corpora import write_manifest

from fusebench import FusebenchError
from fusebench.config.run import dataset_config
from fusebench.data import load_corpus
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.manifest import load_manifest
from fusebench.data.simulated import caption_counts, make_sim_corpus, sim_latents


def test_manifest_loads_in_order_with_distractors(tmp_path):
    path = write_manifest(tmp_path / "m.jsonl", [
        {"image_id": "a", "path": "a.jpg", "captions": ["a dog", "a brown dog"]},
        {"image_id": 7, "captions": []},
        "",
        {"image_id": "c", "captions": ["a cat"]},
    ])
    corpus = load_manifest(path)
    assert corpus.image_ids == ["a", "7", "c"]
    assert corpus.image_paths == [str(tmp_path / "a.jpg"), None, None]
    assert corpus.captions == ["a dog", "a brown dog", "a cat"]
    assert corpus.caption_image.tolist() == [0, 0, 2]
    assert corpus.i2t_query_images.tolist() == [0, 2]
    assert corpus.summary()["n_images_without_captions"] == 1


@pytest.mark.parametrize("lines,fragment", [
    (['{"image_id": "a", "captions": ["x"]}', '{"image_id": "b", "captions": ["y"'], r"m\.jsonl:2: not valid JSON"),
    (['{"image_id": "a", "captions": "a dog"}'], r"m\.jsonl:1: 'captions' must be a list of strings"),
    (['{"image_id": "a", "captions": ["ok", 3]}'], r"m\.jsonl:1: 'captions' must be a list of strings"),
    (['{"image_id": "a", "captions": []}', '{"image_id": "a", "captions": []}'],
     r"m\.jsonl:2: duplicate image_id 'a' \(first seen on line 1\)"),
    (['{"captions": ["x"]}'], r"m\.jsonl:1: missing key 'image_id'"),
    (['["a", "b"]'], r"m\.jsonl:1: expected a JSON object"),
    (['{"image_id": "a", "path": 3}'], r"m\.jsonl:1: 'path' must be a string"),
    ([], r"the manifest is empty"),
    (['{"image_id": "a", "captions": []}'], r"no captions"),
    (['{"image_id": 1, "captions": ["x", "y"], "caption_ids": [5]}'], r"m\.jsonl:1: 'caption_ids' must be a list of integers"),
    (['{"image_id": 1, "captions": ["x"], "caption_ids": ["5"]}'], r"m\.jsonl:1: 'caption_ids' must be a list of integers"),
    (['{"image_id": 1, "captions": ["x"], "caption_ids": [5]}', '{"image_id": 2, "captions": ["y"]}'],
     r"m\.jsonl:2: no 'caption_ids', but line 1 has them"),
    (['{"image_id": 1, "captions": ["x"], "caption_ids": [5]}', '{"image_id": 2, "captions": ["y"], "caption_ids": [5]}'],
     r"duplicate caption id 5"),
])
def test_manifest_errors_name_file_and_line(tmp_path, lines, fragment):
    path = write_manifest(tmp_path / "m.jsonl", lines)
    with pytest.raises(FusebenchError, match=fragment):
        load_manifest(path)


def test_manifest_caption_ids_follow_the_captions(tmp_path):
    path = write_manifest(tmp_path / "m.jsonl", ['{"image_id": 10, "captions": ["a", "b"], "caption_ids": [7, 3]}',
                                                 '{"image_id": 11, "captions": []}',
                                                 '{"image_id": 12, "captions": ["c"], "caption_ids": [9]}'])
    corpus = load_manifest(path)
    assert corpus.caption_ids == [7, 3, 9] and corpus.image_ids == ["10", "11", "12"]
    smaller, _, _ = corpus.without_images([True, False, False])
    assert smaller.caption_ids == [9]


def test_missing_manifest_file(tmp_path):
    with pytest.raises(FusebenchError, match="manifest file not found"):
        load_manifest(tmp_path / "nope.jsonl")
    with pytest.raises(FusebenchError, match="dataset.manifest is not set"):
        dataset_config({"kind": "manifest", "name": "m", "manifest": None, "image_root": None})
    with pytest.raises(FusebenchError, match="valid: hf, karpathy, manifest, sim, tiny"):
        dataset_config({"kind": "coco"})
    with pytest.raises(FusebenchError, match="dataset: unknown key.s. manifets; valid keys: image_root, kind, manifest, name"):
        dataset_config({"kind": "manifest", "name": "m", "manifets": "x.jsonl", "manifest": "m.jsonl", "image_root": None})
    with pytest.raises(FusebenchError, match="dataset.image_root is missing"):
        dataset_config({"kind": "manifest", "name": "m", "manifest": "m.jsonl"})
    path = tmp_path / "m.jsonl"
    path.write_text('{"image_id": "a", "captions": ["c"]}\n')
    assert load_corpus(dataset_config({"kind": "manifest", "name": "m", "manifest": str(path),
                                       "image_root": None})).image_ids == ["a"]


def test_sim_corpus_is_coco_sized_by_default_and_seeded():
    assert caption_counts(5000, 25010).sum() == 25010
    assert (caption_counts(5000, 25010) == 6).sum() == 10
    small = make_sim_corpus(SimDatasetConfig(n_images=50, n_captions=260, seed=3))
    again = make_sim_corpus(SimDatasetConfig(n_images=50, n_captions=260, seed=3))
    assert small.n_images == 50 and small.n_captions == 260 and small.meta["simulated"] is True
    images, captions = sim_latents(small)
    assert np.array_equal(images, sim_latents(again)[0]) and np.array_equal(captions, sim_latents(again)[1])
    assert not np.array_equal(images, sim_latents(make_sim_corpus(SimDatasetConfig(n_images=50, n_captions=260, seed=4)))[0])


def test_score_location_is_an_exact_affine_map_that_keeps_every_ranking():
    from fusebench.data.simulated import with_score_location

    rng = np.random.default_rng(5)
    image, text = rng.standard_normal((60, 8)), rng.standard_normal((40, 8))
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    cos = unit(text) @ unit(image).T
    for scale, shift in ((0.3, 0.0), (0.4, 0.12), (0.5, -0.5), (1.0, 0.0)):
        new_image, new_text = with_score_location(image, text, scale, shift)
        assert np.allclose(np.linalg.norm(new_image, axis=1), 1, atol=1e-6)  # still unit rows: cosine = dot
        moved = new_text @ new_image.T
        assert np.allclose(moved, scale * cos + shift, atol=1e-6)
        assert np.array_equal(np.argsort(-moved, axis=1, kind="stable")[:, :10], np.argsort(-cos, axis=1, kind="stable")[:, :10])
    with pytest.raises(FusebenchError, match="score_scale"):
        with_score_location(image, text, 0.3, 0.8)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_sim_families_sit_where_real_ones_do_and_raw_sum_follows_the_wider_model(compose_cfg, tmp_path):
    """SigLIP-like cosines sit low (matched ~0.14, unmatched ~0), CLIP-like higher (~0.30 / ~0.12) and wider; so
    raw-score sum leans toward the CLIP-like model's ranking, while DBSF (per-list normalised) does not."""
    import torch

    from fusebench.encoders.models import embed
    from fusebench.fusion.combine import fuse
    from fusebench.fusion.config import FusionConfig

    corpus = make_sim_corpus(SimDatasetConfig(n_images=400, n_captions=2000))
    cfg = compose_cfg(["models=[sim_siglip2_like,sim_dfn5b_like]"])
    models = {n: embed(n, dict(cfg.models[n]), corpus) for n in cfg.models}
    matched, top = {}, {}
    for name, m in models.items():
        sims = m.text @ m.image.T
        matched[name] = float(sims[np.arange(len(sims)), corpus.caption_image].mean())
        top[name] = torch.topk(torch.from_numpy(sims), 50, dim=1)
        unmatched = float(np.median(sims))
        assert (name == "sim_siglip2_like") == (unmatched < 0.05)
    assert 0.1 < matched["sim_siglip2_like"] < 0.2 and 0.25 < matched["sim_dfn5b_like"] < 0.35
    ids, scores = [t.indices for t in top.values()], [t.values for t in top.values()]

    def agreement(method):
        fused = fuse(ids, scores, FusionConfig(method=method, top_k=50), 1).ids[:, 0]
        return [float((fused == i[:, 0]).float().mean()) for i in ids]

    siglip_sum, clip_sum = agreement("sum")
    siglip_dbsf, clip_dbsf = agreement("dbsf")
    assert clip_sum - siglip_sum > clip_dbsf - siglip_dbsf + 0.02  # sum is pulled toward the wider-scored model (0.031 here)
