"""Qdrant's local mode as an embedded engine (fusebench.backends.kinds.qdrant): its lists on a small corpus against exact
search and fusebench's exact presets (qdrant_rrf, qdrant_dbsf; fuse_on source_object and document), its route
(the collection's float32 search, Qdrant's fusion code over the per-model lists) against the public client's
hybrid request written the obvious way, the requests it refuses, and that it writes nothing outside workdir."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

qdrant_client = pytest.importorskip("qdrant_client")
# every test runs Qdrant's local mode but test_non_unit_vectors_refused, and that one needs qdrant-client imported
# (over a second): the fast tier leaves the module out (tests/conftest.py)
pytestmark = pytest.mark.slow

from helpers import engine_case as case  # noqa: E402
from qdrant_client import models  # noqa: E402

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends.engine_steps import folder_bytes, vector_names  # noqa: E402
from fusebench.backends.kinds import qdrant as engine  # noqa: E402
from fusebench.config.search import SearchConfig  # noqa: E402

TOP_K = 20
TIE = 2e-6  # scores within this are ties (float32 vs float64 sums, dot products summed in another order)
CASES = [("qdrant_rrf", "source_object"), ("qdrant_dbsf", "source_object"), ("qdrant_rrf", "document"),
         ("qdrant_dbsf", "document")]


def _request(tmp: Path, name: str, fuse_on: str, weights: dict | None = None, latency_queries: int = 500):
    items, queries = case.corpus(n_items=400, n_queries=150)
    fusion = case.preset(name, top_k=TOP_K, fuse_on=fuse_on)
    return case.request(items, queries, fusion, tmp, SearchConfig(backend="qdrant", latency_queries=latency_queries),
                        weights=weights)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each (preset, fuse_on) run once: (request, lists)."""
    out = {}
    for name, fuse_on in CASES:
        request = _request(tmp_path_factory.mktemp(f"{name}_{fuse_on}"), name, fuse_on)
        out[name, fuse_on] = request, engine.run(request)
    return out


def _groups(ids, scores) -> list[tuple[float, Counter]]:
    """Consecutive entries with equal scores (within TIE) as (score, multiset of ids), -1 padding dropped."""
    out: list[tuple[float, Counter]] = []
    for i, s in zip(ids.tolist(), scores.tolist()):
        if i < 0:
            continue
        if out and abs(out[-1][0] - s) <= TIE:
            out[-1][1][i] += 1
        else:
            out.append((s, Counter([i])))
    return out


def assert_same_lists(ids, scores, ref_ids, ref_scores):
    """Per query: the same tied groups in the same order, each the same multiset of ids (a document list may
    hold an item twice), scores equal to float rounding; a group the list's end cuts may hold any tied items."""
    for q in range(len(ids)):
        mine, theirs = _groups(ids[q], scores[q]), _groups(ref_ids[q], ref_scores[q])
        assert len(mine) == len(theirs), q
        for g, ((s, c), (t, d)) in enumerate(zip(mine, theirs)):
            assert abs(s - t) <= TIE, (q, g, s, t)
            cut = g == len(mine) - 1 and sum(c.values()) > 1
            assert cut or c == d, (q, g, c, d)


@pytest.mark.parametrize("name,fuse_on", CASES)
def test_singles_are_the_exact_top_k(runs, name, fuse_on):
    request, out = runs[name, fuse_on]
    exact = case.exact_singles(request)
    for m in request.models:
        ids, scores = out.singles[m]
        assert ids.shape == (request.n_queries, request.per_model_k) and (ids >= 0).all()
        true = np.take_along_axis(request.queries[m] @ request.items[m].T, ids, axis=1)
        np.testing.assert_allclose(scores, true, atol=1e-6)  # each returned score is that item's cosine
        assert_same_lists(ids, scores, *exact[m])


@pytest.mark.parametrize("name,fuse_on", CASES)
def test_fused_lists_equal_fusebench_preset(runs, name, fuse_on):
    request, out = runs[name, fuse_on]
    ids, scores = case.exact_preset(request)
    assert out.fused_ids.shape == ids.shape == (request.n_queries, request.final_k)
    assert_same_lists(out.fused_ids, out.fused_scores, ids, scores)
    if fuse_on == "document":  # an item both models found is two entries, as fusebench's fuse_on=document keeps it
        assert any(len(set(row[row >= 0])) < (row >= 0).sum() for row in out.fused_ids)


