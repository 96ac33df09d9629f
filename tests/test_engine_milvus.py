"""Milvus Lite as an embedded engine (fusebench.backends.kinds.milvus): its lists on a small corpus against exact search and
fusebench's exact presets (milvus_rrf, milvus_weighted, milvus_weighted_ip), its fusion against a slow reference of
Milvus Lite's MergeOp written the obvious way, the FAISS indexes it builds, the requests it refuses, that the lite
server is stopped even on error, and that it writes nothing outside workdir."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from helpers import engine_case as case  # noqa: E402

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends.kinds import milvus as engine  # noqa: E402
from fusebench.config.search import SearchConfig  # noqa: E402

PRESETS = ("milvus_rrf", "milvus_weighted", "milvus_weighted_ip")
TOP_K = 20
TIE = 1e-6  # cosines within this are ties (float32 dot products summed in another order)


def _request(tmp: Path, preset: str = "milvus_rrf", n_items: int = 400, n_queries: int = 150, dims=(24, 16),
             weights=None, **search):
    items, queries = case.corpus(n_items=n_items, n_queries=n_queries, dims=dims)
    config = SearchConfig(backend="milvus", **{"latency_queries": 4, "batch_size": 64, **search})
    return case.request(items, queries, case.preset(preset, top_k=TOP_K), tmp, config, weights=weights)


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """One engine session per preset (flat index), shared by the tests below."""
    runs = {}
    for preset in PRESETS:
        weights = {"a": 1.0, "b": 0.6} if preset == "milvus_weighted" else None
        req = _request(tmp_path_factory.mktemp(preset), preset, weights=weights)
        runs[preset] = (req, engine.run(req))
    return runs


def _tied_groups(scores: np.ndarray, tol: float) -> list[np.ndarray]:
    """Runs of consecutive positions whose reference scores are equal (within ``tol``)."""
    with np.errstate(invalid="ignore"):  # -inf padding after the last candidate: one group
        cuts = np.flatnonzero(np.abs(np.diff(scores)) > tol) + 1
    return np.split(np.arange(len(scores)), cuts)


def assert_same_up_to_ties(ids, scores, ref_ids, ref_scores, tol):
    """Per query: scores equal to float rounding, ids identical outside tied groups, the same set inside each tied
    group. ``ref_*`` may run past the list (the reference's next items): the group the list's end cuts must then
    hold only items of that group."""
    width = ids.shape[1]
    np.testing.assert_allclose(scores, ref_scores[:, :width], rtol=0, atol=tol)
    for q in range(len(ids)):
        for group in _tied_groups(ref_scores[q], tol):
            inside = group[group < width]
            if len(inside) == len(group):
                assert set(ids[q, group]) == set(ref_ids[q, group]), (q, group, ids[q, group], ref_ids[q, group])
            elif len(inside):
                assert set(ids[q, inside]) <= set(ref_ids[q, group]), (q, group, ids[q, inside], ref_ids[q, group])


def _exact_topk(req, model: str, extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each query's top per_model_k (+ ``extra``) by exact float64 cosine, ties by lower id (stable argsort)."""
    sims = req.queries[model].astype(np.float64) @ req.items[model].astype(np.float64).T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :req.per_model_k + extra]
    return order, np.take_along_axis(sims, order, axis=1)


def _exact_preset_wide(req) -> tuple[np.ndarray, np.ndarray]:
    """fusebench's preset over the exact lists, every fused candidate (so ties at the list's end are seen)."""
    return case.exact_preset(replace(req, final_k=len(req.models) * req.per_model_k))


