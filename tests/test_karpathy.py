import json

import pytest
from helpers.corpora import jpeg, mini_coco, mini_flickr

from fusebench import FusebenchError
from fusebench.config.run import dataset_config
from fusebench.data import load_corpus
from fusebench.data.karpathy import load_karpathy, read_annotations


def test_coco_test_split_exact_raw_captions_and_paths(tmp_path):
    corpus = load_karpathy(mini_coco(tmp_path), tmp_path, name="coco5k")
    assert corpus.image_ids == ["1000", "1001", "1002"]
    assert corpus.n_captions == 16 and corpus.caption_image.tolist()[:7] == [0] * 6 + [1]
    assert corpus.captions[0] == "  A raw caption 0 of image 0, As Typed.  "  # untouched
    assert corpus.image_paths[1] == str(tmp_path / "val2014" / "COCO_val2014_000000000001.jpg")
    assert corpus.meta["split"] == "test" and "nonstandard" not in corpus.meta
    assert corpus.caption_ids[:7] == [700000, 700001, 700002, 700003, 700004, 700005, 700010]  # Karpathy's sentids


def test_other_splits_are_selectable_and_marked(tmp_path):
    val = load_karpathy(mini_coco(tmp_path), tmp_path, split="val", expected={"images": 2, "captions": 10})
    assert val.n_images == 2 and val.meta["nonstandard"] is True
    restval = load_karpathy(tmp_path / "dataset_coco.json", tmp_path, split="restval")
    assert restval.n_images == 1


def test_flickr_karpathy_json(tmp_path):
    corpus = load_karpathy(mini_flickr(tmp_path), tmp_path / "flickr30k-images", name="flickr1k")
    assert corpus.image_ids == ["0", "1"] and corpus.n_captions == 10
    assert corpus.captions[5] == "Person 0 in picture 1."


def test_clip_benchmark_formats(tmp_path):
    for i in range(2):
        jpeg(tmp_path / "val2014" / f"COCO_val2014_{i}.jpg")
    coco = {"images": [{"id": 7, "file_name": "COCO_val2014_0.jpg"}, {"id": 9, "file_name": "COCO_val2014_1.jpg"}],
            "annotations": [{"id": 1, "image_id": 9, "caption": "b one"}, {"id": 2, "image_id": 7, "caption": "a one"},
                            {"id": 3, "image_id": 7, "caption": "a two"}]}
    (tmp_path / "coco_test_karpathy.json").write_text(json.dumps(coco))
    corpus = load_karpathy(tmp_path / "coco_test_karpathy.json", tmp_path / "val2014")
    assert corpus.image_ids == ["7", "9"] and corpus.captions == ["a one", "a two", "b one"]
    assert corpus.caption_ids is None  # CLIP_benchmark's file: no COCO caption ids (ECCV / CxC need Karpathy's)
    for name in ("1.jpg", "2.jpg"):
        jpeg(tmp_path / "flickr" / name)
    (tmp_path / "flickr30k_test_karpathy.txt").write_text(
        "image,caption\n1.jpg,A dog, running.\n1.jpg,Another, with commas, here.\n2.jpg,Two.\n\n")
    flickr = load_karpathy(tmp_path / "flickr30k_test_karpathy.txt", tmp_path / "flickr")
    assert flickr.image_ids == ["1.jpg", "2.jpg"]
    assert flickr.captions == ["A dog, running.", "Another, with commas, here.", "Two."]


