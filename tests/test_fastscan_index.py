"""IVF with fast-scan PQ (``search.index=ivf_pqfs``, the preset faiss_ivf_pqfs_recall95): its lists are FAISS's own
IndexIVFPQFastScan (re-ranked by IndexRefineFlat) over the same rows, re-ranking raises its neighbour recall against
exact lists, it is stored and read back (never taken for another kind or an unrefined one), its settings are
checked once with one line each, and the preset runs as a job with its settings in the record."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

faiss = pytest.importorskip("faiss")

from test_ann import make_case, slow_recall  # noqa: E402
from test_gallery_index import DEPTH, all_rows, gallery, lists  # noqa: E402,F401 (gallery: the fixture)

from fusebench import FusebenchError  # noqa: E402
from fusebench.app.pipeline import run  # noqa: E402
from fusebench.app.run_config import run_config  # noqa: E402
from fusebench.backends import faiss_index as ann  # noqa: E402
from fusebench.backends import gallery_index  # noqa: E402
from fusebench.backends.faiss_index import GALLERY_CHUNK, faiss_lists  # noqa: E402
from fusebench.backends.quality import with_quality  # noqa: E402
from fusebench.config.search import SearchConfig, check_sizes, fastscan_nlist, pq_layout  # noqa: E402
from fusebench.search.model_lists import compute_model_lists  # noqa: E402
from fusebench.stores.indexes import index_problem  # noqa: E402

CPU = torch.device("cpu")


def pqfs(**settings) -> SearchConfig:
    return SearchConfig(backend="faiss", index="ivf_pqfs", **settings)


def faiss_own_pqfs(rows, queries, sample, nlist, m, nprobe, refine, k):
    """FAISS's own fast-scan IVF-PQ as its documentation builds one, over ``rows`` in memory (width a multiple of m)."""
    d, ip = rows.shape[1], faiss.METRIC_INNER_PRODUCT
    index = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(d), d, nlist, m, 4, ip)
    index.cp.seed = index.pq.cp.seed = 1234
    index.train(rows[sample])
    index.nprobe = nprobe
    if refine:
        index = faiss.IndexRefineFlat(index)
        index.k_factor = refine
    for start in range(0, len(rows), GALLERY_CHUNK):
        index.add(rows[start:start + GALLERY_CHUNK])
    return index.search(queries, k)


@pytest.mark.parametrize("refine", [None, 4])
def test_pqfs_over_a_gallery_equals_faiss_own_over_the_same_rows(gallery, refine, monkeypatch):  # noqa: F811
    model, caption_image, distractors = gallery
    monkeypatch.setattr(gallery_index, "TRAIN_CAP", 0)  # a real sample: 39 rows a centroid, not every row
    config = pqfs(nlist=8, nprobe=3, pq_m=12, refine_factor=refine, threads=1)
    result, _exact = lists(model, caption_image, distractors, config)
    rows = all_rows(model, distractors)
    size = min(len(rows), 39 * 16)  # max(nlist, 2^4 codebook centroids) a centroid
    sample = np.sort(np.random.default_rng(1234).choice(len(rows), size, replace=False))
    scores, ids = faiss_own_pqfs(rows, model.text, sample, 8, 12, 3, refine, DEPTH)
    np.testing.assert_array_equal(result.lists["t2i"].ids.numpy(), ids)
    np.testing.assert_array_equal(result.lists["t2i"].scores.numpy(), np.where(ids < 0, -np.inf, scores))
    params = result.params["t2i"]
    assert (params["m"], params["nbits"], params.get("refine"), params.get("k_factor")) == \
        (12, 4, "flat" if refine else None, refine)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_pqfs_recall_against_exact_lists_and_re_ranking_raises_it():
    """Both directions (no gallery): recall computed against exact lists equals a slow count, re-ranking the codes'
    hits by the full vectors raises it, and visiting every list with re-ranking is near exact."""
    model, caption_image = make_case(n_images=1000, dim=32, seed=8, clusters=40)
    exact = compute_model_lists(model.text, model.image, caption_image, 10)
    recall = {}
    for refine, nprobe in ((None, 4), (10, 4), (10, 16)):
        result = faiss_lists(model, caption_image, 10, pqfs(nlist=16, nprobe=nprobe, refine_factor=refine), CPU, None)
        quality = with_quality(result, exact)
        for direction in ("t2i", "i2t"):
            slow = slow_recall(result.lists[direction].ids.numpy(), exact[direction].ids.numpy(), 10).mean()
            assert quality[direction].neighbour_recall == pytest.approx(slow, abs=1e-12)
        recall[refine, nprobe] = quality["t2i"].neighbour_recall
        assert result.params["t2i"] == {**ann.build_params(pqfs(nlist=16, nprobe=nprobe, refine_factor=refine), 1000, 32, "m"),
                                        "nprobe": nprobe, **({"k_factor": refine} if refine else {})}
    assert recall[10, 4] > recall[None, 4] + 0.1, recall
    assert recall[10, 16] >= 0.97, recall


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_pqfs_is_stored_read_back_and_never_taken_for_another_index(gallery, tmp_path):  # noqa: F811
    model, caption_image, distractors = gallery
    config = pqfs(nlist=8, nprobe=3, pq_m=5, refine_factor=4)  # width 24 padded to 25
    first, exact = lists(model, caption_image, distractors, config, tmp_path)
    again, _ = lists(model, caption_image, distractors, replace(config, nprobe=4), tmp_path, exact)
    assert not first.costs["t2i"].hit and again.costs["t2i"].hit
    assert first.params["t2i"]["width"] == 25
    same, _ = lists(model, caption_image, distractors, config, tmp_path, exact)
    np.testing.assert_array_equal(same.lists["t2i"].ids.numpy(), first.lists["t2i"].ids.numpy())
    keys = {first.costs["t2i"].key}
    for other in (replace(config, refine_factor=None), replace(config, index="ivf_pq", nbits=4)):
        result, _ = lists(model, caption_image, distractors, other, tmp_path, exact)
        assert not result.costs["t2i"].hit and result.costs["t2i"].key not in keys
        keys.add(result.costs["t2i"].key)
    # a read-back IVF-PQ is not taken for a fast-scan one, nor the other way round
    ivfpq = faiss.IndexIVFPQ(faiss.IndexFlatIP(16), 16, 2, 4, 4, faiss.METRIC_INNER_PRODUCT)
    material = {"index": "ivf_pqfs", "n": 0, "dim": 16, "build": {"nlist": 2, "m": 4, "nbits": 4}}
    assert "expected a IndexIVFPQFastScan" in index_problem(ivfpq, material)
    fast = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(16), 16, 2, 4, 4, faiss.METRIC_INNER_PRODUCT)
    assert index_problem(fast, material) is None
    assert "m=4 (expected 8)" in index_problem(fast, {**material, "build": {**material["build"], "m": 8}})
    assert "expected a IndexIVFPQ" in index_problem(fast, {**material, "index": "ivf_pq"})


