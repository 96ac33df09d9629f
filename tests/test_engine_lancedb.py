"""LanceDB as an embedded engine (fusebench.backends.kinds.lancedb): its lists on a small corpus against exact search and
fusebench's exact preset ``lancedb_rrf``, its own fusion rule against a slow reference written the obvious way,
the approximate indexes' neighbour recall, the requests it refuses, and that it writes nothing outside workdir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lancedb")
# every test runs LanceDB but test_ivf_pq_with_too_few_items_refused, and that one needs lancedb imported (two
# seconds): the fast tier leaves the module out (tests/conftest.py)
pytestmark = pytest.mark.slow

from helpers import engine_case as case  # noqa: E402

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends.kinds import lancedb as engine  # noqa: E402
from fusebench.config.search import SearchConfig  # noqa: E402

TOP_K, FINAL_K = 20, 30  # the fused list is longer than one model's list: LanceDB returns every distinct hit
TIE = 1e-6  # exact cosines within this are ties (float32 dot products summed in another order)


def _request(tmp: Path, n_items: int = 400, n_queries: int = 150, dims=(24, 16), **search):
    items, queries = case.corpus(n_items=n_items, n_queries=n_queries, dims=dims)
    fusion = case.preset("lancedb_rrf", top_k=TOP_K, final_top_k=FINAL_K)
    config = SearchConfig(backend="lancedb", latency_queries=4, **search)
    return case.request(items, queries, fusion, tmp, config)


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """150 queries in batches of 149: a many-vector search, then a one-vector one (no query_index column)."""
    request = _request(tmp_path_factory.mktemp("lancedb_flat"), batch_size=149)
    return request, engine.run(request)


def _tied_groups(scores: np.ndarray, tol: float) -> list[np.ndarray]:
    """Runs of consecutive positions whose reference scores are equal (within ``tol``)."""
    with np.errstate(invalid="ignore"):  # -inf padding: -inf - -inf is nan, not a cut (padding is one group)
        cuts = np.flatnonzero(np.abs(np.diff(scores)) > tol) + 1
    return np.split(np.arange(len(scores)), cuts)


def assert_same_up_to_ties(ids, scores, ref_ids, ref_scores, tol, rtol=1e-6):
    """Per query: scores equal to float rounding, ids identical outside tied groups, the same set inside each
    tied group (a group cut by the list's end may hold any of the tied items)."""
    np.testing.assert_allclose(scores, ref_scores, rtol=rtol, atol=tol)
    for q in range(len(ids)):
        for group in _tied_groups(ref_scores[q], tol):
            if group[-1] == ids.shape[1] - 1 and len(group) > 1:
                continue
            assert set(ids[q, group]) == set(ref_ids[q, group]), (q, group, ids[q, group], ref_ids[q, group])


def _exact_topk(req, model: str) -> tuple[np.ndarray, np.ndarray]:
    """Each query's top per_model_k by exact float64 cosine, ties by lower id (np.argsort, stable)."""
    sims = req.queries[model].astype(np.float64) @ req.items[model].astype(np.float64).T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :req.per_model_k]
    return order, np.take_along_axis(sims, order, axis=1)


def _lancedb_rrf(lists: list[np.ndarray], k: float, final_k: int) -> tuple[np.ndarray, np.ndarray]:
    """LanceDB 0.40's RRFReranker.rerank_multivector the obvious way: each list ranked on its own (rank 1 at its
    top), 1 / (k + rank) summed per id in float64, cast to float32, sorted descending on that float32, ties in
    first-appearance order of the concatenated lists."""
    out_ids, out_scores = [], []
    for q in range(len(lists[0])):
        total, first = defaultdict(float), {}
        for ids in lists:
            for rank, item in enumerate(i for i in ids[q].tolist() if i >= 0):
                total[item] += 1.0 / (k + rank + 1)
                first.setdefault(item, len(first))
        ranked = sorted(total, key=lambda i: (-np.float32(total[i]), first[i]))[:final_k]
        out_ids.append(ranked + [-1] * (final_k - len(ranked)))
        out_scores.append([np.float32(total[i]) for i in ranked] + [-np.inf] * (final_k - len(ranked)))
    return np.asarray(out_ids, dtype=np.int64), np.asarray(out_scores, dtype=np.float32)