def _milvus_merge(req, singles: dict, final_k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Milvus Lite 3.2.2's hybrid merge the obvious way (function/ops/merge_op.py MergeOp, function/chain.py sort):
    per id, RRF adds 1 / (k + rank) (rank 1-based), weighted adds w x norm(score) with norm (1 + s) / 2 on COSINE,
    1/2 + atan(s) / pi on IP, in float64; sorted by that score descending, ties by the smaller id; float32 out."""
    preset, k, final_k = req.fusion.preset, req.fusion.params.get("rrf_k"), final_k or req.final_k  # rrf_k: milvus_rrf
    norm = (lambda s: (1.0 + s) * 0.5) if preset == "milvus_weighted" else (lambda s: 0.5 + math.atan(s) / math.pi)
    out_ids, out_scores = [], []
    for q in range(req.n_queries):
        total = defaultdict(float)
        for m in req.models:
            ids, scores = singles[m]
            for rank, (item, score) in enumerate(zip(ids[q].tolist(), scores[q].tolist())):
                if item >= 0:
                    total[item] += 1.0 / (k + rank + 1) if preset == "milvus_rrf" else req.weights[m] * norm(score)
        ranked = sorted(total, key=lambda i: (-total[i], i))[:final_k]
        out_ids.append(ranked + [-1] * (final_k - len(ranked)))
        out_scores.append([total[i] for i in ranked] + [-np.inf] * (final_k - len(ranked)))
    return np.asarray(out_ids, dtype=np.int64), np.asarray(out_scores, dtype=np.float32)


@pytest.mark.slow  # starts Milvus Lite
@pytest.mark.parametrize("preset", PRESETS)
def test_lists_have_the_contract_shapes(flat, preset):
    req, out = flat[preset]
    assert set(out.singles) == set(req.models)
    for ids, scores in out.singles.values():
        assert ids.shape == scores.shape == (req.n_queries, req.per_model_k)
        assert ids.dtype == np.int64 and scores.dtype == np.float32 and (ids >= 0).all()
    assert out.fused_ids.shape == out.fused_scores.shape == (req.n_queries, req.final_k)
    assert (out.fused_ids >= 0).all()  # two lists of 20 always hold 20 distinct ids
    assert out.latency_ms.shape == (4,) and (out.latency_ms > 0).all()
    assert out.ingest_seconds > 0 and out.build_seconds > 0 and out.search_seconds > 0
    assert out.disk_bytes > req.n_items * (24 + 16) * 4  # the float32 vectors, at least
    assert out.version.startswith("pymilvus ") and ", milvus-lite " in out.version
    assert any("merge_op.py" in note for note in out.notes)


@pytest.mark.slow  # starts Milvus Lite
@pytest.mark.parametrize("preset", PRESETS)
def test_flat_singles_are_the_exact_top_k(flat, preset):
    """Each model's list is the exact top-k; COSINE's score is 1 - (1 - cos) in float32, IP's the dot product."""
    req, out = flat[preset]
    for m in req.models:
        ref_ids, ref_scores = _exact_topk(req, m, extra=10)
        ids, scores = out.singles[m]
        assert_same_up_to_ties(ids, scores.astype(np.float64), ref_ids, ref_scores, tol=TIE)


@pytest.mark.slow  # starts Milvus Lite
@pytest.mark.parametrize("preset, tol", [("milvus_rrf", 1e-8), ("milvus_weighted", 1e-6), ("milvus_weighted_ip", 1e-6)])
def test_flat_fused_lists_equal_the_exact_preset(flat, preset, tol):
    """fusebench's preset over exact lists gives Milvus' fused list: the same ids where fused scores are not tied,
    the same set within a tied group, and Milvus' fused score is the preset's (after its score map) to float
    rounding: Milvus adds in float64, the preset in float32."""
    req, out = flat[preset]
    assert case.exact_preset(req)[0].shape == out.fused_ids.shape
    ref_ids, ref_scores = _exact_preset_wide(req)
    assert_same_up_to_ties(out.fused_ids, out.fused_scores, ref_ids, ref_scores, tol=tol)


@pytest.mark.slow  # starts Milvus Lite
@pytest.mark.parametrize("preset", PRESETS)
def test_fused_list_is_milvus_merge_of_the_engines_own_lists(flat, preset):
    """The fused list is MergeOp over the engine's per-model lists: to the bit for RRF (ranks) and IP (the dot
    product travels exactly); COSINE's route scores are 1 - distance in float64 inside the engine but float32 in
    the singles we get back, so there to rounding."""
    req, out = flat[preset]
    if preset == "milvus_weighted":
        ids, scores = _milvus_merge(req, out.singles, final_k=len(req.models) * req.per_model_k)
        assert_same_up_to_ties(out.fused_ids, out.fused_scores, ids, scores, tol=1e-6)
    else:
        ids, scores = _milvus_merge(req, out.singles)
        np.testing.assert_array_equal(out.fused_ids, ids)
        np.testing.assert_array_equal(out.fused_scores, scores)


@pytest.mark.slow  # starts Milvus Lite
def test_fused_ties_go_to_the_smaller_id(flat):
    """Milvus' rule (Lite: FuncChain.sort tie_break_col=$id; Milvus: rerank/util.go newIDScores): equal fused
    scores in ascending id order; RRF on this corpus has such ties (one list's rank r against another's)."""
    _, out = flat["milvus_rrf"]
    tied = 0
    for ids, scores in zip(out.fused_ids, out.fused_scores):
        same = scores[1:] == scores[:-1]
        tied += int(same.sum())
        assert (ids[1:][same] > ids[:-1][same]).all()
    assert tied > 50


@pytest.mark.slow  # starts Milvus Lite
@pytest.mark.parametrize("index, settings, floor", [("hnsw", {"ef_search": 48, "hnsw_m": 8, "ef_construction": 40}, 0.95),
                                                    ("ivf_flat", {"nprobe": 8, "nlist": None}, 0.7)])
def test_indexes_are_built_and_return_lists_with_high_neighbour_recall(tmp_path, index, settings, floor):
    """Milvus Lite 3.2.2 builds a real FAISS index per flushed segment (index/factory.py), no FLAT fallback, with
    the build settings asked for (M, efConstruction; nlist = auto_nlist(1500) = 38, not Lite's default 128)."""
    faiss = pytest.importorskip("faiss")
    req = _request(tmp_path, n_items=1500, n_queries=60, dims=(32, 24), index=index, **settings)
    out = engine.run(req)
    files = {p.name.split(".", 1)[1]: p for p in tmp_path.rglob("*.idx")}
    assert set(files) == {f"v0.{index}.idx", f"v1.{index}.idx"}
    for name in ("v0", "v1"):
        built = faiss.read_index(str(files[f"{name}.{index}.idx"]))
        assert built.ntotal == req.n_items
        if index == "hnsw":
            assert type(built).__name__ == "IndexHNSWFlat"
            assert built.hnsw.nb_neighbors(1) == 8 and built.hnsw.efConstruction == 40
        else:
            assert type(built).__name__ == "IndexIVFFlat" and built.nlist == 38
    for m in req.models:
        exact, _ = _exact_topk(req, m)
        ids = out.singles[m][0]
        assert (ids >= 0).all()
        recall = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids.tolist(), exact.tolist())])
        assert floor <= recall <= 1.0, (index, m, recall)
    fused_ids, fused_scores = _milvus_merge(req, out.singles)
    np.testing.assert_array_equal(out.fused_ids, fused_ids)
    np.testing.assert_array_equal(out.fused_scores, fused_scores)
    assert any(index.upper() in note for note in out.notes)