def test_pqfs_layout_memory_and_size_checks():
    # automatic m: one 4-bit sub-quantizer per 2 dimensions (zero-padded to even), at most 256
    assert pq_layout(pqfs(), 258, "m") == (129, 258)
    assert pq_layout(pqfs(), 257, "m") == (129, 258)
    assert pq_layout(pqfs(), 1152, "m") == (256, 1280)
    assert pq_layout(pqfs(pq_m=64), 258, "m") == (64, 320)
    assert ann.build_params(pqfs(nlist=None, refine_factor=10), 1_000_000, 258, "m") == \
        {"nlist": 1000, "m": 129, "nbits": 4, "seed": 1234, "refine": "flat"}  # sqrt(n) lists: longer, for fast scan
    assert [fastscan_nlist(n) for n in (10, 1000, 15_000, 1_005_000)] == [1, 25, 122, 1002]  # at most n / 39 a list
    assert ann.build_params(SearchConfig(backend="faiss", index="ivf_flat", nlist=None), 1_000_000, 258, "m")["nlist"] \
        == 4000  # IVF-Flat's and IVF-PQ's automatic nlist unchanged
    # fast-scan lists stay in memory whatever the budget: counted in the structure, never sent to disk
    build = {"nlist": 100, "m": 129, "nbits": 4, "seed": 1234}
    plan = gallery_index.memory_plan("ivf_pqfs", 100_000, 258, build, GALLERY_CHUNK, None)
    assert plan.codes_bytes == 0 and not plan.on_disk
    assert plan.structure_bytes >= 100_000 * (65 + 8)
    with pytest.raises(FusebenchError, match="fast-scan lists stay in memory") as err:
        gallery_index.memory_plan("ivf_pqfs", 100_000, 258, build, GALLERY_CHUNK, 0.001)
    assert "\n" not in str(err.value)
    with pytest.raises(FusebenchError, match="needs at least 16 items"):
        check_sizes(pqfs(nlist=1, nprobe=1), {"t2i": 12, "i2t": 40}, 10)
    assert pqfs(target_recall=0.95).tuned == "nprobe"


@pytest.mark.slow  # compositions
def test_the_preset_composes_and_refuses_the_settings_it_does_not_read(compose_cfg):
    config = run_config(compose_cfg(["search=faiss_ivf_pqfs_recall95"])).search
    assert (config.index, config.refine_factor, config.target_recall, config.nlist) == ("ivf_pqfs", 5, 0.95, None)
    assert config.label() == "faiss ivf_pqfs nlist=auto m=auto nbits=4 refine_factor=5 target_recall=0.95"
    with pytest.raises(FusebenchError, match="search.nbits") as err:  # 4-bit codes: nbits is IVF-PQ's
        run_config(compose_cfg(["search=faiss_ivf_pqfs_recall95", "search.nbits=6"]))
    assert "\n" not in str(err.value)
    with pytest.raises(FusebenchError, match="search.index=ivf_pqfs"):
        run_config(compose_cfg(["search=lancedb", "search.index=ivf_pqfs"]))