def test_lists_have_the_contract_shapes(flat):
    req, out = flat
    assert set(out.singles) == set(req.models)
    for ids, scores in out.singles.values():
        assert ids.shape == scores.shape == (req.n_queries, req.per_model_k)
        assert ids.dtype == np.int64 and scores.dtype == np.float32
    assert out.fused_ids.shape == out.fused_scores.shape == (req.n_queries, FINAL_K)
    distinct = [len(set(out.singles["a"][0][q]) | set(out.singles["b"][0][q])) for q in range(req.n_queries)]
    assert ((out.fused_ids >= 0).sum(axis=1) == np.minimum(distinct, FINAL_K)).all()  # every distinct hit, cut
    assert out.latency_ms.shape == (4,) and (out.latency_ms > 0).all()
    assert out.build_seconds == 0.0 and out.ingest_seconds > 0 and out.search_seconds > 0
    assert out.disk_bytes > req.n_items * (24 + 16) * 4  # the float32 vectors, at least
    assert out.version.startswith("lancedb ") and "(pylance " in out.version
    assert any("rerankers/rrf.py" in note for note in out.notes)


def test_flat_singles_are_the_exact_top_k(flat):
    req, out = flat
    for m in req.models:
        ref_ids, ref_scores = _exact_topk(req, m)
        ids, scores = out.singles[m]
        assert_same_up_to_ties(ids, scores.astype(np.float64), ref_ids, ref_scores, tol=TIE)


def test_flat_fused_lists_equal_the_exact_preset(flat):
    """fusebench's preset lancedb_rrf over exact lists gives LanceDB's list: same ids where the fused scores are
    not tied, the same set within a tied group, scores equal to float rounding. (A preset that numbers ranks
    through the concatenated lists, rrf_ranks=concatenated, is the rule of LanceDB releases before the
    rerank_multivector fix in lancedb/rerankers/rrf.py, and fails here.)"""
    req, out = flat
    ref_ids, ref_scores = case.exact_preset(req)
    assert ref_ids.shape == out.fused_ids.shape
    assert_same_up_to_ties(out.fused_ids, out.fused_scores, ref_ids, ref_scores, tol=1e-7)


def test_fused_list_is_lancedb_rrf_of_the_engines_own_lists(flat):
    """The fused list is RRFReranker.rerank_multivector over the engine's per-model lists, to the bit."""
    req, out = flat
    ids, scores = _lancedb_rrf([out.singles[m][0] for m in req.models], req.fusion.params["rrf_k"], req.final_k)
    np.testing.assert_array_equal(out.fused_ids, ids)
    np.testing.assert_array_equal(out.fused_scores, scores)


@pytest.mark.parametrize("index, settings, floor", [("ivf_pq", {"nprobe": 16}, 0.5), ("hnsw", {"ef_search": 64}, 0.9)])
def test_indexes_return_lists_with_sane_neighbour_recall(tmp_path, index, settings, floor):
    req = _request(tmp_path, n_items=1500, n_queries=60, dims=(32, 24), index=index, **settings)
    out = engine.run(req)
    assert out.build_seconds > 0
    for m in req.models:
        exact, _ = _exact_topk(req, m)
        ids, scores = out.singles[m]
        assert (ids >= 0).all()
        recall = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids.tolist(), exact.tolist())])
        assert floor <= recall <= 1.0, (index, m, recall)
        cosines = np.einsum("qd,qkd->qk", req.queries[m], req.items[m][ids])
        assert np.abs(scores - cosines).max() > 1e-4  # quantised codes' distances: the index answered, not a scan
    fused_ids, fused_scores = _lancedb_rrf([out.singles[m][0] for m in req.models], req.fusion.params["rrf_k"], req.final_k)
    np.testing.assert_array_equal(out.fused_ids, fused_ids)
    np.testing.assert_array_equal(out.fused_scores, fused_scores)
    assert any(("IVF_PQ" if index == "ivf_pq" else "IVF_HNSW_SQ") in note for note in out.notes)


