import json
import threading

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.app.cache_cli import main as cache_main
from fusebench.stores.embeddings import EmbeddingCache
from fusebench.stores.entries import cache_key

MATERIAL = {"kind": "image", "model": {"backend": "test"}, "images": "abc"}


def rows_of(rows, dim=4, batch=3, calls=None, fail_after=None):
    """A fake encoder: row r -> [r, r+1, ...]; records the rows it was asked for; can die part way."""
    for start in range(0, len(rows), batch):
        if fail_after is not None and start >= fail_after:
            raise KeyboardInterrupt("killed")
        part = rows[start:start + batch]
        if calls is not None:
            calls.extend(part.tolist())
        yield np.stack([np.arange(dim, dtype=np.float32) + r for r in part]), {"skipped_images": 0, "seen": len(part)}


def test_compute_then_hit_and_key_sensitivity(tmp_path):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    calls = []
    first = cache.get_or_compute(MATERIAL, 10, lambda r: rows_of(r, calls=calls), info={"model": "m"})
    assert not first.hit and calls == list(range(10)) and first.stats == {"skipped_images": 0, "seen": 10}
    assert np.array_equal(first.embeddings[:, 0], np.arange(10))
    second = cache.get_or_compute(MATERIAL, 10, lambda r: rows_of(r, calls=calls))
    assert second.hit and calls == list(range(10)) and np.array_equal(first.embeddings, second.embeddings)
    assert second.stats == first.stats
    changed = cache.get_or_compute({**MATERIAL, "images": "abd"}, 10, lambda r: rows_of(r, calls=calls))
    assert not changed.hit and changed.key != first.key
    assert EmbeddingCache(tmp_path, dtype="fp16", chunk_rows=4).get_or_compute(MATERIAL, 10, lambda r: rows_of(r)).key != first.key


def test_key_is_stable_and_order_independent():
    assert cache_key({"a": 1, "b": [1, 2]}) == cache_key({"b": [1, 2], "a": 1})
    assert cache_key({"a": 1}) != cache_key({"a": 2})


def test_killed_run_resumes_at_last_finished_chunk(tmp_path):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    calls = []
    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute(MATERIAL, 10, lambda r: rows_of(r, batch=2, calls=calls, fail_after=6))
    assert calls == list(range(6))  # chunk 0 (rows 0-3) was saved, chunk 1 was half done
    calls.clear()
    result = cache.get_or_compute(MATERIAL, 10, lambda r: rows_of(r, batch=2, calls=calls))
    assert calls == list(range(4, 10)) and not result.hit
    assert np.array_equal(result.embeddings[:, 0], np.arange(10))
    assert not list(tmp_path.rglob("chunk-*"))


