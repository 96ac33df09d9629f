"""The queries ``search.target_recall`` tunes an index on are never reported on (fusebench.app.index_tuning): the
dataset's other split (a sim corpus's val draw: the same world and models, fresh images and captions; Karpathy's
val), or test images held out of every reported metric where there is no other split, with their number in the
record; a split that cannot be had is one line naming what is valid."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers.corpora import mini_coco, write_manifest

from fusebench import FusebenchError
from fusebench.app import index_tuning
from fusebench.app.pipeline import run
from fusebench.data import other_split, tuning_split
from fusebench.data.kinds.karpathy import KarpathyDatasetConfig
from fusebench.data.kinds.manifest import ManifestDatasetConfig
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import (
    make_sim_corpus,
    model_projection,
    model_rng,
    sim_latents,
    sim_model_embeddings,
    topic_world,
)

SMALL = ["dataset.n_images=300", "dataset.n_captions=900", "eval.bootstrap.draws=200", "plots=false", "logger=none",
         "fusion.top_k=20", "eval.lists.depth=20", "search=faiss_ivf_flat", "search.nlist=8",
         "search.target_recall=0.9"]


@pytest.mark.parametrize("structure", ["isotropic", "clustered"])
def test_a_sim_val_split_is_a_fresh_draw_of_the_same_world_seen_by_the_same_models(structure):
    test = make_sim_corpus(SimDatasetConfig(n_images=200, n_captions=1000, structure=structure))
    val = make_sim_corpus(SimDatasetConfig(n_images=200, n_captions=1000, structure=structure, split="val"))
    assert "sim_split" not in test.meta and val.meta["sim_split"] == "val"  # a test corpus's digest as before
    assert test.content_digest() != val.content_digest() and set(test.image_ids).isdisjoint(val.image_ids)
    test_images, test_captions = sim_latents(test)
    val_images, val_captions = sim_latents(val)
    assert not np.allclose(test_images, val_images) and not np.allclose(test_captions, val_captions)
    if structure == "clustered":  # the same topic centres
        for a, b in zip(topic_world(test), topic_world(val)):
            np.testing.assert_array_equal(a, b)
    # the same model: its projection (noise 0 leaves the projection alone; the clustered placement adds 2 dims)
    proj = model_projection(model_rng(0, 7), 48, val_images.shape[1])
    image, text = sim_model_embeddings(val, 48, 0.0, 0.0, 7)
    np.testing.assert_allclose(image[:, :48] / np.linalg.norm(image[:, :48], axis=1, keepdims=True),
                               _unit(val_images @ proj), atol=1e-5)
    np.testing.assert_allclose(text[:, :48] / np.linalg.norm(text[:, :48], axis=1, keepdims=True),
                               _unit(val_captions @ proj), atol=1e-5)
    # and its own noise on the val rows (not the test rows' noise again)
    noisy_test, _ = sim_model_embeddings(test, 48, 0.5, 0.5, 7)
    noisy_val, _ = sim_model_embeddings(val, 48, 0.5, 0.5, 7)
    test_noise = noisy_test[:, :48] - sim_model_embeddings(test, 48, 0.0, 0.0, 7)[0][:, :48]
    val_noise = noisy_val[:, :48] - image[:, :48]
    assert abs(np.corrcoef(test_noise.ravel(), val_noise.ravel())[0, 1]) < 0.05


def _unit(rows):
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_tuning_split_of_each_dataset_kind(tmp_path):
    sim = SimDatasetConfig(n_images=1000, n_captions=5010)
    corpus = tuning_split(sim, 200, 1)
    assert (corpus.n_images, corpus.n_captions, corpus.meta["sim_split"]) == (200, 1002, "val")
    assert tuning_split(replace(sim, split="val"), 50, 1).meta.get("sim_split") is None  # a val run tunes on test
    coco = mini_coco(tmp_path / "coco", n_test=3)
    karpathy = KarpathyDatasetConfig(name="coco5k", annotations=str(coco), image_root=str(tmp_path / "coco"),
                                     expected={})
    assert other_split(karpathy) == "val"
    val = tuning_split(karpathy, 10, 1)  # the two val images of mini_coco, never a test image
    assert val.n_images == 2 and val.n_captions == 10 and val.meta.get("split") == "val"
    one = tuning_split(karpathy, 1, 1)
    assert one.n_images == 1 and one.image_ids[0] in val.image_ids
    manifest = ManifestDatasetConfig(manifest=str(write_manifest(tmp_path / "m.jsonl", [])))
    assert other_split(manifest) is None and tuning_split(manifest, 10, 1) is None


def test_held_out_images_are_a_seeded_tenth_at_most(tmp_path):
    corpus = make_sim_corpus(SimDatasetConfig(n_images=1000, n_captions=3000))
    held = index_tuning.held_out_images(corpus, 200, 5)
    assert held.sum() == 100  # 10% of 1,000 is fewer than the 200 asked
    assert index_tuning.held_out_images(corpus, 40, 5).sum() == 40
    np.testing.assert_array_equal(held, index_tuning.held_out_images(corpus, 200, 5))
    assert not np.array_equal(held, index_tuning.held_out_images(corpus, 200, 6))
    tiny = make_sim_corpus(SimDatasetConfig(n_images=5, n_captions=10))
    assert index_tuning.held_out_images(tiny, 200, 5).sum() == 1  # at least one, never all
    with pytest.raises(FusebenchError, match="needs at least two test images with captions"):
        index_tuning.held_out_images(make_sim_corpus(SimDatasetConfig(n_images=1, n_captions=2)), 5, 1)


@pytest.mark.slow
def test_held_out_images_leave_every_reported_metric_and_the_record_says_how_many(compose_cfg, tmp_path):
    pytest.importorskip("faiss")
    cache = f"embed.cache.dir={tmp_path / 'cache'}"
    record = run(compose_cfg(SMALL + [cache, "search.tune_queries=held_out"]), str(tmp_path / "held"))
    assert record.dataset.meta["index_tuning_held_out_images"] == 30 and record.dataset.n_images == 270
    assert record.dataset.n_captions == 900 - 90  # their captions too, for every retriever alike
    for result in record.retrievers.values():
        assert result.t2i.n_queries == 810 and result.i2t.n_queries == 270
    target = record.search.models["sim_siglip2_like"]["t2i"].target
    assert target["queries"] == {"source": "held_out", "split": "test", "images": 30, "captions": 90}
    # the default (auto) on a sim corpus: its val split, and nothing held out
    record = run(compose_cfg(SMALL + [cache]), str(tmp_path / "auto"))
    assert record.dataset.n_images == 300 and "index_tuning_held_out_images" not in record.dataset.meta
    assert record.search.models["sim_dfn5b_like"]["i2t"].target["queries"] == {
        "source": "split", "split": "val", "images": 200, "captions": 600}


@pytest.mark.slow
def test_rows_handed_to_the_api_have_no_other_split(tmp_path):
    pytest.importorskip("faiss")
    import fusebench

    rng = np.random.default_rng(0)
    caption_image = np.repeat(np.arange(120), 3)
    models = {}
    for name in ("a", "b"):
        image = rng.standard_normal((120, 16)).astype(np.float32)
        text = (image[caption_image] + 0.5 * rng.standard_normal((360, 16))).astype(np.float32)
        models[name] = (image, text)
    overrides = ["search=faiss_ivf_flat", "search.nlist=4", "search.target_recall=0.8", "fusion.top_k=20",
                 "eval.lists.depth=20", "eval.bootstrap.draws=100", f"embed.cache.dir={tmp_path / 'cache'}"]
    result = fusebench.evaluate(models, caption_image, overrides=overrides)
    assert result.record.dataset.meta["index_tuning_held_out_images"] == 12
    with pytest.raises(FusebenchError, match=r"search.tune_queries=split asks for the queries of another split, and "
                                             r"the corpus and rows were handed to the run .*valid: "
                                             r"search.tune_queries=held_out"):
        fusebench.evaluate(models, caption_image, overrides=[*overrides, "search.tune_queries=split"])


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_split_no_model_can_embed_is_refused_naming_what_is_valid(compose_cfg, tmp_path):
    pytest.importorskip("faiss")
    image, text = tmp_path / "img.npy", tmp_path / "txt.npy"
    np.save(image, np.eye(4, dtype=np.float32))
    np.save(text, np.eye(4, dtype=np.float32)[[0, 1, 2, 3]])
    manifest = write_manifest(tmp_path / "m.jsonl", [{"image_id": f"i{i}", "captions": [f"c{i}"]} for i in range(4)])
    overrides = [f"dataset.manifest={manifest}", "dataset=manifest", "models=[]", "+models.a.kind=vectors",
                 f"+models.a.image_embeddings={image}", f"+models.a.text_embeddings={text}", "logger=none",
                 "search=faiss_ivf_flat", "search.nlist=1", "search.target_recall=0.9", "search.tune_queries=split",
                 "fusion=none", "plots=false", f"embed.cache.dir={tmp_path / 'cache'}"]
    with pytest.raises(FusebenchError, match=r"search.tune_queries=split .* a manifest dataset has one split only; "
                                             r"valid: search.tune_queries=held_out"):
        run(compose_cfg(overrides), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "metrics.json").exists()