def test_ivf_pq_refine_factor_reranks_by_the_full_vectors(tmp_path):
    """search.refine_factor: LanceDB re-ranks refine_factor x limit PQ candidates by their full vectors, so the
    singles' scores are the exact cosines of the items returned and the neighbour recall rises over the same index
    without it."""
    recall = {}
    for refine in (None, 4):
        workdir = tmp_path / str(refine)
        workdir.mkdir()
        req = _request(workdir, n_items=1500, n_queries=60, dims=(32, 24), index="ivf_pq", nprobe=16,
                       refine_factor=refine)
        out = engine.run(req)
        for m in req.models:
            exact, _ = _exact_topk(req, m)
            ids, scores = out.singles[m]
            recall[refine, m] = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids.tolist(), exact.tolist())])
            if refine:
                cosines = np.einsum("qd,qkd->qk", req.queries[m], req.items[m][ids])
                np.testing.assert_allclose(scores, cosines, atol=1e-5)
        assert any((f"refine_factor={refine})" if refine else "no refine_factor") in n for n in out.notes)
    for m in req.models:
        assert recall[4, m] > recall[None, m] + 0.05, recall


def test_ivf_pq_with_too_few_items_refused(compose_cfg, tmp_path):
    """Under 2^nbits rows LanceDB would leave every row unindexed (a silent flat search): the run is refused before
    any embedding work (config.search.check_sizes, which every index's backend shares)."""
    from fusebench.app.pipeline import run

    cfg = compose_cfg(["search=lancedb", "search.index=ivf_pq", "search.nprobe=2", "search.nlist=4", "dataset.n_images=200",
                       "dataset.n_captions=400", "logger=none", "plots=false", f"paths.output_dir={tmp_path}"])
    with pytest.raises(FusebenchError, match=r"search.nbits=8 needs at least 256 items.*holds 200") as err:
        run(cfg, str(tmp_path / "run"))
    assert "\n" not in str(err.value) and not list(tmp_path.rglob("*.npy"))  # nothing was embedded


WATCHED_RUN = """
import json, sys
from pathlib import Path
import numpy as np
from fusebench.config.search import SearchConfig
from fusebench.backends.engine_steps import EngineRequest
from fusebench.backends.kinds import lancedb as engine
from fusebench.fusion.config import FusionConfig

rng = np.random.default_rng(3)
unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
items = {m: unit(rng.standard_normal((600, d))) for m, d in (("a", 16), ("b", 8))}
queries = {m: unit(rng.standard_normal((20, x.shape[1]))) for m, x in items.items()}
fusion = FusionConfig(method="rrf", top_k=10, preset="lancedb_rrf")
sizes = {}
for index in ("flat", "ivf_pq", "hnsw"):
    workdir = Path(sys.argv[1]) / index
    workdir.mkdir()
    request = EngineRequest(direction="t2i", items=items, queries=queries, weights={"a": 1.0, "b": 1.0},
                            fusion=fusion, per_model_k=10, final_k=10, workdir=workdir,
                            search=SearchConfig(backend="lancedb", index=index, latency_queries=2, threads=1,
                                                **({"nprobe": 4} if index == "ivf_pq" else {})))
    sizes[index] = engine.run(request).disk_bytes
print(json.dumps(sizes))
"""


def test_writes_nothing_outside_workdir(tmp_path):
    """HOME, TMPDIR, XDG_CACHE_HOME and the working folder are empty folders the run must leave empty (an index
    build spills to TMPDIR: the engine points it inside workdir)."""
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
    assert sorted(p.name for p in db.iterdir()) == ["flat", "hnsw", "ivf_pq"]
