"""Distractor images listed from where people keep them: image folders, webdataset tar shards (img2dataset's layout)
and path lists (.parquet, .jsonl, .txt); galleries nest; every bad input is one line naming file and place."""

import io
import json
import os
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig
from fusebench.data import tar_shards
from fusebench.data.distractor_sources import distractor_items, path_list_items, webdataset_items
from fusebench.data.tar_shards import _tarfile_members, expand_braces, read_member, tar_members
from fusebench.encoders.images import BadImageError, ImageFiles, open_rgb
from fusebench.runtime import state

pq = pytest.importorskip("pyarrow.parquet")
import pyarrow as pa  # noqa: E402 - after the skip: the gallery extra


def png_bytes(seed: int, size=(7, 5)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def write_tar(path, members: dict, fmt=tarfile.GNU_FORMAT):
    """A tar of ``members`` (name -> bytes, or a TarInfo type for a directory or link), in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if isinstance(data, bytes):
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                info.type, info.linkname = data, "target.jpg"
                archive.addfile(info)
    return path


def img2dataset_shard(path, first_key: int, n: int, extra=None):
    """A shard as img2dataset writes it: KEY.jpg, KEY.txt, KEY.json per sample (here PNG bytes under .jpg)."""
    members = {}
    for key in range(first_key, first_key + n):
        members[f"{key:09d}.jpg"] = png_bytes(key)
        members[f"{key:09d}.txt"] = b"a caption"
        members[f"{key:09d}.json"] = json.dumps({"key": f"{key:09d}", "url": f"http://x/{key}"}).encode()
    return write_tar(path, {**members, **(extra or {})})


@pytest.fixture
def shards(tmp_path):
    folder = tmp_path / "shards"
    img2dataset_shard(folder / "00000.tar", 0, 6, {"000000001.seg.png": png_bytes(99)})  # a mask: not a sample's image
    img2dataset_shard(folder / "00001.tar", 10000, 5)
    return folder


def gallery(kind, source, size, seed=0):
    return GalleryConfig(kind=kind, source=str(source), size=size, seed=seed)


# --- tar headers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_tar_members_are_tarfiles_from_the_headers_alone(tmp_path, fmt):
    long = "deep/" * 12 + "a_name_longer_than_a_hundred_characters_" * 2 + ".jpg"
    members = {"a.jpg": png_bytes(1), "dir/": tarfile.DIRTYPE, "dir/b.png": b"", "link.jpg": tarfile.SYMTYPE,
               "hard.jpg": tarfile.LNKTYPE, "caf\u00e9/\u00e9t\u00e9.jpg": png_bytes(2), "c.txt": b"x" * 513,
               long: png_bytes(3)}  # ustar splits it into prefix and name, GNU writes an 'L' header, pax a 'path'
    path = write_tar(tmp_path / "t.tar", members, fmt)
    found = tar_members(str(path))
    assert found == _tarfile_members(str(path))
    assert [name for name, _, _ in found] == [n for n, d in members.items() if isinstance(d, bytes)]
    with path.open("rb") as fh:
        for name, offset, size in found:
            fh.seek(offset)
            assert fh.read(size) == members[name]


def test_damaged_or_compressed_tars_are_one_line_errors(tmp_path):
    path = write_tar(tmp_path / "t.tar", {f"{i}.jpg": png_bytes(i, (40, 30)) for i in range(3)})
    data = path.read_bytes()
    (_, start, size), (_, second, _) = tar_members(str(path))[:2]
    for name, end, message in [("cut.tar", second + 10, r"member '1\.jpg' runs past the end"),
                               ("header.tar", second - 100, r"the file ends inside a header at byte")]:
        (tmp_path / name).write_bytes(data[:end])
        with pytest.raises(FusebenchError, match=rf"{name}: not a readable uncompressed tar \({message}"):
            tar_members(str(tmp_path / name))
    garbage = tmp_path / "garbage.tar"
    first_member_end = start + -(-size // 512) * 512
    garbage.write_bytes(data[:first_member_end] + b"\x01" * 512 + data[first_member_end + 512:])
    with pytest.raises(FusebenchError, match="no tar header at byte"):
        tar_members(str(garbage))
    compressed = tmp_path / "c.tar"
    with tarfile.open(compressed, "w:gz") as archive:
        archive.add(path, "t.tar")
    with pytest.raises(FusebenchError, match=r"c\.tar: not a readable uncompressed tar .*gunzip"):
        tar_members(str(compressed))


@pytest.mark.parametrize("pattern, expected", [
    ("/d/{00000..00003}.tar", [f"/d/{i:05d}.tar" for i in range(4)]),
    ("/d/{8..11}.tar", ["/d/8.tar", "/d/9.tar", "/d/10.tar", "/d/11.tar"]),
    ("{a,b}-{1..2}", ["a-1", "a-2", "b-1", "b-2"]),
    ("x{a,b{1,2}}y", ["xay", "xb1y", "xb2y"]),
    ("{3..1}", ["3", "2", "1"]),
    ("plain.tar", ["plain.tar"]),
])
def test_brace_patterns_expand_as_webdataset_does(pattern, expected):
    assert expand_braces(pattern) == expected


@pytest.mark.parametrize("pattern", ["/d/{0..3.tar", "/d/0..3}.tar"])
def test_unbalanced_braces_are_errors(pattern):
    with pytest.raises(FusebenchError, match="brace pattern is like"):
        expand_braces(pattern)


# --- webdataset listing --------------------------------------------------------------------------------------

def test_webdataset_samples_are_listed_with_keys_and_tar_refs(shards):
    ids, refs = webdataset_items(str(shards))
    assert ids == [f"00000/{k:09d}" for k in range(6)] + [f"00001/{k:09d}" for k in range(10000, 10005)]
    assert refs[0] == f"{shards / '00000.tar'}::000000000.jpg" and refs[-1] == f"{shards / '00001.tar'}::000010004.jpg"


@pytest.mark.parametrize("form", ["glob", "brace", "folder"])
def test_every_way_of_naming_shards_lists_the_same(shards, form):
    source = {"glob": f"{shards}/*.tar", "brace": f"{shards}/{{00000..00001}}.tar", "folder": str(shards)}[form]
    assert webdataset_items(source) == webdataset_items(str(shards))


def test_one_tar_is_a_source(shards):
    ids, refs = webdataset_items(str(shards / "00001.tar"))
    assert ids[0] == "00001/000010000" and len(ids) == 5


@pytest.mark.parametrize("source, message", [
    ("{root}/shards/{{00002..00004}}.tar", r"the brace pattern matches no file \(none of its 3 names exists"),
    ("{root}/shards/{{00000..00002}}.tar", r"1 of the pattern's 3 shards do not exist \(first: .*00002\.tar\)"),
    ("{root}/shards/*.tgz", "the glob matches no file"),
    ("{root}/empty", "the folder holds no .tar file"),
    ("{root}/nothing", "no such file or folder"),
    ("{root}/shards/00000.tar.txt", "not a .tar"),
])
def test_bad_webdataset_sources_are_one_line_errors(shards, tmp_path, source, message):
    (tmp_path / "empty").mkdir()
    (shards / "00000.tar.txt").write_text("x")
    with pytest.raises(FusebenchError, match=message) as err:
        webdataset_items(source.format(root=tmp_path))
    assert "\n" not in str(err.value) and "gallery.source=" in str(err.value)


def test_a_sample_with_two_images_is_a_duplicate_naming_both(tmp_path):
    write_tar(tmp_path / "s" / "00000.tar", {"k1.jpg": png_bytes(1), "k1.png": png_bytes(2)})
    with pytest.raises(FusebenchError, match=r"00000\.tar::k1\.png: duplicate id '00000/k1' \(also .*00000\.tar::k1\.jpg\)"):
        webdataset_items(str(tmp_path / "s"))


def test_tar_members_open_to_the_files_pixels(shards, tmp_path):
    ids, refs = webdataset_items(str(shards))
    for ref, key in [(refs[0], 0), (refs[7], 10001), (refs[3], 3)]:
        (tmp_path / "one.png").write_bytes(png_bytes(key))
        assert np.array_equal(np.asarray(open_rgb(ref)), np.asarray(Image.open(tmp_path / "one.png").convert("RGB")))


def test_a_missing_member_is_a_bad_image_naming_tar_and_member(shards):
    ref = f"{shards / '00000.tar'}::000000099.jpg"
    with pytest.raises(FileNotFoundError, match=r"tar .*00000\.tar has no image member '000000099\.jpg'"):
        open_rgb(ref)
    row, error = ImageFiles([ref], np.array([0]), lambda image: image, "fail")[0]
    assert isinstance(error, BadImageError) and "00000.tar" in str(error) and "000000099.jpg" in str(error)


@pytest.mark.parametrize("data", [b"not an image at all", png_bytes(1)[:40]])  # garbage, a truncated PNG
def test_a_corrupt_member_is_a_bad_image_naming_tar_and_member(tmp_path, data):
    """PIL named an in-memory member '<_io.BytesIO object at 0x...>': the message names TAR::MEMBER."""
    tar = write_tar(tmp_path / "bad.tar", {"000000001.jpg": data})
    ref = f"{tar}::000000001.jpg"
    with pytest.raises(Exception) as err:
        open_rgb(ref)
    assert "BytesIO" not in str(err.value)
    row, error = ImageFiles([ref], np.array([0]), lambda image: image, "fail")[0]
    assert isinstance(error, BadImageError) and "BytesIO" not in str(error) and "\n" not in str(error)
    assert f"({ref}) cannot be read" in str(error)
    if data.startswith(b"not"):
        assert f"cannot identify image file {ref!r}" in str(error)


def test_open_tars_are_bounded_and_a_replaced_tar_is_read_again(tmp_path, monkeypatch):
    state.start()
    monkeypatch.setattr(tar_shards, "OPEN_TARS", 2)
    tars = [write_tar(tmp_path / f"{i}.tar", {"a.jpg": png_bytes(i), "b.jpg": png_bytes(10 + i)}) for i in range(3)]
    for _ in range(2):
        for i, tar in enumerate(tars):
            assert read_member(f"{tar}::b.jpg") == png_bytes(10 + i)
            assert sum(entry.file is not None for entry in state.current().tars.values()) <= 2
    write_tar(tars[0], {"b.jpg": png_bytes(77), "c.jpg": png_bytes(78)})  # rewritten: tar 0 is not open now
    assert read_member(f"{tars[0]}::c.jpg") == png_bytes(78)
    with pytest.raises(FileNotFoundError, match="has no image member 'a.jpg'"):
        read_member(f"{tars[0]}::a.jpg")


# --- path lists ------------------------------------------------------------------------------------------------

def _table(path, columns: dict):
    pq.write_table(pa.table(columns), path)
    return path


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "parquet", "parquet_image_path"])
def test_path_lists_resolve_relative_paths_and_read_ids(tmp_path, fmt):
    paths = ["imgs/a.jpg", "/abs/b.jpg", "c.png"]
    if fmt == "txt":
        source = tmp_path / "list.txt"
        source.write_text("\n".join([paths[0], "", *paths[1:]]) + "\n")
        expected_ids = paths
    elif fmt == "jsonl":
        source = tmp_path / "list.jsonl"
        source.write_text("\n".join(json.dumps({"path": p, "id": f"i{n}"}) for n, p in enumerate(paths)) + "\n\n")
        expected_ids = ["i0", "i1", "i2"]
    elif fmt == "parquet":
        source = _table(tmp_path / "list.parquet", {"path": paths, "id": [7, 8, 9]})
        expected_ids = ["7", "8", "9"]
    else:
        source = _table(tmp_path / "list.parquet", {"image_path": paths, "key": ["k0", "k1", "k2"], "url": ["u"] * 3})
        expected_ids = ["k0", "k1", "k2"]
    ids, refs = path_list_items(str(source))
    assert ids == expected_ids
    assert refs == [str(tmp_path / "imgs/a.jpg"), "/abs/b.jpg", str(tmp_path / "c.png")]


@pytest.mark.parametrize("name, content, message", [
    ("l.csv", "a.jpg\n", r"a path list must end in \.parquet, \.jsonl, \.txt \(got '\.csv'\)"),
    ("missing.txt", None, "file not found"),
    ("l.txt", "a.jpg\nb.jpg\na.jpg\n", r"l\.txt:3: duplicate id 'a\.jpg' \(also .*l\.txt:1\)"),
    ("l.jsonl", '{"path": "a.jpg"}\n{"path": "b.jpg", oops}\n', r"l\.jsonl:2: not valid JSON \(.* at column \d+\)"),
    ("l.jsonl", '{"file": "a.jpg"}\n', r"l\.jsonl:1: expected an object with a 'path' \(or 'image_path'\) key"),
    ("l.jsonl", '{"path": 5}\n', r"l\.jsonl:1: 'path' must be a non-empty string"),
    ("l.jsonl", '{"path": "a.jpg", "id": "x"}\n{"path": "b.jpg", "id": "x"}\n', r"l\.jsonl:2: duplicate id 'x' \(also .*:1\)"),
])
def test_bad_path_lists_are_one_line_errors(tmp_path, name, content, message):
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(FusebenchError, match=message) as err:
        path_list_items(str(tmp_path / name))
    assert "\n" not in str(err.value)


def test_bad_parquet_lists_name_file_row_and_columns(tmp_path):
    source = _table(tmp_path / "l.parquet", {"file": ["a.jpg"], "id": ["1"]})
    with pytest.raises(FusebenchError, match=r"l\.parquet: no column 'path' or 'image_path' \(its columns: file, id\)"):
        path_list_items(str(source))
    source = _table(tmp_path / "n.parquet", {"path": ["a.jpg", None]})
    with pytest.raises(FusebenchError, match=r"n\.parquet row 2 column 'path': 'path' must be a non-empty string"):
        path_list_items(str(source))
    source = _table(tmp_path / "d.parquet", {"path": ["a.jpg", "b.jpg"], "key": ["k", "k"]})
    with pytest.raises(FusebenchError, match=r"d\.parquet row 2: duplicate id 'k' \(also .*d\.parquet row 1\)"):
        path_list_items(str(source))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(FusebenchError, match=r"bad\.parquet: not a readable parquet file"):
        path_list_items(str(tmp_path / "bad.parquet"))


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    source = _table(tmp_path / "l.parquet", {"path": ["a.jpg"]})
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(FusebenchError, match=r"needs pyarrow: pip install 'fusebench\[gallery\]'"):
        path_list_items(str(source))


# --- the gallery's items ------------------------------------------------------------------------------------------

def _sources(tmp_path, shards) -> dict:
    folder = tmp_path / "folder"
    for i in range(11):
        folder.joinpath(f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (folder / f"d{i % 3}" / f"{i}.png").write_bytes(png_bytes(i))
    paths = [f"p/{i}.jpg" for i in range(11)]
    (tmp_path / "l.txt").write_text("\n".join(paths))
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps({"path": p, "id": f"j{i}"}) for i, p in enumerate(paths)))
    _table(tmp_path / "l.parquet", {"path": paths})
    return {"folder": ("folder", folder), "webdataset": ("webdataset", shards), "txt": ("paths", tmp_path / "l.txt"),
            "jsonl": ("paths", tmp_path / "l.jsonl"), "parquet": ("paths", tmp_path / "l.parquet")}


@pytest.mark.parametrize("fmt", ["folder", "webdataset", "txt", "jsonl", "parquet"])
def test_galleries_nest_for_every_format(tmp_path, shards, fmt):
    kind, source = _sources(tmp_path, shards)[fmt]
    whole = distractor_items(gallery(kind, source, 11, seed=3), [])
    assert sorted(whole.ids) == sorted(set(whole.ids)) and len(whole) == 11
    for small in (1, 4, 10):
        part = distractor_items(gallery(kind, source, small, seed=3), [])
        assert part.ids == whole.ids[:small] and part.refs == whole.refs[:small]
    other = distractor_items(gallery(kind, source, 11, seed=4), [])
    assert other.ids != whole.ids and sorted(other.ids) == sorted(whole.ids)  # another seed: another order


def test_size_beyond_the_source_and_test_ids_are_refused(tmp_path, shards):
    with pytest.raises(FusebenchError, match=r"gallery\.size=12 but gallery\.source=.* holds 11 distractor images"):
        distractor_items(gallery("webdataset", shards, 12), [])
    with pytest.raises(FusebenchError, match=r"1 distractor\(s\) have the id of a test image \(first: '00001/000010002'\)"):
        distractor_items(gallery("webdataset", shards, 11), ["00001/000010002", "391895"])


@pytest.mark.parametrize("kind, content", [("paths", "\n\n"), ("folder", None)])
def test_an_empty_source_is_refused(tmp_path, kind, content):
    source = tmp_path / ("l.txt" if content is not None else "empty")
    if content is None:
        source.mkdir()
    else:
        source.write_text(content)
    with pytest.raises(FusebenchError, match=f"holds no distractor images: gallery={kind} reads"):
        distractor_items(gallery(kind, source, 1), [])


def test_listing_a_tar_never_reads_member_data(tmp_path, monkeypatch):
    path = img2dataset_shard(tmp_path / "00000.tar", 0, 50)
    reads = []
    original = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: reads.append(n) or original(fd, n, at))
    members = tar_members(str(path))
    assert len(members) == 150 and set(reads) == {512}  # one header block per member, nothing else


@pytest.mark.slow  # DataLoader worker processes
def test_dataloader_workers_read_tar_members_after_the_parent_did(shards):
    from fusebench.encoders.images import image_batches

    ids, refs = webdataset_items(str(shards))
    open_rgb(refs[0])  # the parent holds an open tar and its index: forked workers inherit both
    rows = np.arange(len(refs))
    decoded = {}
    for _rows, good, batch in image_batches(refs, rows, torch_pixels, 3, 2, False, "fail"):
        decoded.update(zip(good, batch))
    for row, key in ((0, 0), (8, 10002), (10, 10004)):
        assert np.array_equal(decoded[row].numpy(), np.asarray(Image.open(io.BytesIO(png_bytes(key))).convert("RGB")))
    assert sorted(decoded) == list(range(len(refs)))


def torch_pixels(image):
    import torch

    return torch.from_numpy(np.asarray(image).copy())
