"""The dataset kinds' registry (data/kinds/: one module per kind) against what reads it, and the ``hf`` kind
(parquet and datasets' save_to_disk tables) against the same data read through the ``manifest`` kind."""

from __future__ import annotations

import io
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from helpers.corpora import write_manifest
from PIL import Image

from fusebench import FusebenchError
from fusebench.config.run import dataset_config
from fusebench.config.schema import DATASET_KINDS
from fusebench.data import load_corpus, other_split
from fusebench.data.kinds import DatasetKind
from fusebench.runtime.checks import config_keys

ROOT = Path(__file__).resolve().parents[1]
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
CAPTIONS = [["a red square", "red"], ["a green square"], ["a blue square", "blue", "navy"], []]


def test_every_kind_is_a_registered_module_with_its_keys():
    """One module per kind in data/kinds/, each registering one DatasetKind named as its module, whose params
    dataclass holds name and kind (defaulting to the kind's name)."""
    modules = sorted(p.stem for p in (ROOT / "src/fusebench/data/kinds").glob("*.py") if not p.stem.startswith("_"))
    assert sorted(DATASET_KINDS.names()) == modules
    for kind in DATASET_KINDS.items():
        assert isinstance(kind, DatasetKind) and kind.params.__module__ == f"fusebench.data.kinds.{kind.name}"
        defaults = {f.name: f.default for f in fields(kind.params)}
        assert defaults["kind"] == kind.name and "name" in defaults and kind.doc


