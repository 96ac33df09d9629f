"""What a process derives from a read-only array is derived once (fusebench.app.memo), and never for an array
that could have changed: the normalised rows and store-key digests a sweep's jobs share."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

from fusebench.app import memo
from fusebench.app.pipeline import run
from fusebench.encoders.base import check_matrix
from fusebench.stores.lists import array_digest, shared_digests


@pytest.fixture(autouse=True)
def fresh_memo():
    memo.clear()
    yield
    memo.clear()


def counting(calls: list):
    def compute(array):
        calls.append(1)
        return float(array.sum())
    return compute


def test_read_only_array_is_derived_once_writable_every_time():
    calls = []
    shared = memo.read_only(np.arange(6.0))
    assert memo.derived(shared, "sum", counting(calls)) == memo.derived(shared, "sum", counting(calls)) == 15.0
    assert len(calls) == 1
    assert memo.derived(shared, "other", counting(calls)) == 15.0 and len(calls) == 2  # its own name
    writable = np.arange(6.0)
    assert memo.derived(writable, "sum", counting(calls)) == 15.0
    writable[0] = 100.0  # a writable array may change under the same object: never remembered
    assert memo.derived(writable, "sum", counting(calls)) == 115.0 and len(calls) == 4


def test_entry_goes_with_its_array_and_a_new_array_at_the_same_id_is_derived_afresh():
    calls = []
    first = memo.read_only(np.ones(4))
    memo.derived(first, "sum", counting(calls))
    address = id(first)
    del first
    gc.collect()
    assert memo._DERIVED == {}  # nothing kept for an array that is gone
    for _ in range(50):  # whichever new array lands on the old id is not mistaken for the old one
        again = memo.read_only(np.full(4, 2.0))
        assert memo.derived(again, "sum", counting(calls)) == 8.0
        if id(again) == address:
            break
        del again
    assert memo.known(np.ones(4), "sum") is None


def test_check_matrix_shares_normalised_rows_of_read_only_input_only():
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((30, 8)).astype(np.float32)
    fresh = check_matrix(raw, 30, "image embeddings", "x.npy", "images")
    assert fresh.flags.writeable and check_matrix(raw, 30, "image embeddings", "x.npy", "images") is not fresh
    shared = memo.read_only(raw.copy())
    first = check_matrix(shared, 30, "image embeddings", "x.npy", "images")
    assert check_matrix(shared, 30, "image embeddings", "x.npy", "images") is first
    assert not first.flags.writeable  # shared between jobs: nothing may change it in place
    np.testing.assert_array_equal(first, fresh)  # the same bits either way
    np.testing.assert_allclose(first, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6)


def test_shared_digests_hash_each_read_only_array_once(monkeypatch):
    import fusebench.stores.lists as list_store

    hashed = []
    monkeypatch.setattr(list_store, "array_digest", lambda a: hashed.append(a.nbytes) or array_digest(a))
    shared = [memo.read_only(np.random.default_rng(i).standard_normal((20, 4)).astype(np.float32)) for i in range(2)]
    writable = np.arange(10, dtype=np.int64)
    first = shared_digests([*shared, writable])
    assert first == [array_digest(a) for a in (*shared, writable)] and len(hashed) == 3
    assert shared_digests([*shared, writable]) == first and len(hashed) == 4  # only the writable one again


def test_jobs_of_one_process_share_sim_rows_and_keys_and_get_the_same_results(compose_cfg, tmp_path, monkeypatch):
    import fusebench.encoders.base as base
    import fusebench.stores.lists as list_store

    normalised, hashed = [], []
    real_normalise, real_digest = base.l2_normalise_rows, list_store.array_digest
    monkeypatch.setattr(base, "l2_normalise_rows", lambda a: normalised.append(a.shape) or real_normalise(a))
    monkeypatch.setattr(list_store, "array_digest", lambda a: hashed.append(a.shape) or real_digest(a))
    small = ["dataset.n_images=120", "dataset.n_captions=600", "eval.bootstrap.draws=50", "plots=false", "logger=none",
             f"embed.cache.dir={tmp_path / 'cache'}"]
    run(compose_cfg([*small, "fusion=rrf"]), str(tmp_path / "job0"))
    assert len(normalised) == 4 and len(hashed) == 5  # 2 models x (image, text); + which image each caption shows
    run(compose_cfg([*small, "fusion=dbsf"]), str(tmp_path / "job1"))
    assert len(normalised) == 4 and len(hashed) == 6  # the second job: only the (writable) caption map again
    memo.clear()
    run(compose_cfg([*small, "fusion=dbsf"]), str(tmp_path / "alone"))  # as a job of its own process would
    assert len(normalised) == 8
    for name in ("sim_siglip2_like", "sim_dfn5b_like", "fused"):
        for direction in ("t2i", "i2t"):
            shared = np.load(tmp_path / "job1" / "ranks" / f"{name}.{direction}.npy")
            np.testing.assert_array_equal(shared, np.load(tmp_path / "alone" / "ranks" / f"{name}.{direction}.npy"))
    metrics = [json.loads((tmp_path / job / "metrics.json").read_text()) for job in ("job1", "alone")]
    assert metrics[0]["retrievers"] == metrics[1]["retrievers"]


def test_cache_hits_of_one_process_share_read_only_rows_until_the_file_changes(tmp_path, monkeypatch):
    import fusebench.stores.embeddings as cache

    monkeypatch.setattr(cache, "ROWS", memo.FileReads(cache.ROWS.budget))
    rows = np.random.default_rng(3).standard_normal((50, 8)).astype(np.float32)
    store = cache.EmbeddingCache(tmp_path, "fp32", 20)
    compute = lambda idx: [(rows[idx], {})]  # noqa: E731
    cold = store.get_or_compute({"model": "m"}, 50, compute)
    first, second = (store.get_or_compute({"model": "m"}, 50, compute) for _ in range(2))
    assert first.hit and second.hit and second.embeddings is first.embeddings  # read once
    assert not first.embeddings.flags.writeable and cold.embeddings.flags.writeable
    np.testing.assert_array_equal(first.embeddings, rows)
    data = store.entry_dir(first.key) / "embeddings.npy"
    bytes_ = data.read_bytes()
    data.unlink()
    data.write_bytes(bytes_)  # the same bytes in a new file: read again, checked again
    third = store.get_or_compute({"model": "m"}, 50, compute)
    assert third.hit and third.embeddings is not first.embeddings
    np.testing.assert_array_equal(third.embeddings, rows)


def test_cached_rows_kept_in_memory_are_bounded(tmp_path, monkeypatch):
    import fusebench.stores.embeddings as cache

    monkeypatch.setattr(cache, "ROWS", memo.FileReads(2 * 50 * 8 * 4))  # two 50 x 8 float32 entries
    store = cache.EmbeddingCache(tmp_path, "fp32", 50)
    for seed in range(3):
        rows = np.random.default_rng(seed).standard_normal((50, 8)).astype(np.float32)
        store.get_or_compute({"model": seed}, 50, lambda idx, r=rows: [(r[idx], {})])
        store.get_or_compute({"model": seed}, 50, lambda idx: pytest.fail("a hit computes nothing"))
    assert len(cache.ROWS.entries) == 2 and sum(r.nbytes for r in cache.ROWS.entries.values()) <= cache.ROWS.budget


def test_list_store_hits_of_one_process_share_read_only_arrays(tmp_path, monkeypatch):
    import fusebench.stores.lists as list_store
    from fusebench.search.model_lists import compute_model_lists

    monkeypatch.setattr(list_store, "LISTS", memo.FileReads(list_store.LISTS.budget))
    rng = np.random.default_rng(5)
    caption_image = np.repeat(np.arange(30), 3)
    text, image = rng.standard_normal((90, 6)).astype(np.float32), rng.standard_normal((30, 6)).astype(np.float32)
    compute = lambda depth: compute_model_lists(text, image, caption_image, depth)  # noqa: E731
    store = list_store.ListStore(tmp_path)
    material = {"kind": "lists", "model": "m"}
    cold = store.get_or_compute(material, 10, 30, 90, compute)
    first, second = (store.get_or_compute(material, 10, 30, 90, compute) for _ in range(2))
    assert first.hit and second.hit and second.lists.arrays is first.lists.arrays  # read once
    assert all(not a.flags.writeable for a in first.lists.arrays.values())
    for name, array in cold.lists.arrays.items():
        np.testing.assert_array_equal(first.lists.arrays[name], array)
    monkeypatch.setattr(list_store, "LISTS", memo.FileReads(0))  # nothing kept: every hit reads the file again
    assert store.get_or_compute(material, 10, 30, 90, compute).lists.arrays is not first.lists.arrays
    assert len(list_store.LISTS.entries) == 0
