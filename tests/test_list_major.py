"""IVF-Flat searched list-major (search.list_major, fusebench.backends.list_major): the same lists as FAISS's own
search of the same index at the same nprobe (scores to float rounding, ids but for rounding ties), in blocks or
whole, short lists padded alike; the setting reaches the lists, the record, the label, the tuning key and the
default nlist, and is refused beside any other index."""

import json

import numpy as np
import pytest
import torch

faiss = pytest.importorskip("faiss")

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends import faiss_index, list_major  # noqa: E402
from fusebench.backends.base import check_search  # noqa: E402
from fusebench.config.search import SearchConfig, auto_nlist, fastscan_nlist, resolved_nlist  # noqa: E402
from fusebench.encoders.base import ModelEmbeddings  # noqa: E402
from fusebench.fusion.config import FusionConfig  # noqa: E402

CPU = torch.device("cpu")
TIE = 1e-5  # BLAS's matmul and FAISS's scan sum a product in other orders: scores this close may swap


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(n=2000, nq=700, dim=24, seed=3):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim)) * 2
    items = _unit(centres[rng.integers(0, 40, n)] + rng.standard_normal((n, dim)))
    queries = _unit(items[rng.integers(0, n, nq)] + 0.8 * rng.standard_normal((nq, dim)))
    return items, queries


def ivf_flat(items, nlist):
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(items.shape[1]), items.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = 1234
    index.train(items)
    index.add(items)
    return index


def assert_same_lists(ids, scores, ref_ids, ref_scores):
    """Scores equal to rounding; where ids differ, the two items' scores tie within TIE at that position (both
    lists' ids at that position are in the other list, or the position's scores tie with a neighbour's)."""
    found = ids >= 0
    assert np.array_equal(found, ref_ids >= 0)
    np.testing.assert_allclose(np.where(found, scores, 0), np.where(found, ref_scores, 0), atol=TIE, rtol=0)
    for q, p in zip(*np.nonzero(ids != ref_ids)):
        row = ref_scores[q]
        assert any(abs(row[p] - row[j]) <= TIE for j in (p - 1, p + 1) if 0 <= j < len(row)), (q, p)


def run(search, block, queries, k):
    return faiss_index.search_blocks(search, block, queries, k, lambda _n: None)


@pytest.mark.parametrize("nlist,nprobe,k", [(45, 1, 10), (45, 6, 50), (45, 45, 100), (12, 1, 300)])
def test_list_major_equals_faiss_search(nlist, nprobe, k):
    """Every candidate of FAISS's search at the same nprobe, no other; k above a query's candidates (nprobe 1 of 12
    lists, k 300) pads both with -1 ids and -inf scores."""
    items, queries = clustered()
    index = ivf_flat(items, nlist)
    index.nprobe = nprobe
    ref_ids, ref_scores, _ = run(index.search, 2048, queries, k)
    search, block = faiss_index.block_search(faiss, index, {"nprobe": nprobe, "list_major": True})
    assert block == list_major.BLOCK
    ids, scores, _ = run(search, block, queries, k)
    assert_same_lists(ids, scores, ref_ids, ref_scores)
    if k == 300:
        assert (ids < 0).any() and np.isneginf(scores[ids < 0]).all()
    assert (ids == ref_ids).all(axis=1).mean() > 0.9  # ties are the exception


def test_a_batch_with_fewer_probes_than_lists_is_searched_by_faiss():
    """big_batch_search's bucket sort needs more probes (queries x nprobe) than nlist + 1: a smaller batch (a target
    recall's trial at nprobe 1) is searched by FAISS's own search, with the same lists."""
    items, queries = clustered()
    index = ivf_flat(items, 45)
    index.nprobe = 1
    search, _block = faiss_index.block_search(faiss, index, {"nprobe": 1, "list_major": True})
    for rows in (queries[:46], queries[:47], queries[:1]):
        scores, ids = search(rows, 10)
        ref_scores, ref_ids = index.search(rows, 10)
        assert_same_lists(ids, scores, ref_ids, ref_scores)


def test_blocks_of_queries_give_the_lists_of_one_call(monkeypatch):
    """The same candidates whatever the block: each list's scores are one BLAS matmul of the block's queries that
    probe it, whose shape depends on the block, and BLAS may sum a product in another order in another shape (seen
    on a 2-core EPYC without AVX-512, faiss-cpu's OpenBLAS 0.3.15 with its Zen and Haswell kernels alike: 4,916 of
    21,000 scores 1 ulp apart between blocks of 64 and one call; the machines this test was written on gave equal
    bits), so scores are equal to rounding and ids but for ties within it, as against FAISS's search."""
    items, queries = clustered()
    index = ivf_flat(items, 45)
    index.nprobe = 8
    whole = run(lambda rows, k: list_major.search(faiss, index, rows, k), 10_000, queries, 30)
    monkeypatch.setattr(list_major, "BLOCK", 64)
    search, block = faiss_index.block_search(faiss, index, {"nprobe": 8, "list_major": True})
    assert block == 64
    parts = run(search, block, queries, 30)
    assert_same_lists(parts[0], parts[1], whole[0], whole[1])
    assert (parts[0] == whole[0]).all(axis=1).mean() > 0.9  # ties are the exception