def _refused(tmp_path, match: str, preset="milvus_rrf", weights=None, fuse_on=None, per_model_k=None, **search):
    req = _request(tmp_path, preset, n_queries=5, weights=weights, **search)
    if fuse_on:
        req.fusion = replace(req.fusion, fuse_on=fuse_on)
    if per_model_k:
        req.per_model_k = per_model_k
    with pytest.raises(FusebenchError, match=match) as err:
        engine.run(req)
    assert "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())  # refused before the server started


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_milvus_lite_2_refused(tmp_path, monkeypatch):
    """The rules here are Milvus Lite 3's (pure Python); 2.x is another engine (a C++ server)."""
    import milvus_lite

    monkeypatch.setattr(milvus_lite, "__version__", "2.4.10")
    _refused(tmp_path, r"needs milvus-lite 3 \(found 2.4.10\): pip install 'milvus-lite>=3.2,<4'")


@pytest.mark.slow  # starts Milvus Lite
def test_server_stopped_and_lock_released_on_error(tmp_path, monkeypatch):
    """A failure mid-search still closes the client, stops the lite server (its LOCK free again) and puts back
    Milvus Lite's own row reader."""
    from milvus_lite import MilvusLite
    from milvus_lite.server_manager import server_manager_instance
    from milvus_lite.storage.segment import Segment

    reader = Segment.row_to_dict

    def broken(self, start, stop):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine._Searcher, "fused", broken)
    req = _request(tmp_path, n_queries=5)
    with pytest.raises(RuntimeError, match="boom"):
        engine.run(req)
    assert str(tmp_path / "milvus.db") not in server_manager_instance._servers  # noqa: SLF001
    MilvusLite(str(tmp_path / "milvus.db")).close()  # the data folder's LOCK is free again
    assert Segment.row_to_dict is reader