def test_protocol_guard_refuses_or_marks(tmp_path):
    path = mini_coco(tmp_path, extra_caption=False)  # 3 images, 15 captions: a "truncated" corpus
    with pytest.raises(FusebenchError, match=r"has 3 images and 15 captions; the standard coco5k has 3 and 16.*"
                                             r"allow_nonstandard=true"):
        load_karpathy(path, tmp_path, name="coco5k", expected={"images": 3, "captions": 16})
    marked = load_karpathy(path, tmp_path, name="coco5k", expected={"images": 3, "captions": 16},
                           allow_nonstandard=True)
    assert marked.meta["nonstandard"] is True and marked.summary()["nonstandard"] is True


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_config_and_paths_group(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBENCH_DATA", str(tmp_path))
    mini_coco(tmp_path / "coco")
    cfg = compose_cfg(["dataset=coco5k", "dataset.expected.images=3", "dataset.expected.captions=16"])
    assert cfg.dataset.annotations == f"{tmp_path}/coco/dataset_coco.json"
    corpus = load_corpus(dataset_config(cfg.dataset))
    assert corpus.n_images == 3 and corpus.name == "coco5k"
    with pytest.raises(FusebenchError, match="the standard coco5k has 5000 and 25010"):
        load_corpus(dataset_config(compose_cfg(["dataset=coco5k"]).dataset))
    assert compose_cfg(["dataset=flickr1k"]).dataset.expected.captions == 5000


def test_missing_images_all_reported_with_count(tmp_path):
    path = mini_coco(tmp_path)
    for i in (0, 2):
        (tmp_path / "val2014" / f"COCO_val2014_{i:012d}.jpg").unlink()
    with pytest.raises(FusebenchError) as info:
        load_karpathy(path, tmp_path)
    message = str(info.value)
    assert message.startswith("2 missing images under image root")
    assert "COCO_val2014_000000000000.jpg" in message and "COCO_val2014_000000000002.jpg" in message
    listing = message.split("listed in ")[1].split(")")[0]
    assert len(open(listing).read().split()) == 2


def test_corrupt_jpegs_reported(tmp_path):
    path = mini_coco(tmp_path)
    (tmp_path / "val2014" / "COCO_val2014_000000000001.jpg").write_bytes(b"\xff\xd8\xff garbage")
    with pytest.raises(FusebenchError, match=r"(?s)1 unreadable images .*COCO_val2014_000000000001\.jpg"):
        load_karpathy(path, tmp_path)
    assert load_karpathy(path, tmp_path, verify="none").n_images == 3


def test_wrong_image_root_detected_by_zero_matches(tmp_path):
    path = mini_coco(tmp_path)
    with pytest.raises(FusebenchError, match="(?s)none of the 3 referenced images exist.*wrong folder"):
        load_karpathy(path, tmp_path / "val2014")  # one level too deep: filepath already says val2014


@pytest.mark.parametrize("content,fragment", [
    ({"images": [{"filename": "a.jpg", "sentences": []}]}, "images\\[0\\] has no 'split' key"),
    ({"annotations": []}, "missing key 'images'"),
    ([1, 2], "missing key 'images'"),
    ({"images": [{"split": "test", "filename": "a.jpg", "sentences": [{"tokens": ["a"]}]}]}, "has no 'raw' key"),
])
def test_not_karpathy_format(tmp_path, content, fragment):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(content))
    with pytest.raises(FusebenchError, match=fragment):
        read_annotations(path)


def test_unknown_split_lists_present_ones(tmp_path):
    with pytest.raises(FusebenchError, match=r"no images in split 'tset'; splits present: restval \(1\), test \(3\), "
                                             r"train \(1\), val \(2\)"):
        load_karpathy(mini_coco(tmp_path), tmp_path, split="tset")


def test_duplicate_image_ids(tmp_path):
    path = mini_coco(tmp_path)
    data = json.loads(path.read_text())
    data["images"][1]["cocoid"] = 1000
    path.write_text(json.dumps(data))
    with pytest.raises(FusebenchError, match=r"duplicate image ids \['1000'\]"):
        load_karpathy(path, tmp_path)


def test_missing_annotation_file_and_bad_json(tmp_path):
    with pytest.raises(FusebenchError, match="annotation file not found.*prepare_data.py"):
        read_annotations(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{ nope")
    with pytest.raises(FusebenchError, match=r"bad\.json: not valid JSON"):
        read_annotations(tmp_path / "bad.json")