def test_other_indexes_and_settings_search_as_faiss_does():
    items, _ = clustered(n=500)
    index = ivf_flat(items, 10)
    assert faiss_index.block_search(faiss, index, {"nprobe": 2})[0] == index.search  # not asked
    assert faiss_index.block_search(faiss, index, {"nprobe": 2, "list_major": True}, "cuda")[0] == index.search
    refined = faiss.IndexRefineFlat(faiss.IndexIVFFlat(faiss.IndexFlatIP(24), 24, 10, faiss.METRIC_INNER_PRODUCT))
    assert not list_major.supported(faiss, refined)
    assert faiss_index.block_search(faiss, refined, {"nprobe": 2, "list_major": True})[0] == refined.search


def config(**settings) -> SearchConfig:
    return SearchConfig(backend="faiss", **settings)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_faiss_lists_list_major_equal_query_major_and_are_recorded():
    items, _ = clustered(n=1500)
    rng = np.random.default_rng(0)
    caption_image = np.repeat(np.arange(len(items)), rng.integers(0, 3, len(items)))
    text = _unit(items[caption_image] + 0.7 * rng.standard_normal((len(caption_image), items.shape[1])))
    model = ModelEmbeddings("m", items, text)
    plain = faiss_index.faiss_lists(model, caption_image, 20, config(index="ivf_flat", nlist=30, nprobe=4), CPU, None)
    major = faiss_index.faiss_lists(model, caption_image, 20,
                                    config(index="ivf_flat", nlist=30, nprobe=4, list_major=True), CPU, None)
    for d in ("t2i", "i2t"):
        a, b = plain.lists[d], major.lists[d]
        assert_same_lists(b.ids.numpy(), b.scores.numpy(), a.ids.numpy(), a.scores.numpy())
        assert major.params[d] == {**plain.params[d], "list_major": True}
    assert (np.asarray(major.lists["t2i"].ranks) == np.asarray(plain.lists["t2i"].ranks)).mean() > 0.95


def test_the_setting_reaches_label_nlist_and_tuning_key():
    on = config(index="ivf_flat", nlist=None, list_major=True, target_recall=0.95)
    off = config(index="ivf_flat", nlist=None, target_recall=0.95)
    assert on.label().endswith("list-major") and "list-major" not in off.label()
    assert resolved_nlist(on, 1_005_000) == fastscan_nlist(1_005_000) == 1002
    assert resolved_nlist(off, 1_005_000) == auto_nlist(1_005_000) == 4010
    assert faiss_index.search_params(on) == {"nprobe": 52, "list_major": True}  # in the tuning store's key
    assert faiss_index.search_params(off) == {"nprobe": 52}  # earlier keys hold


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivf_pq", "ivf_pqfs"])
def test_list_major_beside_another_index_is_refused(index):
    with pytest.raises(FusebenchError, match=rf"search\.list_major=true .* search\.index={index} is not one"):
        check_search(config(index=index, list_major=True), FusionConfig(), [1.0])


def test_list_major_must_be_a_boolean():
    with pytest.raises(FusebenchError, match=r"search\.list_major"):
        config(index="ivf_flat", list_major="sometimes")


@pytest.mark.slow  # compositions
def test_the_preset_composes(compose_cfg):
    from fusebench.app.run_config import run_config

    search = run_config(compose_cfg(["search=faiss_ivf_flat_lists_recall95"])).search
    assert (search.index, search.list_major, search.target_recall, search.nlist) == ("ivf_flat", True, 0.95, None)
    assert search.label() == "faiss ivf_flat nlist=auto target_recall=0.95 list-major"
    with pytest.raises(FusebenchError, match=r"search\.list_major=true .* search\.index=hnsw"):
        run_config(compose_cfg(["search=faiss_ivf_flat_lists_recall95", "search.index=hnsw"]))


