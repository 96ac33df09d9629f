import numpy as np
import pytest
from helpers.corpora import write_manifest

from fusebench import FusebenchError
from fusebench.data import load_corpus
from fusebench.data.manifest import load_manifest
from fusebench.data.sim import caption_counts, make_sim_corpus, sim_latents
from fusebench.schema import SimDatasetSchema


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
])
def test_manifest_errors_name_file_and_line(tmp_path, lines, fragment):
    path = write_manifest(tmp_path / "m.jsonl", lines)
    with pytest.raises(FusebenchError, match=fragment):
        load_manifest(path)


def test_missing_manifest_file(tmp_path):
    with pytest.raises(FusebenchError, match="manifest file not found"):
        load_manifest(tmp_path / "nope.jsonl")
    with pytest.raises(FusebenchError, match="dataset.manifest is not set"):
        load_corpus({"kind": "manifest", "name": "m", "manifest": None, "image_root": None})
    with pytest.raises(FusebenchError, match="valid: karpathy, manifest, sim, tiny"):
        load_corpus({"kind": "coco"})


def test_sim_corpus_is_coco_sized_by_default_and_seeded():
    assert caption_counts(5000, 25010).sum() == 25010
    assert (caption_counts(5000, 25010) == 6).sum() == 10
    small = make_sim_corpus(SimDatasetSchema(n_images=50, n_captions=260, seed=3))
    again = make_sim_corpus(SimDatasetSchema(n_images=50, n_captions=260, seed=3))
    assert small.n_images == 50 and small.n_captions == 260 and small.meta["simulated"] is True
    images, captions = sim_latents(small)
    assert np.array_equal(images, sim_latents(again)[0]) and np.array_equal(captions, sim_latents(again)[1])
    assert not np.array_equal(images, sim_latents(make_sim_corpus(SimDatasetSchema(n_images=50, n_captions=260, seed=4)))[0])