@pytest.mark.slow  # runs two jobs
def test_the_preset_as_a_job_records_its_settings_and_a_rerun_reads_the_stored_index(compose_cfg, tmp_path):
    args = ["search=faiss_ivf_pqfs_recall95", "gallery=sim", "gallery.size=3000", "gallery.near_duplicate=null",
            "dataset.n_images=200", "dataset.n_captions=600", "search.tune_images=50", "eval.bootstrap.draws=50",
            "plots=false", "logger=none", f"embed.cache.dir={tmp_path / 'cache'}"]
    records = []
    for out in (tmp_path / "a", tmp_path / "b"):
        run(compose_cfg(args), str(out))
        records.append(json.loads((out / "metrics.json").read_text()))
    for record, hit in zip(records, (False, True)):
        search = record["search"]
        assert search["index"] == "ivf_pqfs" and search["label"].startswith("faiss ivf_pqfs")
        for name, model in search["models"].items():
            t2i = model["t2i"]
            assert t2i["hit"] is hit and t2i["target"]["setting"] == "nprobe", name
            assert t2i["neighbour_recall"] >= 0.9
        params = search["params"]["t2i"]
        for p in params.values() if "nbits" not in params else [params]:
            assert (p["nbits"], p["refine"], p["k_factor"], p["nlist"]) == (4, "flat", 5, 57)  # sqrt(3,200)
    assert records[0]["retrievers"]["fused"] == records[1]["retrievers"]["fused"]


@pytest.mark.slow  # compositions
def test_the_gallery_study_runs_every_faiss_family_at_the_target(compose_cfg):
    """experiment=gallery_indexes: exact, IVF-Flat, IVF fast-scan PQ re-ranked and the light HNSW, each FAISS family
    at neighbour recall 0.95, with the engines; the HNSW preset's build settings are the ones recorded."""
    from omegaconf import OmegaConf

    from fusebench.app.cli import CONFIG_DIR

    study = OmegaConf.load(f"{CONFIG_DIR}/experiment/gallery_indexes.yaml")
    searches = str(study.hydra.sweeper.params.search).split(",")
    assert searches[:4] == ["exact", "faiss_ivf_flat_lists_recall95", "faiss_ivf_pqfs_recall95", "faiss_hnsw_m16_recall95"]
    indexes = set()
    for name in searches:
        config = run_config(compose_cfg([f"search={name}"])).search
        if config.backend == "faiss":
            assert config.target_recall == 0.95, name
            indexes.add(config.index)
    assert indexes == {"ivf_flat", "ivf_pqfs", "hnsw"}
    hnsw = run_config(compose_cfg(["search=faiss_hnsw_m16_recall95"])).search
    assert ann.build_params(hnsw, 1_000_000, 258, "m") == {"M": 16, "efConstruction": 100}
    assert hnsw.label() == "faiss hnsw M=16 efConstruction=100 target_recall=0.95"


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_light_hnsw_reaches_its_target_against_exact_lists_and_is_read_back(gallery, tmp_path):  # noqa: F811
    model, caption_image, distractors = gallery
    config = SearchConfig(backend="faiss", index="hnsw", hnsw_m=16, ef_construction=100, target_recall=0.95)
    first, exact = lists(model, caption_image, distractors, config, tmp_path)
    again, _ = lists(model, caption_image, distractors, config, tmp_path, exact)
    assert not first.costs["t2i"].hit and again.costs["t2i"].hit
    recall = slow_recall(first.lists["t2i"].ids.numpy(), exact["t2i"].ids.numpy()[:, :DEPTH], DEPTH).mean()
    assert recall >= 0.9 and with_quality(first, exact)["t2i"].neighbour_recall == pytest.approx(recall, abs=1e-12)
    assert first.params["t2i"]["M"] == 16 and first.params["t2i"]["efConstruction"] == 100
    np.testing.assert_array_equal(again.lists["t2i"].ids.numpy(), first.lists["t2i"].ids.numpy())


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_every_stage_of_a_tuned_gallery_index_moves_a_bar_to_its_end(gallery):  # noqa: F811
    """Issue 41, item 4: at a million the training sample's read, the tuning's exact reference and its tries take
    minutes; each shows a bar (its total known up front, so the time left is estimated), counted to the end."""
    model, caption_image, distractors = gallery
    counts = {}

    def progress(desc, total):
        counts[desc] = [total, 0]
        return lambda n: counts[desc].__setitem__(1, counts[desc][1] + n)

    config = pqfs(nlist=8, refine_factor=4, target_recall=0.9)
    with_rows = replace(model, distractors=distractors)
    from test_gallery_index import exact_over, tuning_queries

    faiss_lists(with_rows, caption_image, DEPTH, config, CPU, None, progress=progress,
                exact=exact_over(model, caption_image, distractors), tuning=tuning_queries(model))
    n = 300 + len(distractors.rows)
    tries = counts.pop("tuning m t2i: nprobe tried")
    assert 1 <= tries[1] <= tries[0]  # the tries end when the target is reached: at most the bar's total
    assert counts == {"index m t2i (gallery): training sample read": [n, n], "index m t2i (gallery)": [n, n],
                      "tuning m t2i: exact reference": [n, n], "search m t2i": [len(model.text)] * 2}