@pytest.mark.slow  # runs three jobs over a gallery
def test_the_preset_over_a_gallery_is_recorded_read_back_and_equals_faiss_search(compose_cfg, tmp_path):
    """Over a sim gallery: the record says list-major with sqrt(n) lists, neighbour recall at the target; a rerun
    reads the stored index and its tuned nprobe; FAISS's own search of the same index at each model's chosen
    nprobe gives that model the same metrics and neighbour recall (the same candidates)."""
    from fusebench.app.pipeline import run as run_job

    args = ["gallery=sim", "gallery.size=3000", "gallery.near_duplicate=null", "dataset=sim_clustered",
            "dataset.n_images=200", "dataset.n_captions=600", "eval.bootstrap.draws=50", "plots=false", "logger=none",
            f"embed.cache.dir={tmp_path / 'cache'}"]
    tuned = ["search=faiss_ivf_flat_lists_recall95", "search.tune_images=50"]
    records = []
    for out in ("a", "b"):
        run_job(compose_cfg([*tuned, *args]), str(tmp_path / out))
        records.append(json.loads((tmp_path / out / "metrics.json").read_text()))
    for record, hit in zip(records, (False, True)):
        search = record["search"]
        assert search["label"].endswith("list-major")
        for name, model in search["models"].items():
            assert model["t2i"]["hit"] is hit and model["t2i"]["neighbour_recall"] >= 0.9, name
        params = search["params"]["t2i"]
        for p in params.values() if "nlist" not in params else [params]:
            assert p["list_major"] is True and p["nlist"] == 57  # sqrt(3,200)
    assert records[0]["retrievers"]["fused"] == records[1]["retrievers"]["fused"]
    params = records[0]["search"]["params"]["t2i"]
    chosen = {name: p["nprobe"] for name, p in params.items()} if "nlist" not in params else {
        name: params["nprobe"] for name in records[0]["search"]["models"]}
    for nprobe in sorted(set(chosen.values())):  # FAISS's own search at each model's chosen nprobe
        out = tmp_path / f"plain{nprobe}"
        run_job(compose_cfg(["search=faiss_ivf_flat", "search.nlist=57", f"search.nprobe={nprobe}", *args]), str(out))
        reference = json.loads((out / "metrics.json").read_text())
        for name in (n for n, value in chosen.items() if value == nprobe):
            assert records[0]["retrievers"][name]["t2i"] == reference["retrievers"][name]["t2i"], name
            assert (records[0]["search"]["models"][name]["t2i"]["neighbour_recall"]
                    == reference["search"]["models"][name]["t2i"]["neighbour_recall"]), name


def _model_and_tuning(seed=0):
    from fusebench.backends.target_recall import TuningQueries

    items, queries = clustered(n=1500, nq=400, seed=seed)
    rng = np.random.default_rng(seed)
    caption_image = np.repeat(np.arange(len(items)), rng.integers(0, 3, len(items)))
    text = _unit(items[caption_image] + 0.7 * rng.standard_normal((len(caption_image), items.shape[1])))
    tuning = TuningQueries("held_out", "test", 100, len(queries),
                           {"m": {"t2i": queries, "i2t": items[rng.choice(len(items), 100, replace=False)]}})
    return ModelEmbeddings("m", items, text), caption_image, tuning


@pytest.mark.slow  # builds and tunes four indexes
def test_a_tuning_made_one_way_is_never_read_for_the_other(tmp_path):
    """With one store and an explicit nlist, FAISS's search and the list-major scan share the index (its build is
    the same) but never a tuned nprobe: each choice is made, and stored, by the search that will use it."""
    model, caption_image, tuning = _model_and_tuning()
    store = str(tmp_path / "store")

    def entries(kind):
        return sorted(p.parent.name for p in (tmp_path / "store" / kind).rglob("meta.json"))

    settings = {"index": "ivf_flat", "nlist": 30, "target_recall": 0.9}
    faiss_index.faiss_lists(model, caption_image, 20, config(**settings), CPU, store, tuning=tuning)
    indexes, tunings = entries("indexes"), entries("tunings")
    assert len(indexes) == 2 and len(tunings) == 2  # t2i and i2t
    major = faiss_index.faiss_lists(model, caption_image, 20, config(**settings, list_major=True), CPU, store,
                                    tuning=tuning)
    assert entries("indexes") == indexes  # read, not built again
    assert len(entries("tunings")) == 4 and set(tunings) < set(entries("tunings"))
    assert all(cost.hit for cost in major.costs.values())


def test_search_threads_limit_the_list_major_matmuls(monkeypatch):
    """search.threads=1: FAISS's OpenMP threads and numpy's BLAS threads are 1 while a list-major search runs, and
    both are restored after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    model, caption_image, _tuning = _model_and_tuning()
    real, seen = list_major.search, []

    def spy(*args):
        blas = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        seen.append((faiss.omp_get_max_threads(), blas))
        return real(*args)

    monkeypatch.setattr(list_major, "search", spy)
    before = faiss.omp_get_max_threads()
    faiss_index.faiss_lists(model, caption_image, 10,
                            config(index="ivf_flat", nlist=30, nprobe=4, list_major=True, threads=1), CPU, None)
    assert seen and all(omp == 1 and all(n == 1 for n in blas) for omp, blas in seen)
    assert faiss.omp_get_max_threads() == before