def test_corrupt_entry_is_reported_and_recomputed(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    first = cache.get_or_compute(MATERIAL, 10, rows_of)
    data = cache.entry_dir(first.key) / "embeddings.npy"
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0xFF
    data.write_bytes(bytes(raw))
    calls = []
    with caplog.at_level("WARNING"):
        again = cache.get_or_compute(MATERIAL, 10, lambda r: rows_of(r, calls=calls))
    assert "does not match its recorded checksum" in caplog.text and calls == list(range(10)) and not again.hit
    assert np.array_equal(again.embeddings, first.embeddings)
    data.write_bytes(data.read_bytes()[:100])  # truncated
    with caplog.at_level("WARNING"):
        assert not cache.get_or_compute(MATERIAL, 10, rows_of).hit
    assert "truncated" in caplog.text


def test_fp16_storage_and_meta(tmp_path):
    cache = EmbeddingCache(tmp_path, dtype="fp16", chunk_rows=8)
    result = cache.get_or_compute(MATERIAL, 5, lambda r: rows_of(r, dim=3))
    meta = json.loads((cache.entry_dir(result.key) / "meta.json").read_text())
    assert meta["dtype"] == "fp16" and meta["shape"] == [5, 3] and meta["material"]["kind"] == "image"
    assert np.load(cache.entry_dir(result.key) / "embeddings.npy").dtype == np.float16
    assert result.embeddings.dtype == np.float32


def test_two_writers_one_computation(tmp_path):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    calls, results = [], []

    def job():
        results.append(cache.get_or_compute(MATERIAL, 10, lambda r: rows_of(r, calls=calls)))

    threads = [threading.Thread(target=job) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == list(range(10))  # computed once; the others waited on the lock and read it
    assert sorted(r.hit for r in results) == [False, True, True]


def test_encoder_producing_too_few_rows_is_an_error(tmp_path):
    cache = EmbeddingCache(tmp_path, dtype="fp16", chunk_rows=4)
    with pytest.raises(RuntimeError, match="produced 2 of 4 rows"):
        cache.get_or_compute(MATERIAL, 10, lambda r: rows_of(r[:2]))


def test_bad_settings():
    with pytest.raises(FusebenchError, match="valid: fp16, fp32"):
        EmbeddingCache("x", dtype="bf16")
    with pytest.raises(FusebenchError, match="chunk_rows"):
        EmbeddingCache("x", chunk_rows=0)


def test_cache_command_lists_and_removes(tmp_path, capsys):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    a = cache.get_or_compute(MATERIAL, 10, rows_of, info={"model": "tiny_clip"})
    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute({**MATERIAL, "kind": "text"}, 10, lambda r: rows_of(r, batch=4, fail_after=4))
    assert cache_main(["--dir", str(tmp_path), "list"]) == 0
    out = capsys.readouterr().out
    assert a.key[:12] in out and "tiny_clip" in out and "10x4" in out and "partial (1 chunks)" in out
    assert "2 entries" in out
    assert cache_main(["--dir", str(tmp_path), "remove", a.key[:8]]) == 0
    assert f"removed {a.key}" in capsys.readouterr().out
    assert cache_main(["--dir", str(tmp_path), "remove", "ffff0000"]) == 1
    assert cache_main(["--dir", str(tmp_path), "clear"]) == 2
    assert cache_main(["--dir", str(tmp_path), "clear", "--yes"]) == 0
    assert cache.entries() == []


def test_the_cache_command_never_lists_nor_removes_what_fusebench_did_not_write(tmp_path, capsys):
    """A folder or file in the cache dir that is not at a key's place (``ab/abKEY``) is someone else's: never
    listed, never removed, by ``remove`` or ``clear``."""
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    ours = cache.get_or_compute(MATERIAL, 10, rows_of, info={"model": "tiny_clip"})
    theirs = [tmp_path / "zz" / "foreign" / "x.npy", tmp_path / ours.key[:2] / "notes" / "y.txt",
              tmp_path / ours.key[:2] / (("e" if ours.key[0] == "f" else "f") * 64) / "z.npy"]  # a key out of place
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not fusebench's")
    assert [e["key"] for e in cache.entries()] == [ours.key]
    assert cache_main(["--dir", str(tmp_path), "remove", "fore"]) == 1  # no entry of that name
    assert cache_main(["--dir", str(tmp_path), "clear", "--yes"]) == 0
    assert cache.entries() == [] and all(path.is_file() for path in theirs)


def with_contents(rows, batch=3):
    """A fake shard encoder: rows_of, and each row's content record [ref, digest] among the stats."""
    for block, stats in rows_of(rows, batch=batch):
        start = len(block)
        yield block, {**stats, "contents": [[f"img{r}.png", f"{r:064x}"] for r in rows[:start]]}
        rows = rows[start:]


def test_a_content_record_goes_to_its_own_file_checked_like_the_rows(tmp_path, capsys):
    """Issue 39 item 8: a shard's per-row content record is joined across chunks (a killed run's included) into
    contents.json, never into meta.json; a damaged one is listed as damage and makes a run compute the entry again."""
    from fusebench.stores.embeddings import entry_contents
    from fusebench.stores.entries import read_meta

    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    material = {**MATERIAL, "kind": "shard"}
    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute(material, 10, lambda r: rows_of(r, batch=2, fail_after=6))  # chunk 0 saved, no record
    first = cache.get_or_compute(material, 10, lambda r: with_contents(r))
    meta = read_meta(cache.entry_dir(first.key) / "meta.json")
    assert "contents" not in first.stats and "contents" not in meta["stats"]
    assert entry_contents(cache.entry_dir(first.key), meta) == (None, None)  # a chunk without a record: none at all
    cache.get_or_compute({**material, "images": "other"}, 10, lambda r: with_contents(r))
    second = cache.get_or_compute({**material, "images": "other"}, 10, lambda r: with_contents(r))
    folder = cache.entry_dir(second.key)
    record, problem = entry_contents(folder, read_meta(folder / "meta.json"))
    assert problem is None and record == [[f"img{r}.png", f"{r:064x}"] for r in range(10)]
    (folder / "contents.json").write_text(json.dumps(record[::-1]))  # same size, other bytes
    assert cache_main(["--dir", str(tmp_path), "list"]) == 0
    assert "damaged: contents.json does not match its recorded checksum" in capsys.readouterr().out
    assert cache.complete_entry({**material, "images": "other"}, 10) is None and not folder.exists()
