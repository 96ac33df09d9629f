"""Distractor rows from clip-retrieval dumps (== loading every shard, permuting and normalising), the near-duplicate
filter (== brute force), and the store that keeps each model's maxima (rebuilt when damaged)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.app import cache_cli
from fusebench.config.gallery import GalleryConfig
from fusebench.data.distractor_items import seeded_order
from fusebench.encoders import duplicate_scan as near_duplicates
from fusebench.encoders import vector_dumps
from fusebench.encoders.distractors import ArrayRows, normalised
from fusebench.encoders.duplicate_scan import distractor_max_cosine, near_duplicate_drops, stored_max_cosine
from fusebench.encoders.vector_dumps import VectorDumpRows, dump_ids, dump_rows
from fusebench.runtime import state
from fusebench.stores.near_duplicates import NearDuplicateStore

pq = pytest.importorskip("pyarrow.parquet")
import pyarrow as pa  # noqa: E402 - after the skip: the gallery extra


def write_dump(folder: Path, shards: list[np.ndarray], ids: list[list[str]] | None = None, column: str = "key",
               width: int = 1) -> Path:
    """A clip-retrieval inference output: img_emb/img_emb_{i}.npy and row-aligned metadata/metadata_{i}.parquet."""
    (folder / "img_emb").mkdir(parents=True, exist_ok=True)
    (folder / "metadata").mkdir(parents=True, exist_ok=True)
    start = 0
    for i, rows in enumerate(shards):
        name = str(i).zfill(width)
        np.save(folder / "img_emb" / f"img_emb_{name}.npy", rows)
        keys = ids[i] if ids is not None else [f"{start + r:09d}" for r in range(len(rows))]
        columns = {"image_path": [f"/imgs/{k}.jpg" for k in keys], "caption": ["c"] * len(keys), column: keys}
        pq.write_table(pa.table(columns), folder / "metadata" / f"metadata_{name}.parquet")
        start += len(rows)
    return folder


def random_rows(rng, n, dim=12, dtype=np.float16):
    return rng.standard_normal((n, dim)).astype(dtype)


@pytest.fixture
def dump(tmp_path):
    rng = np.random.default_rng(5)
    shards = [random_rows(rng, 50), random_rows(rng, 1), random_rows(rng, 70)]
    return write_dump(tmp_path / "dump", shards, width=2), np.concatenate(shards)


def reference(all_rows: np.ndarray, seed: int, size: int) -> np.ndarray:
    """The slow obvious way: every row loaded, permuted, the first ``size`` normalised."""
    return normalised(all_rows[seeded_order(len(all_rows), seed)[:size]])


def _short_preadv(preadv):
    return lambda fd, buffers, offset: preadv(fd, [buffers[0][:10]], offset)  # a system call reading less than asked


@pytest.mark.parametrize("reads", ["preadv", "pread", "short"])  # systems without os.preadv read and copy
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_dump_rows_equal_every_row_loaded_permuted_and_normalised(tmp_path, monkeypatch, reads, dtype):
    rng = np.random.default_rng(1)
    shards = [random_rows(rng, n, 9, dtype) for n in (40, 3, 77)]
    folder = write_dump(tmp_path / "d", shards)
    if reads == "pread":
        monkeypatch.delattr(vector_dumps.os, "preadv", raising=False)
    elif reads == "short":
        monkeypatch.setattr(vector_dumps.os, "preadv", _short_preadv(vector_dumps.os.preadv))
    rows = VectorDumpRows(str(folder), 100, "m", seed=7)
    expected = reference(np.concatenate(shards), 7, 100)
    assert rows.n == 100 and rows.dim == 9
    for start, stop in [(0, 100), (0, 1), (5, 17), (97, 100), (10, 10), (33, 90)]:
        got = rows.read(start, stop)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        assert np.array_equal(got, expected[start:stop])


def test_dump_galleries_nest_and_ids_follow_the_rows(dump):
    folder, all_rows = dump
    whole = VectorDumpRows(str(folder), 121, "m", seed=2)
    for size in (1, 30, 120):
        part = VectorDumpRows(str(folder), size, "m", seed=2)
        assert np.array_equal(part.read(0, size), whole.read(0, size))
        assert dump_ids(str(folder), 2, size) == dump_ids(str(folder), 2)[:size]
    ids = dump_ids(str(folder), 2, 121)
    assert ids == [f"{i:09d}" for i in seeded_order(121, 2)]


def test_a_second_dump_in_another_row_order_gives_the_rows_of_the_same_ids(tmp_path, dump):
    folder, all_rows = dump
    other_rows = (all_rows.astype(np.float32) * 3).astype(np.float16)  # another model: other values, same images
    shuffle = np.random.default_rng(0).permutation(len(all_rows))
    ids = [f"{i:09d}" for i in shuffle]
    other = write_dump(tmp_path / "other", [other_rows[shuffle[:60]], other_rows[shuffle[60:]]], [ids[:60], ids[60:]])
    config = GalleryConfig(kind="vectors", size=80, seed=4, vectors={"a": str(folder), "b": str(other)})
    rows, gallery_ids, source, costs = dump_rows(config, ["a", "b"], ["img1"])
    order = seeded_order(len(all_rows), 4)[:80]
    assert gallery_ids == [f"{i:09d}" for i in order]
    assert np.array_equal(rows["a"].read(0, 80), normalised(all_rows[order]))
    assert np.array_equal(rows["b"].read(0, 80), normalised(other_rows[order]))
    assert source["id_column"] == "key" and source["available"] == 121
    assert costs == {"a": {"stored_dtype": "float16", "value_bytes": 2}, "b": {"stored_dtype": "float16", "value_bytes": 2}}
    assert rows["a"].key != rows["b"].key
    every = VectorDumpRows(str(folder), 121, "a", seed=0)  # the seed's order holds runs of consecutive rows too
    assert np.array_equal(every.read(0, 121), reference(all_rows, 0, 121))


def test_dump_sources_refuse_overlap_size_and_missing_models(dump, tmp_path):
    folder, _ = dump
    config = GalleryConfig(kind="vectors", size=122, vectors={"a": str(folder)})
    with pytest.raises(FusebenchError, match=r"gallery\.size=122 but gallery\.vectors\.a=.* holds 121 distractor images"):
        dump_rows(config, ["a"], [])
    config = GalleryConfig(kind="vectors", size=121, vectors={"a": str(folder)})
    with pytest.raises(FusebenchError, match=r"have the id of a test image \(first: '000000007'\)"):
        dump_rows(config, ["a"], ["000000007"])
    with pytest.raises(FusebenchError, match=r"no dump for model\(s\) b: give gallery\.vectors\.b="):
        dump_rows(config, ["a", "b"], [])
    partial = write_dump(tmp_path / "partial", [np.ones((3, 12), np.float16)], [["000000000", "x", "y"]])
    config = GalleryConfig(kind="vectors", size=121, vectors={"a": str(folder), "b": str(partial)})
    with pytest.raises(FusebenchError, match=r"gallery\.vectors\.b=.*: 120 of the gallery's 121 distractors are not in"):
        dump_rows(config, ["a", "b"], [])


def _dump_with(tmp_path, damage: str) -> Path:
    rng = np.random.default_rng(0)
    shards = [random_rows(rng, 5), random_rows(rng, 4)]
    folder = write_dump(tmp_path / "bad", shards)
    meta = folder / "metadata"
    if damage == "rows":
        pq.write_table(pa.table({"key": ["a", "b", "c"]}), meta / "metadata_1.parquet")
    elif damage == "dim":
        np.save(folder / "img_emb" / "img_emb_1.npy", random_rows(rng, 4, dim=10))
    elif damage == "dtype":
        np.save(folder / "img_emb" / "img_emb_0.npy", rng.standard_normal((5, 12)))
    elif damage == "no_metadata":
        (meta / "metadata_1.parquet").unlink()
    elif damage == "no_id":
        pq.write_table(pa.table({"caption": ["c"] * 5}), meta / "metadata_0.parquet")
    elif damage == "duplicate":
        pq.write_table(pa.table({"key": ["a", "b", "c", "d"]}), meta / "metadata_1.parquet")
        pq.write_table(pa.table({"key": ["x", "y", "c", "z", "w"]}), meta / "metadata_0.parquet")
    elif damage == "truncated":
        path = folder / "img_emb" / "img_emb_1.npy"
        path.write_bytes(path.read_bytes()[:-5])
    return folder


@pytest.mark.parametrize("damage, message", [
    ("rows", r"shard 1: img_emb_1\.npy has 4 rows but metadata_1\.parquet has 3"),
    ("dim", r"img_emb_1\.npy holds float16 rows of dimension 10 but img_emb_0\.npy float16 of dimension 12"),
    ("dtype", r"img_emb_0\.npy holds a float64 array .* must be 2-D float16 or float32"),
    ("no_metadata", r"img_emb_1\.npy has no metadata file .*metadata_1\.parquet"),
    ("no_id", r"metadata_0\.parquet has no column 'key' or 'image_path' or 'url' \(its columns: caption\)"),
    ("duplicate", r"metadata_1\.parquet row 2: duplicate id 'c' \(also gallery\.vectors\.m: metadata_0\.parquet row 2\)"),
    ("truncated", r"img_emb_1\.npy is cut short"),
])
def test_bad_dumps_are_one_line_errors(tmp_path, damage, message):
    folder = _dump_with(tmp_path, damage)
    with pytest.raises(FusebenchError, match=message) as err:
        VectorDumpRows(str(folder), 9, "m").dump.ids()
    assert "\n" not in str(err.value) and str(err.value).startswith("gallery.vectors.m")


@pytest.mark.parametrize("bad, what", [(0.0, "all zeros"), (np.nan, "not finite"), (np.inf, "not finite")])
def test_zero_or_non_finite_rows_are_named(tmp_path, bad, what):
    rows = np.ones((6, 4), np.float16)
    rows[3] = bad if bad == 0.0 else rows[3]
    if bad != 0.0:
        rows[3, 1] = bad
    folder = write_dump(tmp_path / "d", [np.ones((2, 4), np.float16), rows])
    dumped = VectorDumpRows(str(folder), 8, "m", seed=0)
    position = int(np.flatnonzero(seeded_order(8, 0) == 5)[0])
    assert np.isfinite(dumped.read(0, position)).all()
    with pytest.raises(FusebenchError, match=rf"img_emb_1\.npy row 3 \(dump row 5, id '000000005'\) is {what}"):
        dumped.read(0, 8)


@pytest.mark.parametrize("folder, message", [("nowhere", "no such folder"), ("dump/img_emb", "is the img_emb folder"),
                                             ("empty", r"no img_emb/img_emb_\*\.npy")])
def test_wrong_dump_folders_are_named(tmp_path, dump, folder, message):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FusebenchError, match=message):
        VectorDumpRows(str(tmp_path / folder), 1, "m")


def test_dumps_without_pyarrow_name_the_extra(dump, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(FusebenchError, match=r"metadata is parquet, which needs pyarrow: pip install 'fusebench\[gallery\]'"):
        VectorDumpRows(str(dump[0]), 3, "m")


def test_dump_key_changes_with_the_files_and_the_rows_taken(dump):
    folder, _ = dump
    key = VectorDumpRows(str(folder), 10, "m", seed=1).key
    assert VectorDumpRows(str(folder), 10, "m", seed=1).key == key
    assert VectorDumpRows(str(folder), 11, "m", seed=1).key != key
    assert VectorDumpRows(str(folder), 10, "m", seed=2).key != key
    meta = folder / "metadata" / "metadata_01.parquet"
    pq.write_table(pa.table({"key": ["000000050-other"], "image_path": ["p"]}), meta)  # same rows, other id
    assert VectorDumpRows(str(folder), 10, "m", seed=1).key != key
    assert json.dumps(key)  # JSON-able, as store keys need


# --- near duplicates ----------------------------------------------------------------------------------------------

def _case(seed=0, n_test=23, n=57, dim=16):
    rng = np.random.default_rng(seed)
    test = normalised(rng.standard_normal((n_test, dim)))
    raw = rng.standard_normal((n, dim))
    raw[[3, 40]] = test[[5, 0]] + 0.01 * rng.standard_normal((2, dim))  # near-copies of two test images
    return test, ArrayRows(raw, "case")


@pytest.mark.parametrize("item_chunk, tile_entries", [(1, 1 << 24), (7, 20), (57, 57 * 4), (1000, 1 << 24)])
def test_max_cosine_equals_brute_force(monkeypatch, item_chunk, tile_entries):
    monkeypatch.setattr(near_duplicates, "TILE_ENTRIES", tile_entries)  # several test blocks per tile
    test, rows = _case()
    got = distractor_max_cosine(test, rows, item_chunk, "cpu")
    expected = (rows.rows.astype(np.float64) @ test.astype(np.float64).T).max(axis=1)
    assert got.dtype == np.float32 and got.shape == (57,)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)
    assert got[3] > 0.99 and got[40] > 0.99


def test_unreadable_test_images_are_left_out():
    test, rows = _case()
    with_nan = test.copy()
    with_nan[5] = np.nan  # a test image the model could not read
    got = distractor_max_cosine(with_nan, rows, 8, "cpu")
    np.testing.assert_array_equal(got, distractor_max_cosine(np.delete(test, 5, axis=0), rows, 8, "cpu"))
    assert np.isfinite(got).all() and got[3] < 0.99


def test_drops_above_the_threshold_under_any_model():
    a = np.array([0.2, 0.96, 0.95, 0.10], np.float32)
    b = np.array([0.97, 0.30, 0.90, 0.95], np.float32)
    assert near_duplicate_drops([a, b], 0.95).tolist() == [True, True, False, False]  # strictly above
    assert near_duplicate_drops({"a": a}, 0.95).tolist() == [False, True, False, False]
    assert near_duplicate_drops([a, b], None).tolist() == [False] * 4
    with pytest.raises(ValueError, match="all of one length"):
        near_duplicate_drops([a, b[:3]], 0.9)


def _entry(tmp_path) -> Path:
    (entry,) = NearDuplicateStore(tmp_path).entries()
    return Path(entry["path"])


def _truncate(folder):
    data = (folder / "max_cosine.npy").read_bytes()
    (folder / "max_cosine.npy").write_bytes(data[:-4])


def _flip(folder):
    data = bytearray((folder / "max_cosine.npy").read_bytes())
    data[-2] ^= 0x10
    (folder / "max_cosine.npy").write_bytes(bytes(data))


def _other_key(folder):
    meta = json.loads((folder / "meta.json").read_text())
    meta["key"] = "0" * 64
    (folder / "meta.json").write_text(json.dumps(meta))


def _no_meta(folder):
    (folder / "meta.json").unlink()  # killed before meta.json: never read


@pytest.mark.parametrize("damage", [_truncate, _flip, _other_key, _no_meta])
def test_stored_maxima_are_reused_and_rebuilt_when_damaged(tmp_path, monkeypatch, caplog, damage):
    state.start()
    test, rows = _case()
    calls = []
    compute = near_duplicates.distractor_max_cosine
    monkeypatch.setattr(near_duplicates, "distractor_max_cosine", lambda *a: calls.append(1) or compute(*a))
    first = stored_max_cosine(test, rows, "m", 16, "cpu", str(tmp_path))
    again = stored_max_cosine(test, rows, "m", 16, "cpu", str(tmp_path))
    assert len(calls) == 1 and np.array_equal(first, again)
    np.testing.assert_array_equal(first, compute(test, rows, 16, "cpu"))
    damage(_entry(tmp_path))
    rebuilt = stored_max_cosine(test, rows, "m", 16, "cpu", str(tmp_path))
    assert len(calls) == 2 and np.array_equal(rebuilt, first)
    if damage is not _no_meta:
        assert "near-duplicate store entry" in caplog.text and "corrupt or outdated" in caplog.text
    stored_max_cosine(test, rows, "m", 16, "cpu", str(tmp_path))
    assert len(calls) == 2  # whole again
    stored_max_cosine(test, rows, "other model", 16, "cpu", str(tmp_path))
    stored_max_cosine(test[:-1], rows, "m", 16, "cpu", str(tmp_path))
    assert len(calls) == 4 and len(NearDuplicateStore(tmp_path).entries()) == 3


def test_fusebench_cache_lists_and_removes_near_duplicate_entries(tmp_path, capsys):
    test, rows = _case()
    stored_max_cosine(test, rows, "m", 16, "cpu", str(tmp_path))
    assert cache_cli.main(["list", "--dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "dedup" in listed and " m " in listed and "complete" in listed
    key = NearDuplicateStore(tmp_path).entries()[0]["key"]
    assert cache_cli.main(["remove", key[:8], "--dir", str(tmp_path)]) == 0
    assert NearDuplicateStore(tmp_path).entries() == []