@pytest.mark.parametrize("name,fuse_on", CASES)
def test_whole_hybrid_requests_agree_with_the_route(runs, name, fuse_on):
    """Every query's whole hybrid request (prefetch per model + fusion query, timed) returned the route's list."""
    request, out = runs[name, fuse_on]
    assert len(out.latency_ms) == request.n_queries and (out.latency_ms > 0).all()
    assert any(f"{request.n_queries} of {request.n_queries} whole hybrid requests" in note for note in out.notes)
    assert out.build_seconds == 0.0 and out.ingest_seconds > 0 and out.search_seconds > 0
    assert out.version.startswith("qdrant-client ") and out.version.endswith("(local mode)")


def _public_hybrid(request) -> tuple[np.ndarray, np.ndarray]:
    """The obvious way: the public client (in memory, COSINE) and query_points with a Prefetch per model and
    Qdrant's fusion query, one query at a time."""
    names, n = vector_names(request), request.n_items
    client = qdrant_client.QdrantClient(":memory:")
    client.create_collection("c", vectors_config={names[m]: models.VectorParams(size=request.items[m].shape[1],
                                                                                 distance=models.Distance.COSINE)
                                                   for m in request.models})
    if request.fusion.fuse_on == "source_object":
        points = [models.PointStruct(id=i, vector={names[m]: request.items[m][i].tolist() for m in request.models})
                  for i in range(n)]
    else:
        points = [models.PointStruct(id=k * n + i, vector={names[m]: request.items[m][i].tolist()})
                  for k, m in enumerate(request.models) for i in range(n)]
    client.upsert("c", points=points)
    weights = [request.weights[m] for m in request.models]
    query = (models.RrfQuery(rrf=models.Rrf(k=int(request.fusion.params["rrf_k"]) + 1, weights=weights))
             if request.fusion.method == "rrf" else models.FusionQuery(fusion=models.Fusion.DBSF))
    rows = []
    for q in range(request.n_queries):
        prefetch = [models.Prefetch(query=request.queries[m][q].tolist(), using=names[m], limit=request.per_model_k)
                    for m in request.models]
        points = client.query_points("c", prefetch=prefetch, query=query, limit=request.final_k).points
        rows.append([(int(p.id) % n, p.score) for p in points])
    client.close()
    from fusebench.backends.engine_steps import pad

    return pad(rows, request.final_k)


@pytest.mark.parametrize("name,fuse_on", [("qdrant_dbsf", "source_object"), ("qdrant_rrf", "document")])
def test_route_equals_the_public_clients_hybrid_request(runs, name, fuse_on):
    request, out = runs[name, fuse_on]
    assert_same_lists(out.fused_ids, out.fused_scores, *_public_hybrid(request))


@pytest.mark.parametrize("fuse_on", ["source_object", "document"])
def test_weighted_rrf_equals_the_preset_with_those_weights(tmp_path, fuse_on):
    request = _request(tmp_path, "qdrant_rrf", fuse_on, weights={"a": 2.0, "b": 0.5}, latency_queries=20)
    out = engine.run(request)
    ids, scores = case.exact_preset(request)
    assert_same_lists(out.fused_ids, out.fused_scores, ids, scores)
    plain, _ = case.exact_preset(_request(tmp_path / "plain", "qdrant_rrf", fuse_on))
    assert (plain[:, :5] != out.fused_ids[:, :5]).any()  # the weights changed the lists
    assert_same_lists(out.fused_ids[:20], out.fused_scores[:20], *_public_hybrid(_sliced(request, 20)))


def _sliced(request, count: int):
    from dataclasses import replace

    return replace(request, queries={m: v[:count] for m, v in request.queries.items()})


def test_non_unit_vectors_refused(tmp_path):
    items, queries = case.corpus(n_items=50, n_queries=5)
    items = {m: v * 2.0 for m, v in items.items()}
    request = case.request(items, queries, case.preset("qdrant_dbsf", top_k=TOP_K), tmp_path)
    with pytest.raises(FusebenchError, match="not unit rows"):
        engine.run(request)


def test_writes_only_under_workdir(tmp_path, monkeypatch):
    watched = {name: tmp_path / name for name in ("home", "tmp", "cwd")}
    for folder in watched.values():
        folder.mkdir()
    monkeypatch.setenv("HOME", str(watched["home"]))
    monkeypatch.setenv("TMPDIR", str(watched["tmp"]))
    monkeypatch.chdir(watched["cwd"])
    workdir = tmp_path / "work"
    workdir.mkdir()
    request = _request(workdir, "qdrant_rrf", "document", latency_queries=5)
    out = engine.run(request)
    assert {p.name: list(p.iterdir()) for p in watched.values()} == {p.name: [] for p in watched.values()}
    assert (workdir / "qdrant" / "collection" / engine.COLLECTION / "storage.sqlite").is_file()
    vectors = sum(v.nbytes for v in request.items.values())
    assert out.disk_bytes == folder_bytes(workdir) > vectors  # every point's vectors, on disk