@pytest.mark.slow  # starts Milvus Lite
@pytest.mark.parametrize("same", [True, False])
def test_a_retried_create_index_that_was_applied_is_taken_only_when_it_is_the_index_asked(tmp_path, monkeypatch, same):
    """pymilvus re-sends create_index after an RPC failure; when the first request was applied, the retry is refused
    as "index already exists" (met at a million rows). The run goes on when the index there is the one asked for
    (neighbour recall of HNSW as without the retry), and fails when it is another."""
    import pymilvus

    original = pymilvus.MilvusClient.create_index

    def applied_then_retried(self, collection, params, **kwargs):
        first = params
        if not same:  # the lost first request made another index than the one asked for
            first = self.prepare_index_params()
            for p in params:
                first.add_index(field_name=p.field_name, index_type="FLAT", metric_type="IP")
        original(self, collection, first, **kwargs)
        return original(self, collection, params, **kwargs)  # the retry: "index already exists"

    monkeypatch.setattr(pymilvus.MilvusClient, "create_index", applied_then_retried)
    req = _request(tmp_path, n_queries=20, index="hnsw", ef_search=64)
    if same:
        out = engine.run(req)
        assert (out.fused_ids[:, 0] >= 0).all() and out.build_seconds > 0
    else:
        with pytest.raises(pymilvus.MilvusException, match="index already exists"):
            engine.run(req)


WATCHED_RUN = """
import json, sys
from pathlib import Path
import numpy as np
from fusebench.config.search import SearchConfig
from fusebench.backends.engine_steps import EngineRequest
from fusebench.backends.kinds import milvus as engine
from fusebench.fusion.config import FusionConfig
from milvus_lite.server_manager import server_manager_instance

rng = np.random.default_rng(3)
unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
items = {m: unit(rng.standard_normal((300, d))) for m, d in (("a", 16), ("b", 8))}
queries = {m: unit(rng.standard_normal((20, x.shape[1]))) for m, x in items.items()}
fusion = FusionConfig(method="rrf", top_k=10, preset="milvus_rrf")
sizes = {}
for index in ("flat", "ivf_flat", "hnsw"):
    workdir = Path(sys.argv[1]) / index
    workdir.mkdir()
    request = EngineRequest(direction="t2i", items=items, queries=queries, weights={"a": 1.0, "b": 1.0},
                            fusion=fusion, per_model_k=10, final_k=10, workdir=workdir,
                            search=SearchConfig(backend="milvus", index=index, latency_queries=2,
                                                **({"nprobe": 2} if index == "ivf_flat" else {})))
    sizes[index] = engine.run(request).disk_bytes
assert not server_manager_instance._servers
print(json.dumps(sizes))
"""


@pytest.mark.slow  # starts Milvus Lite in a subprocess
def test_writes_nothing_outside_workdir(tmp_path):
    """HOME, TMPDIR, XDG_CACHE_HOME and the working folder are empty folders the run must leave empty (the lite
    server listens on 127.0.0.1; its data, LOCK and WAL are in workdir/milvus.db)."""
    watched = {name: tmp_path / name for name in ("home", "tmp", "cache", "cwd")}
    for folder in watched.values():
        folder.mkdir()
    db = tmp_path / "db"
    db.mkdir()
    env = {**os.environ, "HOME": str(watched["home"]), "TMPDIR": str(watched["tmp"]),
           "XDG_CACHE_HOME": str(watched["cache"]), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", WATCHED_RUN, str(db)], cwd=watched["cwd"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    sizes = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(size > 0 for size in sizes.values())
    for name, folder in watched.items():
        assert not any(folder.rglob("*")), (name, sorted(map(str, folder.rglob("*"))))
    assert sorted(p.name for p in db.iterdir()) == ["flat", "hnsw", "ivf_flat"]
    assert all(sorted(p.name for p in (db / index).iterdir()) == ["milvus.db"] for index in sizes)