def dataset_rows() -> dict[str, str]:
    """docs/config.md's table of dataset kinds: kind -> its row."""
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    section = text.split("## Dataset kinds", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_]+)` \|.*$", section, re.M)}


def test_the_docs_table_has_one_row_per_kind_naming_every_key():
    rows = dataset_rows()
    assert sorted(rows) == sorted(DATASET_KINDS.names())
    for kind in DATASET_KINDS.items():
        keys = [k for k in config_keys(kind.params) if k not in ("name", "kind")]
        missing = [k for k in keys if f"`{k}`" not in rows[kind.name]]
        assert not missing, f"docs/config.md's row for {kind.name} does not name {missing}"


def test_a_wrong_kind_lists_the_registry_and_a_kind_added_at_run_time_is_read(tmp_path):
    with pytest.raises(FusebenchError, match=f"dataset.kind='coco' is not valid; valid: {', '.join(DATASET_KINDS.names())}"):
        dataset_config({"kind": "coco"})
    from dataclasses import dataclass

    @dataclass
    class Params:
        name: str = "mine"
        kind: str = "mine_test"

    loaded = []
    DATASET_KINDS.register(DatasetKind("mine_test", Params, lambda p: loaded.append(p) or "corpus", "a test's kind"))
    try:
        params = dataset_config({"kind": "mine_test", "name": "x"})
        assert isinstance(params, Params) and load_corpus(params) == "corpus" and loaded == [params]
        assert other_split(params) is None
    finally:
        DATASET_KINDS.unregister("mine_test")


def png(colour) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (6, 4), colour).save(out, "PNG")
    return out.getvalue()


def write_images(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, colour in enumerate(COLOURS):
        paths.append(folder / f"img{i}.png")
        paths[-1].write_bytes(png(colour))
    return paths


def manifest_corpus(tmp_path, paths):
    """The same images and captions through the manifest kind (the reference)."""
    manifest = write_manifest(tmp_path / "ref.jsonl", [{"image_id": f"im{i}", "path": str(p), "captions": c}
                                                       for i, (p, c) in enumerate(zip(paths, CAPTIONS))])
    return load_corpus(dataset_config({"kind": "manifest", "name": "t", "manifest": str(manifest), "image_root": None}))


def hf(path, **changes):
    given = {"kind": "hf", "name": "t", "path": None if path is None else str(path), "split": None,
             "split_column": None, "image_column": "image", "caption_column": "caption", "id_column": "id",
             "image_root": None, "image_dir": None, **changes}
    return dataset_config(given)


def write_parquet(path: Path, columns: dict, schema=None) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns, schema=schema), path)
    return path


def same_corpus(ours, reference):
    assert ours.image_ids == reference.image_ids and ours.captions == reference.captions
    assert np.array_equal(ours.caption_image, reference.caption_image) and ours.kind == "hf"


def test_parquet_with_caption_lists_and_path_strings_equals_the_manifest(tmp_path):
    paths = write_images(tmp_path / "images")
    rows = write_parquet(tmp_path / "data.parquet", {"id": [f"im{i}" for i in range(4)],
                                                     "image": [f"images/{p.name}" for p in paths], "caption": CAPTIONS})
    ours, reference = load_corpus(hf(rows)), manifest_corpus(tmp_path, paths)
    same_corpus(ours, reference)
    assert ours.image_paths == reference.image_paths  # relative to the parquet's folder, as a manifest's are


def test_one_caption_per_row_and_image_bytes_written_once_by_content(tmp_path):
    paths = write_images(tmp_path / "images")
    ids, images, captions = [], [], []
    for i, caps in enumerate(CAPTIONS):  # one row per caption: the captionless image has no row
        for caption in caps:
            ids.append(f"im{i}")
            images.append({"bytes": png(COLOURS[i]), "path": f"img{i}.png"})
            captions.append(caption)
    rows = write_parquet(tmp_path / "rows" / "part-0.parquet", {"id": ids, "image": images, "caption": captions})
    ours = load_corpus(hf(rows.parent, image_dir=str(tmp_path / "written")))
    reference = manifest_corpus(tmp_path, paths).without_images(np.array([False, False, False, True]))[0]
    same_corpus(ours, reference)
    for path, original in zip(ours.image_paths, paths):
        assert Path(path).parent == tmp_path / "written" and Path(path).read_bytes() == original.read_bytes()
    again = load_corpus(hf(rows.parent, image_dir=str(tmp_path / "written")))
    assert again.image_paths == ours.image_paths and again.content_digest() == ours.content_digest()
    assert len(list((tmp_path / "written").iterdir())) == 3


def flickr_like(tmp_path) -> Path:
    """nlphuji/flickr30k's layout: image {bytes, path}, caption (a list), split, img_id (an integer)."""
    splits = ["test", "val", "test", "test"]
    return write_parquet(tmp_path / "flickr" / "flickr.parquet", {
        "image": [{"bytes": png(c), "path": f"{i}.jpg"} for i, c in enumerate(COLOURS)], "caption": CAPTIONS,
        "split": splits, "img_id": list(range(4))})


def test_a_split_column_chooses_the_rows(tmp_path):
    path = flickr_like(tmp_path)
    corpus = load_corpus(hf(path, split="test", split_column="split", id_column="img_id", image_dir=str(tmp_path / "w")))
    assert corpus.image_ids == ["0", "2", "3"] and corpus.captions == [*CAPTIONS[0], *CAPTIONS[2]]
    assert corpus.caption_image.tolist() == [0, 0, 1, 1, 1] and corpus.meta["split"] == "test"


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_datasets_save_to_disk_folder_equals_its_parquet(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = flickr_like(tmp_path)
    table = datasets.Dataset.from_parquet(str(path))
    datasets.DatasetDict({"test": table, "train": table}).save_to_disk(str(tmp_path / "saved"))
    table.save_to_disk(str(tmp_path / "one"))
    settings = {"id_column": "img_id", "image_dir": str(tmp_path / "w")}
    reference = load_corpus(hf(path, **settings))
    for saved in (hf(tmp_path / "saved", split="test", **settings), hf(tmp_path / "one", **settings)):
        ours = load_corpus(saved)
        same_corpus(ours, reference)
        assert ours.image_paths == reference.image_paths
    with pytest.raises(FusebenchError, match="dataset.split='val' is not a split of the DatasetDict .*valid: test, train"):
        load_corpus(hf(tmp_path / "saved", split="val", **settings))


def bad_cases(tmp_path):
    pa = pytest.importorskip("pyarrow")
    good = {"id": ["a", "b"], "image": ["x.png", "y.png"], "caption": [["one"], ["two"]]}
    out = [({"path": str(tmp_path / "nope.parquet")}, None, r"dataset.path=.*nope.parquet does not exist"),
           ({"caption_column": "captions"}, good, r"ok.parquet: no column 'captions' \(dataset.caption_column\); its "
                                                  r"columns: id, image, caption"),
           ({}, {**good, "caption": [1, 2]}, r"column 'caption' \(dataset.caption_column\) is int64; valid: a list of "
                                             r"strings per image, or one string per row"),
           ({}, {**good, "caption": [["one", None], ["two"]]}, r"row 0: a caption is null"),
           ({}, {**good, "image": [1.5, 2.5]}, r"column 'image' \(dataset.image_column\) is double; valid:"),
           ({}, {**good, "id": ["a", "a"]}, r"image id 'a' is on rows 0 and 1"),
           ({}, {**good, "caption": ["one", "two"], "id": ["a", "a"]}, r"image id 'a' .* has a different image on rows 0 and 1"),
           ({"id_column": None}, {**good, "caption": ["one", "two"]}, r"holds one caption per row; set dataset.id_column"),
           ({"split": "test", "split_column": "split"}, {**good, "split": ["train", "val"]},
            r"no rows with split = 'test' \(dataset.split\); valid: train \(1\), val \(1\)"),
           ({"split": "test"}, good, r"dataset.split='test': .* is one table; name the column"),
           ({}, {**good, "image": [b"\x89PNG...", b"\x89PNG..."]}, r"holds image bytes; set dataset.image_dir"),
           ({}, {**good, "caption": pa.array([[], []], type=pa.list_(pa.string()))}, r"ok.parquet: the corpus has no "
                                                                                  r"captions"),
           ({"split": "test", "split_column": "split"}, {**good, "split": ["test", None]},
            r"column 'split' \(dataset.split_column\), row 1: no split \(null\)")]
    mixed = tmp_path / "mixed"  # a folder whose parquet files differ: pyarrow's many-line error, in one line
    write_parquet(mixed / "a.parquet", good)
    write_parquet(mixed / "b.parquet", {"img": [1], "caption": [["one"]]})
    out.append(({"path": str(mixed)}, None, r"^dataset.path=.*mixed: its parquet files do not share one schema \([^\n]*\)\.$"))
    return out


def test_bad_input_is_one_message_naming_the_file_and_column(tmp_path):
    for i, (changes, columns, message) in enumerate(bad_cases(tmp_path)):
        path = write_parquet(tmp_path / str(i) / "ok.parquet", columns) if columns else changes.pop("path")
        with pytest.raises(FusebenchError, match=message):
            load_corpus(hf(path, **changes))
    with pytest.raises(FusebenchError, match="dataset.path is not set"):
        hf(None)
    with pytest.raises(FusebenchError, match="dataset.split_column=split needs dataset.split"):
        hf(tmp_path, split_column="split")


def test_without_datasets_a_saved_folder_names_the_extra(tmp_path, monkeypatch):
    import sys

    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(FusebenchError, match=r"needs the datasets package: pip install 'fusebench\[datasets\]'"):
        load_corpus(hf(tmp_path / "saved"))


@pytest.mark.slow  # builds and runs a real (tiny) open_clip model over the parquet's images
def test_a_whole_job_on_parquet_images_equals_the_manifest_job(compose_cfg, tmp_path):
    pytest.importorskip("open_clip")
    from helpers.tiny_models import build_open_clip

    from fusebench.app.pipeline import run

    oc = build_open_clip(tmp_path / "oc")
    paths = write_images(tmp_path / "images")
    manifest = write_manifest(tmp_path / "ref.jsonl", [{"image_id": f"im{i}", "path": str(p), "captions": c}
                                                       for i, (p, c) in enumerate(zip(paths, CAPTIONS))])
    rows = write_parquet(tmp_path / "data.parquet", {"id": [f"im{i}" for i in range(4)],
                                                     "image": [{"bytes": p.read_bytes(), "path": None} for p in paths],
                                                     "caption": CAPTIONS})
    common = ["logger=none", "plots=false", "models=[]", "+models.oc.kind=open_clip", f"+models.oc.model=local-dir:{oc}",
              "embed.num_workers=0", "eval.bootstrap.draws=20", f"embed.cache.dir={tmp_path / 'cache'}"]
    ours = run(compose_cfg([*common, "dataset=hf_example", f"dataset.path={rows}", "dataset.split=null",
                            "dataset.split_column=null", "dataset.id_column=id", f"dataset.image_dir={tmp_path / 'w'}"]),
               str(tmp_path / "hf"))
    reference = run(compose_cfg([*common, "dataset=manifest", f"dataset.manifest={manifest}"]), str(tmp_path / "m"))
    for direction in ("t2i", "i2t"):
        assert np.array_equal(np.load(tmp_path / "hf" / "ranks" / f"oc.{direction}.npy"),
                              np.load(tmp_path / "m" / "ranks" / f"oc.{direction}.npy"))
    assert ours.retrievers["oc"].t2i == reference.retrievers["oc"].t2i


def test_an_image_file_written_before_is_checked_byte_for_byte_and_rewritten_when_damaged(tmp_path):
    from fusebench.data.tables import image_file

    data = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
    path = Path(image_file(data, tmp_path))
    assert path.read_bytes() == data and path.suffix == ".png"
    damaged = bytearray(data)
    damaged[50] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(damaged))
    assert Path(image_file(data, tmp_path)) == path and path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no .part- file left
