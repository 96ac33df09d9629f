"""The process state (fusebench.runtime.state): what a process keeps from one job to the next, in one object. A sim
model's rows are made once per process, with their normalised rows and store-key digests; nothing is derived once
for an array that could change, and nothing is kept past its entry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fusebench.app.pipeline import run
from fusebench.encoders.base import check_matrix
from fusebench.runtime import state
from fusebench.stores.lists import array_digest, shared_digests


@pytest.fixture(autouse=True)
def fresh_state():
    state.start()
    yield
    state.start()


def counting(calls: list):
    def compute(array):
        calls.append(1)
        return float(array.sum())
    return compute


def read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def test_a_kept_arrays_value_is_derived_once_anything_else_every_time():
    shared, calls = state.current().shared, []
    (kept,) = shared.get("m", lambda: (read_only(np.arange(6.0)),))
    assert shared.derived(kept, "sum", counting(calls)) == shared.derived(kept, "sum", counting(calls)) == 15.0
    assert len(calls) == 1
    assert shared.derived(kept, "other", counting(calls)) == 15.0 and len(calls) == 2  # its own name
    loose = read_only(np.arange(6.0))  # read-only but not kept: derived afresh (nothing holds it for later)
    assert shared.derived(loose, "sum", counting(calls)) == 15.0 and len(calls) == 3
    assert shared.known(loose, "sum") is None and shared.get("m", pytest.fail) == (kept,)  # kept: not made again


def test_values_go_with_their_entry_least_recently_used_first():
    shared = state.SharedArrays(budget=2 * 80, entry_budget=80)  # two 10-float64 entries
    made = []

    def make(value):
        return lambda: made.append(value) or (read_only(np.full(10, float(value))),)

    first = shared.get("a", make(1))[0]
    shared.derived(first, "sum", counting([]))
    shared.get("b", make(2))
    shared.get("a", make(1))  # used again: "b" is now the oldest
    shared.get("c", make(3))
    assert list(shared.entries) == ["a", "c"] and made == [1, 2, 3]
    assert shared.known(first, "sum") == 10.0
    shared.get("d", make(4))
    shared.get("e", make(5))
    assert "a" not in shared.entries and shared.known(first, "sum") is None  # dropped with its entry
    assert all(owner in shared.entries for _, owner in shared.owners.values())
    big = shared.get("big", lambda: (read_only(np.zeros(11)),))  # over an entry's budget: returned, not kept
    assert "big" not in shared.entries and shared.known(big[0], "sum") is None


def test_check_matrix_shares_the_normalised_rows_of_kept_rows_only():
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((30, 8)).astype(np.float32)
    fresh = check_matrix(raw, 30, "image embeddings", "x.npy", "images")
    assert fresh.flags.writeable and check_matrix(raw, 30, "image embeddings", "x.npy", "images") is not fresh
    (kept,) = state.current().shared.get("m", lambda: (read_only(raw.copy()),))
    first = check_matrix(kept, 30, "image embeddings", "x.npy", "images")
    assert check_matrix(kept, 30, "image embeddings", "x.npy", "images") is first
    assert not first.flags.writeable  # shared between jobs: nothing may change it in place
    np.testing.assert_array_equal(first, fresh)  # the same bits either way
    np.testing.assert_allclose(first, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6)


def test_shared_digests_hash_kept_arrays_and_their_normalised_rows_once(monkeypatch):
    import fusebench.stores.lists as list_store

    hashed = []
    monkeypatch.setattr(list_store, "array_digest", lambda a: hashed.append(a.nbytes) or array_digest(a))
    rows = state.current().shared.get("m", lambda: tuple(
        read_only(np.random.default_rng(i).standard_normal((20, 4)).astype(np.float32)) for i in range(2)))
    normalised = check_matrix(rows[0], 20, "image embeddings", "x.npy", "images")  # derived from a kept array
    other = np.arange(10, dtype=np.int64)
    first = shared_digests([*rows, normalised, other])
    assert first == [array_digest(a) for a in (*rows, normalised, other)] and len(hashed) == 4
    assert shared_digests([*rows, normalised, other]) == first and len(hashed) == 5  # only the loose one again


@pytest.mark.slow  # several whole jobs in one process
def test_jobs_of_one_process_share_sim_rows_and_keys_and_get_the_same_results(compose_cfg, tmp_path, monkeypatch):
    import fusebench.encoders.base as base
    import fusebench.encoders.simulated as sim
    import fusebench.stores.lists as list_store

    made, normalised, hashed = [], [], []
    real_make, real_normalise, real_digest = sim.sim_model_embeddings, base.l2_normalise_rows, list_store.array_digest
    monkeypatch.setattr(sim, "sim_model_embeddings", lambda *a: made.append(1) or real_make(*a))
    monkeypatch.setattr(base, "l2_normalise_rows", lambda a: normalised.append(a.shape) or real_normalise(a))
    monkeypatch.setattr(list_store, "array_digest", lambda a: hashed.append(a.shape) or real_digest(a))
    small = ["dataset.n_images=120", "dataset.n_captions=600", "eval.bootstrap.draws=50", "plots=false", "logger=none",
             f"embed.cache.dir={tmp_path / 'cache'}"]
    run(compose_cfg([*small, "fusion=rrf"]), str(tmp_path / "job0"))
    assert len(made) == 2 and len(normalised) == 4 and len(hashed) == 5  # 2 models x (image, text); + caption map
    run(compose_cfg([*small, "fusion=dbsf"]), str(tmp_path / "job1"))
    assert len(made) == 2 and len(normalised) == 4 and len(hashed) == 6  # the second job: only the caption map again
    state.start()
    run(compose_cfg([*small, "fusion=dbsf"]), str(tmp_path / "alone"))  # as a job of its own process would
    assert len(made) == 4 and len(normalised) == 8
    for name in ("sim_siglip2_like", "sim_dfn5b_like", "fused"):
        for direction in ("t2i", "i2t"):
            shared = np.load(tmp_path / "job1" / "ranks" / f"{name}.{direction}.npy")
            np.testing.assert_array_equal(shared, np.load(tmp_path / "alone" / "ranks" / f"{name}.{direction}.npy"))
    metrics = [json.loads((tmp_path / job / "metrics.json").read_text()) for job in ("job1", "alone")]
    assert metrics[0]["retrievers"] == metrics[1]["retrievers"]


def test_similarity_blocks_are_counted_in_the_state():
    import torch

    from fusebench.search.exact import similarity

    before = state.current().similarity_blocks
    similarity(torch.ones(2, 3), torch.ones(4, 3))
    assert state.current().similarity_blocks == before + 1
    assert state.start().similarity_blocks == 0  # a fresh process's count
