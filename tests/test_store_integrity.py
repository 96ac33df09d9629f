"""Every store (embedding cache, list store, score store) reads only the entry it was asked for, and any damage
to what it wrote earlier (an entry copied over another's, a directory where a file belongs, a lock that is a
directory) is reported and rebuilt, never a dead end; ``fusebench-cache`` shows damaged entries as partial."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.lists import assert_same_lists, run_lists
from helpers.reference import integer_embeddings
from helpers.tiers import fast_first

from fusebench.app.cache_cli import main as cache_main
from fusebench.encoders.base import ModelEmbeddings
from fusebench.fusion.config import FusionConfig
from fusebench.runtime import state
from fusebench.stores.embeddings import EmbeddingCache
from fusebench.stores.entries import cache_key
from fusebench.stores.lists import ListStore
from fusebench.stores.scores import ScoreStore

A = {"kind": "image", "model": {"backend": "integrity", "name": "a"}, "images": "abc"}
B = {**A, "model": {"backend": "integrity", "name": "b"}}


def rows_of(rows, offset=0.0, calls=None):
    """A fake encoder: row r -> [r + offset, r + offset + 1, ...], in batches of 3."""
    for start in range(0, len(rows), 3):
        part = rows[start:start + 3]
        if calls is not None:
            calls.extend(part.tolist())
        yield np.stack([np.arange(4, dtype=np.float32) + r + offset for r in part]), {"seen": len(part)}


def copy_over(source: Path, target: Path) -> None:
    """Replace the entry folder ``target`` with a copy of ``source`` (checksums valid, meta.json naming source)."""
    shutil.rmtree(target)
    shutil.copytree(source, target)


def make_dir(path: Path) -> None:
    """Replace the file at ``path`` (if any) by a directory holding a file."""
    if path.is_file():
        path.unlink()
    path.mkdir(parents=True)
    (path / "junk").write_text("x")


# ---------------------------------------------------------------- embedding cache


def test_embedding_entry_copied_under_another_key_is_rebuilt(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    a = cache.get_or_compute(A, 10, rows_of)
    b = cache.get_or_compute(B, 10, lambda r: rows_of(r, offset=100))
    copy_over(cache.entry_dir(a.key), cache.entry_dir(b.key))
    state.start()
    calls = []
    with caplog.at_level("WARNING"):
        again = cache.get_or_compute(B, 10, lambda r: rows_of(r, offset=100, calls=calls))
    assert not again.hit and calls == list(range(10)) and np.array_equal(again.embeddings, b.embeddings)
    assert "copied from another entry" in caplog.text
    assert cache.get_or_compute(B, 10, lambda r: rows_of(r, offset=100)).hit
    assert cache.get_or_compute(A, 10, rows_of).hit  # the other entry is untouched


def test_embedding_meta_with_this_key_but_other_inputs_is_rebuilt(tmp_path, caplog):
    """meta.json names this entry's key but records another entry's inputs (edited, or half-copied)."""
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    a = cache.get_or_compute(A, 10, rows_of)
    b = cache.get_or_compute(B, 10, lambda r: rows_of(r, offset=100))
    copy_over(cache.entry_dir(a.key), cache.entry_dir(b.key))
    meta_path = cache.entry_dir(b.key) / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "key": b.key}))
    with caplog.at_level("WARNING"):
        again = cache.get_or_compute(B, 10, lambda r: rows_of(r, offset=100))
    assert not again.hit and np.array_equal(again.embeddings, b.embeddings)
    assert "inputs other than this entry's" in caplog.text


def _partial(cache: EmbeddingCache, material: dict, offset: float = 0.0) -> Path:
    """An entry killed after its first two chunks (rows 0-7 of 10)."""
    def dies(rows):
        for i, item in enumerate(rows_of(rows, offset)):
            if i == 3:
                raise KeyboardInterrupt
            yield item

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute(material, 10, dies)
    return cache.entry_dir(cache_key({**material, "store_dtype": cache.dtype, "n_rows": 10}))


def test_chunks_copied_from_another_unfinished_entry_are_recomputed(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    a_folder, b_folder = _partial(cache, A), _partial(cache, B, offset=100)
    copy_over(a_folder, b_folder)
    calls = []
    with caplog.at_level("WARNING"):
        result = cache.get_or_compute(B, 10, lambda r: rows_of(r, offset=100, calls=calls))
    assert calls == list(range(10)) and "written for entry" in caplog.text
    assert np.array_equal(result.embeddings[:, 0], np.arange(10) + 100)


@pytest.mark.parametrize("name", ["meta.json", "embeddings.npy"])
def test_embedding_file_made_a_directory_is_reported_and_rebuilt(tmp_path, caplog, name):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    first = cache.get_or_compute(A, 10, rows_of)
    make_dir(cache.entry_dir(first.key) / name)
    with caplog.at_level("WARNING"):
        again = cache.get_or_compute(A, 10, rows_of)
    assert not again.hit and np.array_equal(again.embeddings, first.embeddings)
    assert f"{name} is a directory" in caplog.text
    assert cache.get_or_compute(A, 10, rows_of).hit  # rebuilt whole: the next run reads it


@pytest.mark.parametrize("name", ["chunk-000001.npz", "chunk-000002.npz", "embeddings.npy", "meta.json"])
def test_directory_in_an_unfinished_entry_is_cleared_and_the_entry_finishes(tmp_path, caplog, name):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    folder = _partial(cache, A)
    make_dir(folder / name)
    with caplog.at_level("WARNING"):
        result = cache.get_or_compute(A, 10, rows_of)
    assert f"{name} is a directory" in caplog.text
    assert np.array_equal(result.embeddings[:, 0], np.arange(10))
    assert cache.get_or_compute(A, 10, rows_of).hit


def test_embedding_entry_made_a_file_is_rebuilt(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    first = cache.get_or_compute(A, 10, rows_of)
    folder = cache.entry_dir(first.key)
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    with caplog.at_level("WARNING"):
        assert not cache.get_or_compute(A, 10, rows_of).hit
    assert "not a folder" in caplog.text and cache.get_or_compute(A, 10, rows_of).hit


def test_embedding_lock_made_a_directory_is_cleared(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    first = cache.get_or_compute(A, 10, rows_of)
    make_dir(Path(str(cache.entry_dir(first.key)) + ".lock"))
    with caplog.at_level("WARNING"):
        again = cache.get_or_compute(A, 10, rows_of)
    assert again.hit and np.array_equal(again.embeddings, first.embeddings) and ".lock is a directory" in caplog.text
    # a lock that is a directory before the entry was ever computed
    lock = Path(str(cache.entry_dir(cache_key({**B, "store_dtype": "fp32", "n_rows": 10}))) + ".lock")
    make_dir(lock)
    assert not cache.get_or_compute(B, 10, rows_of).hit and lock.is_file()


# ---------------------------------------------------------------- list store and score store


@pytest.fixture(scope="module")
def twins():
    """Two models of one shape over one corpus: their entries are interchangeable but for their key."""
    rng = np.random.default_rng(11)
    caption_image = np.repeat(np.arange(30), rng.integers(1, 3, size=30))
    models = [ModelEmbeddings(name, integer_embeddings(rng, 30), integer_embeddings(rng, len(caption_image)))
              for name in "ab"]
    return models, caption_image


LISTS = FusionConfig(method="rrf", top_k=8)
DENSE = FusionConfig(method="dbsf", fuse_on="source_object", top_k=None)
ORDERS = FusionConfig(method="rrf", fuse_on="source_object", top_k=None)


def _entries(store) -> dict[str, Path]:
    return {e["model"]: Path(e["path"]) for e in store.entries()}


def test_list_entry_copied_under_another_models_key_is_rebuilt(twins, tmp_path, caplog):
    models, caption_image = twins
    cold, _, _ = run_lists(models, caption_image, LISTS, None)
    run_lists(models, caption_image, LISTS, str(tmp_path))
    entries = _entries(ListStore(tmp_path))
    copy_over(entries["a"], entries["b"])
    state.start()
    with caplog.at_level("WARNING"):
        again, records, _ = run_lists(models, caption_image, LISTS, str(tmp_path))
    assert records["a"]["hit"] and not records["b"]["hit"] and "copied from another entry" in caplog.text
    assert_same_lists(cold, again)
    _, records, blocks = run_lists(models, caption_image, LISTS, str(tmp_path))
    assert all(r["hit"] for r in records.values()) and blocks == 0


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("what", fast_first(["ab", "ba"]))
def test_score_entry_copied_under_another_models_key_is_rebuilt(twins, tmp_path, caplog, what):
    models, caption_image = twins
    source, target = what
    cold, _, _ = run_lists(models, caption_image, DENSE, None, keep_k=10)
    run_lists(models, caption_image, DENSE, str(tmp_path), keep_k=10)
    entries = _entries(ScoreStore(tmp_path))
    copy_over(entries[source], entries[target])
    state.start()
    with caplog.at_level("WARNING"):
        again, records, _ = run_lists(models, caption_image, DENSE, str(tmp_path), keep_k=10)
    assert records[source]["scores"]["hit"] and not records[target]["scores"]["hit"]
    assert "copied from another entry" in caplog.text
    assert_same_lists(cold, again)


@pytest.mark.parametrize("name", ["lists.npz", "meta.json"])
def test_list_file_made_a_directory_is_reported_and_rebuilt(twins, tmp_path, caplog, name):
    models, caption_image = twins
    first, _, _ = run_lists(models[:1], caption_image, LISTS, str(tmp_path))
    make_dir(_entries(ListStore(tmp_path))["a"] / name)
    with caplog.at_level("WARNING"):
        again, records, _ = run_lists(models[:1], caption_image, LISTS, str(tmp_path))
    assert not records["a"]["hit"] and f"{name} is a directory" in caplog.text
    assert_same_lists(first, again)
    assert run_lists(models[:1], caption_image, LISTS, str(tmp_path))[1]["a"]["hit"]


def test_list_entry_made_a_file_is_rebuilt(twins, tmp_path, caplog):
    models, caption_image = twins
    run_lists(models[:1], caption_image, LISTS, str(tmp_path))
    folder = _entries(ListStore(tmp_path))["a"]
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    with caplog.at_level("WARNING"):
        assert not run_lists(models[:1], caption_image, LISTS, str(tmp_path))[1]["a"]["hit"]
    assert "not a folder" in caplog.text
    assert run_lists(models[:1], caption_image, LISTS, str(tmp_path))[1]["a"]["hit"]  # stored again


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("config,name", fast_first([(ORDERS, "t2i_order.npy"), (ORDERS, "i2t_order.npy"),
                                                    (DENSE, "i2t_moments_ddof0.npy"), (DENSE, "t2i.npy"),
                                                    (DENSE, "meta.json")], unpack=True))
def test_score_file_made_a_directory_is_reported_and_rebuilt(twins, tmp_path, caplog, config, name):
    models, caption_image = twins
    first, _, _ = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    entry = _entries(ScoreStore(tmp_path))["a"]
    assert (entry / name).is_file()
    make_dir(entry / name)
    state.start()
    with caplog.at_level("WARNING"):
        again, _, _ = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    assert f"{name} is a directory" in caplog.text
    assert_same_lists(first, again)
    assert (entry / name).is_file()
    caplog.clear()
    state.start()
    third, records, blocks = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    assert records["a"]["scores"]["hit"] and blocks == 0 and "WARNING" not in caplog.text  # whole again
    assert_same_lists(first, third)


@pytest.mark.parametrize("store,config", fast_first([(ListStore, LISTS), (ScoreStore, ORDERS)], unpack=True))
def test_store_lock_made_a_directory_is_cleared(twins, tmp_path, caplog, store, config):
    models, caption_image = twins
    first, _, _ = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    lock = Path(str(_entries(store(tmp_path))["a"]) + ".lock")
    make_dir(lock)
    with caplog.at_level("WARNING"):
        again, _, blocks = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    assert blocks == 0 and ".lock is a directory" in caplog.text and lock.is_file()
    assert_same_lists(first, again)
    assert len(store(tmp_path).entries()) == 2  # the lock is not listed as an entry


# ---------------------------------------------------------------- fusebench-cache list


def _listing(tmp_path, capsys, *flags: str) -> dict[str, str]:
    """The state column of ``fusebench-cache list``, by key prefix."""
    assert cache_main(["--dir", str(tmp_path), "list", *flags]) == 0
    lines = capsys.readouterr().out.splitlines()[1:-1]
    return {line.split()[0]: line.split("  ")[-1].strip() for line in lines}


def _six_entries(twins, tmp_path):
    """Two embedding entries, and each model's score and list entries: the cache, the embedding keys, and the
    score and list entries by model."""
    models, caption_image = twins
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    keys = {"emb": cache.get_or_compute(A, 10, rows_of).key, "emb_b": cache.get_or_compute(B, 10, rows_of).key}
    run_lists(models, caption_image, ORDERS, str(tmp_path), keep_k=10)
    run_lists(models, caption_image, LISTS, str(tmp_path))
    return cache, keys, _entries(ScoreStore(tmp_path)), _entries(ListStore(tmp_path))


def test_list_shows_damaged_entries_as_partial(twins, tmp_path, capsys):
    cache, keys, scores, lists = _six_entries(twins, tmp_path)
    state = _listing(tmp_path, capsys)
    assert len(state) == 6 and set(state.values()) == {"complete"}
    data = cache.entry_dir(keys["emb"]) / "embeddings.npy"
    size = data.stat().st_size
    data.write_bytes(data.read_bytes()[:-7])  # truncated
    make_dir(scores["a"] / "t2i.npy")
    make_dir(scores["b"] / "i2t_order.npy")  # a side file
    (lists["a"] / "lists.npz").unlink()
    copy_over(lists["a"], lists["b"])  # another entry's meta.json
    make_dir(Path(str(cache.entry_dir(keys["emb_b"])) + ".lock"))  # a lock: not an entry, not damage to one
    state = _listing(tmp_path, capsys)
    assert len(state) == 6
    assert state[keys["emb"][:12]] == f"partial (damaged: embeddings.npy has {size - 7} bytes, expected {size} (truncated?))"
    assert state[scores["a"].name[:12]] == "partial (damaged: t2i.npy is a directory)"
    assert state[scores["b"].name[:12]] == "partial (damaged: i2t_order.npy is a directory)"
    assert state[lists["a"].name[:12]] == "partial (damaged: lists.npz is missing)"
    assert state[lists["b"].name[:12]].startswith("partial (damaged: meta.json records key ")
    assert state[keys["emb_b"][:12]] == "complete"


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # the same size: only the checksum tells
    path.write_bytes(bytes(data))


def test_list_verifies_checksums_so_a_flipped_bit_is_never_complete(twins, tmp_path, capsys):
    """A bit flipped in place (size unchanged) was listed as complete; a run would find it and rebuild. The list
    reads every checksum as a run does; --quick skips them and says its 'complete' is from sizes alone."""
    cache, keys, scores, lists = _six_entries(twins, tmp_path)
    _flip_a_bit(cache.entry_dir(keys["emb"]) / "embeddings.npy")
    _flip_a_bit(lists["a"] / "lists.npz")
    _flip_a_bit(scores["b"] / "t2i.npy")
    state = _listing(tmp_path, capsys)
    assert state[keys["emb"][:12]] == "partial (damaged: embeddings.npy does not match its recorded checksum)"
    assert state[lists["a"].name[:12]] == "partial (damaged: lists.npz does not match its recorded checksum)"
    assert state[scores["b"].name[:12]] == "partial (damaged: t2i.npy does not match its recorded checksum)"
    assert [state[k] for k in (keys["emb_b"][:12], lists["b"].name[:12], scores["a"].name[:12])] == ["complete"] * 3
    quick = _listing(tmp_path, capsys, "--quick")
    assert quick[keys["emb"][:12]] == "complete (sizes)" and set(quick.values()) == {"complete (sizes)"}
    # what the list calls damaged, a read rebuilds: the same verdict, and the entry is complete again after
    assert cache.get_or_compute(A, 10, rows_of).hit is False
    assert _listing(tmp_path, capsys)[keys["emb"][:12]] == "complete"


# ---------------------------------------------------------------- fusebench-cache: folder and key prefixes


@pytest.mark.parametrize("command", [["list"], ["remove", "abcdef"], ["clear", "--yes"]])
@pytest.mark.parametrize("kind", ["missing", "file"])
def test_cache_dir_that_is_not_a_folder_is_an_error(tmp_path, capsys, command, kind):
    target = tmp_path / "nowhere"
    if kind == "file":
        target.write_text("a file")
    assert cache_main(["--dir", str(target), *command]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("fusebench-cache: error: ")
    assert str(target) in captured.err and len(captured.err.strip().splitlines()) == 1


def _colliding_materials() -> tuple[dict, dict]:
    """Two embedding-cache materials whose keys (10 fp32 rows) share their first 4 characters."""
    seen = {}
    for i in range(100_000):
        material = {**A, "i": i}
        prefix = cache_key({**material, "store_dtype": "fp32", "n_rows": 10})[:4]
        if prefix in seen:
            return seen[prefix], material
        seen[prefix] = material
    raise AssertionError("no two keys share 4 characters")


def test_ambiguous_key_prefix_is_refused_unless_all(tmp_path, capsys):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    first, second = (cache.get_or_compute(m, 10, rows_of).key for m in _colliding_materials())
    third = cache.get_or_compute(B, 10, rows_of).key
    prefix = first[:4]
    assert second.startswith(prefix)
    assert cache_main(["--dir", str(tmp_path), "remove", prefix]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fusebench-cache: error: '{prefix}' matches 2 entries") and first in err and second in err
    assert len(cache.entries()) == 3  # nothing removed
    assert cache_main(["--dir", str(tmp_path), "remove", third[:8], prefix]) == 2  # refused before any removal
    assert len(cache.entries()) == 3
    assert cache_main(["--dir", str(tmp_path), "remove", first[:12]]) == 0  # unambiguous
    assert [e["key"] for e in cache.entries()] == sorted([second, third], key=lambda k: (k[:2], k))
    cache.get_or_compute(_colliding_materials()[0], 10, rows_of)
    assert cache_main(["--dir", str(tmp_path), "remove", "--all", prefix]) == 0
    out = capsys.readouterr().out
    assert f"removed {first}" in out and f"removed {second}" in out
    assert [e["key"] for e in cache.entries()] == [third]


def test_help_documents_remove_all(capsys):
    for argv in (["--help"], ["remove", "--help"]):
        with pytest.raises(SystemExit) as done:
            cache_main(argv)
        assert done.value.code == 0 and "--all" in capsys.readouterr().out


# ---------------------------------------------------------------- a file where a store's folder belongs


def _file_at(path: Path, kind: str) -> None:
    """Replace the folder at ``path`` by a file, or by a link to nowhere."""
    shutil.rmtree(path)
    if kind == "file":
        path.write_text("junk")
    else:
        path.symlink_to(path.parent / "nowhere")


@pytest.mark.parametrize("kind", ["file", "link"])
def test_embedding_shard_folder_made_a_file_is_reported_and_cleared(tmp_path, caplog, kind):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    first = cache.get_or_compute(A, 10, rows_of)
    shard = cache.entry_dir(first.key).parent
    _file_at(shard, kind)
    with caplog.at_level("WARNING"):
        again = cache.get_or_compute(A, 10, rows_of)
    assert not again.hit and np.array_equal(again.embeddings, first.embeddings)
    assert f"embedding cache: {shard} is a" in caplog.text and "not a folder; removing it" in caplog.text
    assert shard.is_dir() and cache.get_or_compute(A, 10, rows_of).hit


@pytest.mark.parametrize("store,config,label", fast_first([(ListStore, LISTS, "list store"),
                                                          (ScoreStore, DENSE, "score store")], unpack=True))
@pytest.mark.parametrize("level", fast_first(["shard", "store"]))
def test_store_folder_made_a_file_is_reported_and_cleared(twins, tmp_path, caplog, store, config, label, level):
    """CACHE/lists/ab (or CACHE/scores/ab), or CACHE/lists itself, a file: reported, removed, rebuilt."""
    models, caption_image = twins
    first, _, _ = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    entry = _entries(store(tmp_path))["a"]
    folder = entry.parent if level == "shard" else entry.parent.parent
    _file_at(folder, "file")
    with caplog.at_level("WARNING"):
        again, _, blocks = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    assert blocks > 0 and f"{label}: {folder} is a file, not a folder; removing it" in caplog.text
    assert_same_lists(first, again)
    assert entry.is_dir()
    _, _, blocks = run_lists(models, caption_image, config, str(tmp_path), keep_k=10)
    assert blocks == 0  # stored again


@pytest.mark.parametrize("store", ["embeddings", "lists", "scores"])
def test_cache_root_that_is_a_file_is_an_error_and_kept(tmp_path, store):
    """The cache root is the user's embed.cache.dir: a file there is never removed (ENOTDIR: the run's one-line
    error naming embed.cache.dir)."""
    root = tmp_path / "cache"
    root.write_text("the user's file")
    never = pytest.fail  # nothing is computed
    with pytest.raises(NotADirectoryError):
        if store == "embeddings":
            EmbeddingCache(root, dtype="fp32", chunk_rows=4).get_or_compute(A, 10, never)
        elif store == "lists":
            ListStore(root).get_or_compute({"kind": "lists"}, 5, 3, 3, never)
        else:
            ScoreStore(root).get_or_compute({"kind": "scores"}, {}, never, np.zeros(0), 1 << 20)
    assert root.read_text() == "the user's file"


# ---------------------------------------------------------------- fusebench-cache: entries made files, --dir "", key case


@pytest.mark.parametrize("kind", ["file", "link"])
def test_list_shows_an_entry_made_a_file_and_remove_clears_it(twins, tmp_path, capsys, kind):
    models, caption_image = twins
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    emb = cache.entry_dir(cache.get_or_compute(A, 10, rows_of).key)
    run_lists(models, caption_image, LISTS, str(tmp_path))
    lists = _entries(ListStore(tmp_path))
    _file_at(lists["a"], kind)
    _file_at(emb, kind)
    (emb.parent / "notes.txt").write_text("not an entry")  # a stray file of another name: not an entry
    state = _listing(tmp_path, capsys)
    what = "a file" if kind == "file" else "a link to nowhere"
    assert len(state) == 3 and state[lists["b"].name[:12]] == "complete"
    for path in (lists["a"], emb):
        assert state[path.name[:12]] == f"partial (damaged: the entry is {what}, not a folder)"
    assert cache_main(["--dir", str(tmp_path), "remove", lists["a"].name[:8]]) == 0
    assert not os.path.lexists(lists["a"]) and lists["b"].is_dir()
    assert cache_main(["--dir", str(tmp_path), "clear", "--yes"]) == 0
    assert not os.path.lexists(emb) and (emb.parent / "notes.txt").is_file()
    capsys.readouterr()
    assert _listing(tmp_path, capsys) == {}


@pytest.mark.parametrize("command", [["list"], ["remove", "abcdef"], ["clear", "--yes"]])
@pytest.mark.parametrize("where", ["before", "after", "equals", "blank"])
def test_an_empty_cache_dir_is_an_error_not_the_default(tmp_path, capsys, monkeypatch, command, where):
    """``--dir "$UNSET"``: exit 2, one line; the default cache is not touched (clear must not clear it)."""
    default = tmp_path / "default"
    key = EmbeddingCache(default, dtype="fp32", chunk_rows=4).get_or_compute(A, 10, rows_of).key
    monkeypatch.setattr("fusebench.app.cache_cli.default_cache_dir", lambda: str(default))
    given = {"before": ["--dir", "", *command], "after": [*command, "--dir", ""], "equals": ["--dir=", *command],
             "blank": ["--dir", "  ", *command]}[where]
    assert cache_main(given) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("fusebench-cache: error: --dir is empty")
    assert len(captured.err.strip().splitlines()) == 1
    assert [e["key"] for e in EmbeddingCache(default).entries()] == [key]


def test_key_prefixes_are_case_insensitive(tmp_path, capsys):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    a, b = cache.get_or_compute(A, 10, rows_of).key, cache.get_or_compute(B, 10, rows_of).key
    prefix = a[:10].upper()
    assert prefix != a[:10]  # A's key has a letter among its first 10 characters
    assert cache_main(["--dir", str(tmp_path), "remove", prefix]) == 0
    assert capsys.readouterr().out.strip() == f"removed {a}"
    assert [e["key"] for e in cache.entries()] == [b]


def test_damaged_entry_message_tells_keys_that_differ_at_the_end_apart(tmp_path, capsys):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    key = cache.get_or_compute(A, 10, rows_of).key
    other = key[:-1] + ("0" if key[-1] != "0" else "1")  # another key, alike but for its last character
    meta_path = cache.entry_dir(key) / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "key": other}))
    state = _listing(tmp_path, capsys)[key[:12]]
    assert state == f"partial (damaged: meta.json records key {other}, not this entry's {key} (copied from another entry?))"
    differ = "0" if key[20] != "0" else "1"  # alike for 20 characters: 21 of each are shown
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "key": key[:20] + differ * 44}))
    state = _listing(tmp_path, capsys)[key[:12]]
    assert f"records key {key[:20]}{differ}..., not this entry's {key[:21]}..." in state


@pytest.mark.slow  # a race, tried 20,000 times
def test_a_lock_file_created_meanwhile_is_never_taken_for_damage(tmp_path):
    """What is at a store's lock path is judged from one stat: while another thread creates and removes the file,
    it is a file or missing, never "neither a file nor a directory" (which the stores remove: a lock another thread
    held was once deleted that way, and two threads computed one cache entry at once)."""
    import os
    import threading

    from fusebench.stores.files import path_kind

    lock = tmp_path / "entry.lock"
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            lock.touch()
            lock.unlink(missing_ok=True)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        seen = {path_kind(lock) for _ in range(20000)}
    finally:
        stop.set()
        worker.join()
    assert seen <= {"a file", "missing"}
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert path_kind(tmp_path / "a") == "a link to nowhere"  # a loop of links
    (tmp_path / "f").write_text("x")
    assert path_kind(tmp_path / "f" / "below") == "missing"
    assert path_kind(tmp_path / "dangling") == "missing"
