"""FAISS indexes over a gallery (fusebench.backends.gallery_index, faiss_index._gallery_lists): lists equal FAISS's
own index built over the same rows in memory (flat: equal to exact search over the gallery), the stored index is
keyed by the gallery (another size, source, seed or near-duplicate drop is another index), a build killed midway
is rebuilt, never read, lists on disk equal lists in memory, and search.max_memory_gb too small is one line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

faiss = pytest.importorskip("faiss")

from test_ann import assert_same_up_to_ties, make_case  # noqa: E402

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends import gallery_index, target_recall  # noqa: E402
from fusebench.backends.faiss_index import GALLERY_CHUNK, _tile_blocks, faiss_lists  # noqa: E402
from fusebench.backends.quality import with_quality  # noqa: E402
from fusebench.backends.target_recall import TuningQueries  # noqa: E402
from fusebench.config.search import SearchConfig  # noqa: E402
from fusebench.encoders.distractors import ArrayRows, FirstRows, KeptRows  # noqa: E402
from fusebench.search.gallery_search import GalleryTiles, gallery_lists  # noqa: E402
from fusebench.stores.indexes import IndexStore  # noqa: E402

CPU = torch.device("cpu")
DEPTH = 20
N_DISTRACTORS = 2700


@pytest.fixture(scope="module")
def gallery():
    """A clustered test split of 300 images and 2,700 distractors around the same centres (some close to images)."""
    model, caption_image = make_case(n_images=300, dim=24, seed=9, clusters=12)
    rng = np.random.default_rng(4)
    rows = model.image[rng.integers(0, 300, N_DISTRACTORS)] + 0.6 * rng.standard_normal((N_DISTRACTORS, 24))
    return model, caption_image, ArrayRows(rows.astype(np.float32), label="test gallery")


def exact_over(model, caption_image, distractors):
    return gallery_lists(model.text, model.image, caption_image, distractors, DEPTH, CPU, 4096, 16384, lambda _n: None)


def tuning_queries(model) -> TuningQueries:
    """Captions of another split of the same kind (the test captions moved a little, a sample of them)."""
    rng = np.random.default_rng(8)
    text = model.text[rng.choice(len(model.text), 200, replace=False)] + 0.1 * rng.standard_normal((200, 24))
    text = (text / np.linalg.norm(text, axis=1, keepdims=True)).astype(np.float32)
    return TuningQueries("split", "val", 60, 200, {model.name: {"t2i": text, "i2t": model.image[:60]}})


def lists(model, caption_image, distractors, config, store=None, exact=None):
    with_rows = replace(model, distractors=distractors)
    exact = exact if exact is not None else exact_over(model, caption_image, distractors)
    tuning = tuning_queries(model) if config.target_recall is not None else None
    return faiss_lists(with_rows, caption_image, DEPTH, config, CPU, store, exact=exact, tuning=tuning), exact


def all_rows(model, distractors) -> np.ndarray:
    return np.vstack([model.image, distractors.read(0, distractors.n)]).astype(np.float32)


def faiss_own(kind: str, rows: np.ndarray, queries: np.ndarray, sample: np.ndarray | None, settings: dict):
    """FAISS's own index over ``rows`` held in memory, as its documentation builds one; IVF trained on
    ``rows[sample]``; rows added in the gallery's tiles (HNSW's graph depends on the batches it is given)."""
    d, ip = rows.shape[1], faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, settings["hnsw_m"], ip)
        index.hnsw.efConstruction = settings["ef_construction"]
        index.hnsw.efSearch = settings["ef_search"]
    else:
        if kind == "ivf_flat":
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, settings["nlist"], ip)
        else:
            index = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, settings["nlist"], settings["pq_m"], 8, ip)
            index.pq.cp.seed = 1234
            index.pq.cp.min_points_per_centroid = 1
        index.cp.seed = 1234
        index.train(rows[sample])
        index.nprobe = settings["nprobe"]
        if settings.get("refine_factor"):  # FAISS's own re-ranking by the full vectors (added with the codes)
            index = faiss.IndexRefineFlat(index)
            index.k_factor = settings["refine_factor"]
    for start in range(0, len(rows), GALLERY_CHUNK):
        index.add(rows[start:start + GALLERY_CHUNK])
    return index.search(queries, DEPTH)


def test_flat_over_a_gallery_equals_exact_search_over_it(gallery):
    model, caption_image, distractors = gallery
    result, exact = lists(model, caption_image, distractors, SearchConfig(backend="faiss", index="flat"))
    ids, scores = result.lists["t2i"].ids.numpy(), result.lists["t2i"].scores.numpy()
    assert ids.max() >= 300  # distractors are listed, by their gallery index
    assert_same_up_to_ties(ids, scores, exact["t2i"].ids.numpy(), exact["t2i"].scores.numpy(), least_identical=0.99)
    ex_ranks = exact["t2i"].ranks
    np.testing.assert_array_equal(result.lists["t2i"].ranks, np.where(ex_ranks <= DEPTH, ex_ranks, 0))
    # i2t stays exact search's: distractors ask no i2t query and are no i2t item
    np.testing.assert_array_equal(result.lists["i2t"].ids.numpy(), exact["i2t"].ids.numpy())
    np.testing.assert_array_equal(result.lists["i2t"].ranks, exact["i2t"].ranks)
    quality = with_quality(result, exact)
    assert list(quality) == ["t2i"] and quality["t2i"].neighbour_recall == 1.0


@pytest.mark.parametrize("kind,settings", [
    ("ivf_flat", {"nlist": 16, "nprobe": 4}),
    pytest.param("ivf_pq", {"nlist": 8, "nprobe": 3, "pq_m": 6}, marks=pytest.mark.slow),
    pytest.param("ivf_pq", {"nlist": 8, "nprobe": 3, "pq_m": 6, "refine_factor": 4}, marks=pytest.mark.slow),
    pytest.param("hnsw", {"hnsw_m": 8, "ef_construction": 40, "ef_search": 40}, marks=pytest.mark.slow),
])
def test_an_index_over_a_gallery_equals_faiss_own_over_the_same_rows(gallery, kind, settings, monkeypatch):
    model, caption_image, distractors = gallery
    monkeypatch.setattr(gallery_index, "TRAIN_CAP", 0)  # a real sample: 39 rows a centroid, not every row
    config = SearchConfig(backend="faiss", index=kind, threads=1, **settings)
    result, _exact = lists(model, caption_image, distractors, config)
    rows = all_rows(model, distractors)
    sample = None
    if kind != "hnsw":
        centroids = max(settings["nlist"], 256 if kind == "ivf_pq" else 0)
        size = min(len(rows), 39 * centroids)
        sample = (np.sort(np.random.default_rng(1234).choice(len(rows), size, replace=False)) if size < len(rows)
                  else np.arange(len(rows)))
        assert kind != "ivf_flat" or len(sample) < len(rows)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # HNSW's build is deterministic on one thread
    try:
        scores, ids = faiss_own(kind, rows, model.text, sample, settings)
    finally:
        faiss.omp_set_num_threads(threads)
    np.testing.assert_array_equal(result.lists["t2i"].ids.numpy(), ids)
    np.testing.assert_array_equal(result.lists["t2i"].scores.numpy(), np.where(ids < 0, -np.inf, scores))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_refine_keeps_the_full_vectors_in_memory_and_raises_neighbour_recall(gallery):
    """search.refine_factor: the memory plan counts the full vectors IndexRefineFlat holds, and re-ranking the
    codes' hits by them raises neighbour recall over the same IVF-PQ index without it."""
    build = {"nlist": 8, "m": 6, "nbits": 8, "seed": 1234}
    plain = gallery_index.memory_plan("ivf_pq", 3000, 24, build, GALLERY_CHUNK, None)
    refined = gallery_index.memory_plan("ivf_pq", 3000, 24, {**build, "refine": "flat"}, GALLERY_CHUNK, None)
    assert refined.structure_bytes - plain.structure_bytes == 4 * 24 * 3000
    model, caption_image, distractors = gallery
    recall = {}
    for refine in (None, 4):
        config = SearchConfig(backend="faiss", index="ivf_pq", nlist=8, nprobe=3, pq_m=6, refine_factor=refine)
        result, exact = lists(model, caption_image, distractors, config)
        recall[refine] = with_quality(result, exact)["t2i"].neighbour_recall
        assert result.params["t2i"].get("refine") == ("flat" if refine else None)
        assert result.params["t2i"].get("k_factor") == refine
    assert recall[4] > recall[None] + 0.1, recall
    # a target the codes alone cannot reach is reached with re-ranking: nprobe chosen with k_factor in place
    config = SearchConfig(backend="faiss", index="ivf_pq", nlist=8, pq_m=6, refine_factor=4, target_recall=0.95)
    result, exact = lists(model, caption_image, distractors, config)
    target = result.costs["t2i"].target
    assert target["sample_recall_low"] >= 0.95 and with_quality(result, exact)["t2i"].neighbour_recall >= 0.93, target


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("pq_m,budget", [(6, None), (5, None), (6, 1e-4)])  # 5: padded to width 25; 1e-4: on disk
def test_a_refined_index_is_stored_read_back_and_never_taken_for_an_unrefined_one(gallery, tmp_path, pq_m, budget,
                                                                                   caplog):
    """IndexRefineFlat around the IVF-PQ (padded or not, lists in memory or on disk) is read back from the store
    on the next run with the same lists; the same index without re-ranking is another key."""
    model, caption_image, distractors = gallery
    build = {"nlist": 8, "m": pq_m, "nbits": 8, "seed": 1234, "refine": "flat"}
    plan = gallery_index.memory_plan("ivf_pq", 3000, 24, build, GALLERY_CHUNK, None)
    budget_gb = None if budget is None else (plan.structure_bytes + 1000) / 1e9  # the structure fits, the codes not
    config = SearchConfig(backend="faiss", index="ivf_pq", nlist=8, nprobe=3, pq_m=pq_m, refine_factor=4,
                          max_memory_gb=budget_gb)
    if budget is not None:
        assert gallery_index.memory_plan("ivf_pq", 3000, 24, build, GALLERY_CHUNK, budget_gb).on_disk
    first, exact = lists(model, caption_image, distractors, config, tmp_path)
    again, _ = lists(model, caption_image, distractors, config, tmp_path, exact)
    assert not first.costs["t2i"].hit and again.costs["t2i"].hit, caplog.text
    assert "corrupt" not in caplog.text.lower() and "expected" not in caplog.text
    np.testing.assert_array_equal(again.lists["t2i"].ids.numpy(), first.lists["t2i"].ids.numpy())
    plain, _ = lists(model, caption_image, distractors, replace(config, refine_factor=None), tmp_path, exact)
    assert not plain.costs["t2i"].hit and plain.costs["t2i"].key != first.costs["t2i"].key


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_stored_index_is_keyed_by_the_gallery(gallery, tmp_path):
    model, caption_image, distractors = gallery
    config = SearchConfig(backend="faiss", index="ivf_flat", nlist=16, nprobe=4)
    first, _ = lists(model, caption_image, distractors, config, tmp_path)
    again, _ = lists(model, caption_image, distractors, config, tmp_path)
    assert not first.costs["t2i"].hit and again.costs["t2i"].hit
    assert again.costs["t2i"].key == first.costs["t2i"].key
    keep = np.flatnonzero(np.arange(N_DISTRACTORS) % 7 != 0)  # another near-duplicate threshold drops other rows
    other_rows = np.random.default_rng(8).standard_normal((N_DISTRACTORS, 24)).astype(np.float32)
    variants = {"size": FirstRows(distractors, 2000), "near-duplicates": KeptRows(distractors, keep),
                "source": ArrayRows(other_rows, label="another source"),
                "seed": ArrayRows(distractors.rows[np.random.default_rng(2).permutation(N_DISTRACTORS)],
                                  label="test gallery")}  # the same source in another seeded order
    keys = {first.costs["t2i"].key}
    for what, rows in variants.items():
        built, exact = lists(model, caption_image, rows, config, tmp_path)
        assert not built.costs["t2i"].hit, what  # rebuilt, never read
        keys.add(built.costs["t2i"].key)
        reference, _ = lists(model, caption_image, rows, config, None, exact)  # what this gallery's index gives
        np.testing.assert_array_equal(built.lists["t2i"].ids.numpy(), reference.lists["t2i"].ids.numpy())
    assert len(keys) == 1 + len(variants)
    entries = IndexStore(tmp_path).entries()
    assert len(entries) == 1 + len(variants) and all(e["complete"] for e in entries)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_lists_on_disk_equal_lists_in_memory_and_a_killed_build_is_rebuilt(gallery, tmp_path, caplog):
    model, caption_image, distractors = gallery
    memory, exact = lists(model, caption_image, distractors,
                          SearchConfig(backend="faiss", index="ivf_flat", nlist=16, nprobe=4), tmp_path)
    plan = gallery_index.memory_plan("ivf_flat", 3000, 24, {"nlist": 16}, GALLERY_CHUNK, None)
    budget = (plan.structure_bytes + plan.codes_bytes // 2) / 1e9  # the structure fits, the codes do not
    config = SearchConfig(backend="faiss", index="ivf_flat", nlist=16, nprobe=4, max_memory_gb=budget)
    disk, _ = lists(model, caption_image, distractors, config, tmp_path, exact)
    assert disk.params["t2i"]["on_disk"] and "on_disk" not in memory.params["t2i"]
    assert disk.costs["t2i"].key != memory.costs["t2i"].key
    np.testing.assert_array_equal(disk.lists["t2i"].ids.numpy(), memory.lists["t2i"].ids.numpy())
    np.testing.assert_array_equal(disk.lists["t2i"].scores.numpy(), memory.lists["t2i"].scores.numpy())
    folder = IndexStore(tmp_path).entry_dir(disk.costs["t2i"].key)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["ivfdata"]["path"] == str(folder / "index.ivfdata")
    assert (folder / "index.ivfdata").stat().st_size == 3000 * (4 * 24 + 8)  # compacted: exactly codes and ids
    assert sorted(p.name for p in folder.iterdir()) == ["index.faiss", "index.ivfdata", "meta.json"]
    listed = {e["key"]: e for e in IndexStore(tmp_path).entries()}  # fusebench-cache checks the lists' file too
    assert listed[disk.costs["t2i"].key]["complete"]
    read, _ = lists(model, caption_image, distractors, config, tmp_path, exact)  # read back, lists memory-mapped
    assert read.costs["t2i"].hit
    np.testing.assert_array_equal(read.lists["t2i"].ids.numpy(), memory.lists["t2i"].ids.numpy())
    # killed mid-build: the lists file written, meta.json (written last) never
    (folder / "meta.json").unlink()
    rebuilt, _ = lists(model, caption_image, distractors, config, tmp_path, exact)
    assert not rebuilt.costs["t2i"].hit and "never finished" in caplog.text
    np.testing.assert_array_equal(rebuilt.lists["t2i"].ids.numpy(), memory.lists["t2i"].ids.numpy())
    # a flipped byte in the lists on disk: found by the checksum, rebuilt
    data = bytearray((folder / "index.ivfdata").read_bytes())
    data[100] ^= 0xFF
    (folder / "index.ivfdata").write_bytes(bytes(data))
    assert not {e["key"]: e for e in IndexStore(tmp_path).entries()}[disk.costs["t2i"].key]["complete"]
    again, _ = lists(model, caption_image, distractors, config, tmp_path, exact)
    assert not again.costs["t2i"].hit and "index.ivfdata does not match its recorded checksum" in caplog.text
    np.testing.assert_array_equal(again.lists["t2i"].ids.numpy(), memory.lists["t2i"].ids.numpy())


@pytest.mark.parametrize("kind,settings,fragments", [
    ("ivf_flat", {"nlist": 16, "nprobe": 4}, ("for its quantizer, codebooks, training sample", "a smaller search.nlist")),
    ("flat", {}, ("a flat index of 3,000 vectors", "search.index=ivf_flat | ivf_pq")),
    ("hnsw", {}, ("vectors and graph (HNSW keeps no part on disk)",)),
])
def test_max_memory_too_small_for_the_index_structure_is_one_line(gallery, kind, settings, fragments):
    model, caption_image, distractors = gallery
    config = SearchConfig(backend="faiss", index=kind, max_memory_gb=1e-5, **settings)
    with pytest.raises(FusebenchError) as err:
        faiss_lists(replace(model, distractors=distractors), caption_image, DEPTH, config, CPU, None,
                    exact=exact_over(model, caption_image, distractors))
    message = str(err.value)
    assert "\n" not in message and "search.max_memory_gb=1e-05 is less than the" in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_max_memory_is_checked_and_lists_on_disk_need_the_store(gallery):
    with pytest.raises(FusebenchError, match=r"search.max_memory_gb=0 is not valid.*> 0"):
        SearchConfig(backend="faiss", index="ivf_flat", max_memory_gb=0)
    model, caption_image, distractors = gallery
    plan = gallery_index.memory_plan("ivf_flat", 3000, 24, {"nlist": 16}, GALLERY_CHUNK, None)
    config = SearchConfig(backend="faiss", index="ivf_flat", nlist=16, nprobe=4,
                          max_memory_gb=(plan.structure_bytes + 1) / 1e9)
    with pytest.raises(FusebenchError, match="eval.lists.store=false keeps no store"):
        lists(model, caption_image, distractors, config)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_target_recall_over_a_gallery_is_measured_against_exact_search_over_every_gallery_item(gallery):
    model, caption_image, distractors = gallery
    config = SearchConfig(backend="faiss", index="ivf_flat", nlist=16, target_recall=0.9)
    result, exact = lists(model, caption_image, distractors, config)
    quality = with_quality(result, exact)["t2i"]
    target = quality.target
    assert target["sample_recall_low"] >= 0.9 and result.params["t2i"]["nprobe"] == target["value"]
    assert target["queries"]["captions"] == 200 and quality.neighbour_recall > 0.85
    # the tuning queries' exact reference: every gallery item (test images, then distractors), tile by tile
    queries = tuning_queries(model).rows["m"]["t2i"]
    rows = all_rows(model, distractors)
    tiles = GalleryTiles(model.image, distractors, 1000)  # tiles astride the test/distractor boundary
    got = target_recall.exact_top(queries, _tile_blocks(tiles), DEPTH)
    scores = queries @ rows.T
    want = np.array([sorted(range(len(rows)), key=lambda i: (-scores[q, i], i))[:DEPTH] for q in range(len(queries))])
    np.testing.assert_array_equal(got, want)


def test_the_training_sample_is_read_tile_by_tile_with_a_bar_over_the_gallery(gallery):
    model, _caption_image, distractors = gallery
    rows = all_rows(model, distractors)
    tiles = GalleryTiles(model.image, distractors, 1000)
    sample = gallery_index.train_sample(len(rows), 700, 5)
    moved = []
    np.testing.assert_array_equal(gallery_index.read_rows(tiles, sample, moved.append), rows[sample])
    assert sum(moved) == len(rows) and len(moved) == len(tiles.tiles)  # every tile, read or passed over


def test_train_sample_sizes():
    assert gallery_index.train_size("flat", 10**6, {}) == 0
    assert gallery_index.train_size("ivf_flat", 10**6, {"nlist": 4000}) == gallery_index.TRAIN_CAP
    assert gallery_index.train_size("ivf_flat", 10**7, {"nlist": 10_000}) == 390_000  # never below 39 a centroid
    assert gallery_index.train_size("ivf_flat", 10**6, {"nlist": 100}) == 25_600
    assert gallery_index.train_size("ivf_pq", 10**6, {"nlist": 100, "nbits": 8}) == 65_536
    assert gallery_index.train_size("ivf_flat", 3000, {"nlist": 100}) == 3000
    sample = gallery_index.train_sample(1000, 100, 5)
    assert len(np.unique(sample)) == 100 and (np.diff(sample) > 0).all()
    np.testing.assert_array_equal(gallery_index.train_sample(50, 100, 5), np.arange(50))
