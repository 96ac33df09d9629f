"""The index store (fusebench.stores.indexes): an index is built once per items and build parameters and read back
by later jobs (whatever their search-time parameters); a damaged, partial or foreign entry is reported and
rebuilt, never read; fusebench-cache lists and removes index entries."""

import json
import logging
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

faiss = pytest.importorskip("faiss")

from fusebench.app import cache_cli  # noqa: E402
from fusebench.backends import faiss_index as ann  # noqa: E402
from fusebench.backends.faiss_index import faiss_lists  # noqa: E402
from fusebench.config.search import SearchConfig  # noqa: E402
from fusebench.encoders.base import ModelEmbeddings  # noqa: E402
from fusebench.stores.indexes import DATA, IndexStore, index_material, index_problem  # noqa: E402

CPU = torch.device("cpu")


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(2)
    caption_image = np.repeat(np.arange(200), rng.integers(0, 3, 200))
    image = _unit(rng.standard_normal((200, 16)))
    text = _unit(image[caption_image] + 0.8 * rng.standard_normal((len(caption_image), 16)))
    return ModelEmbeddings("m", image, text), caption_image


def config(index="ivf_flat", **settings) -> SearchConfig:
    """One thread (the same k-means every build); IVF: 4 lists, 2 visited, unless ``settings`` say otherwise."""
    ivf = {"nlist": 4, "nprobe": 2} if index.startswith("ivf") else {}
    return SearchConfig(backend="faiss", index=index, **{"threads": 1, **ivf, **settings})


def run(case, store, search=None, depth=10):
    model, caption_image = case
    return faiss_lists(model, caption_image, depth, search or config(), CPU, None if store is None else str(store))


def assert_same(one, other):
    for name, array in one.lists.arrays().items():
        np.testing.assert_array_equal(array, other.lists.arrays()[name], err_msg=name)


def no_build(monkeypatch):
    monkeypatch.setattr(ann, "build_index", lambda *a, **k: pytest.fail("built an index the store holds"))


def entries(store) -> list[Path]:
    return [Path(e["path"]) for e in IndexStore(store).entries()]


def test_a_stored_index_is_read_back_for_any_search_time_parameter(case, tmp_path, monkeypatch):
    fresh = run(case, None)
    first = run(case, tmp_path)
    assert all(c.stored and not c.hit and c.build_seconds is not None and c.key for c in first.costs.values())
    assert len(entries(tmp_path)) == 2  # one index per direction
    with monkeypatch.context() as patch:
        no_build(patch)
        again = run(case, tmp_path)
        assert all(c.hit and c.stored and c.build_seconds is None for c in again.costs.values())
        assert {d: c.key for d, c in again.costs.items()} == {d: c.key for d, c in first.costs.items()}
        assert {d: c.index_bytes for d, c in again.costs.items()} == {d: c.index_bytes for d, c in first.costs.items()}
        assert_same(first, fresh)
        assert_same(again, fresh)
        wider = run(case, tmp_path, config(nprobe=4))  # nprobe is a search-time parameter: the same index
        assert all(c.hit for c in wider.costs.values()) and wider.params["t2i"]["nprobe"] == 4
    np.testing.assert_array_equal(wider.lists["t2i"].ids.numpy(), run(case, None, config(nprobe=4)).lists["t2i"].ids.numpy())
    with monkeypatch.context() as patch:
        run(case, tmp_path, config("hnsw", ef_search=40))
        no_build(patch)
        assert all(c.hit for c in run(case, tmp_path, config("hnsw", ef_search=80)).costs.values())


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_other_build_parameters_or_items_build_another_index(case, tmp_path):
    model, caption_image = case
    run(case, tmp_path)
    assert not any(c.hit for c in run(case, tmp_path, config(nlist=5)).costs.values())
    assert not any(c.hit for c in run(case, tmp_path, config(seed=7)).costs.values())
    assert not any(c.hit for c in run(case, tmp_path, config("ivf_pq", pq_m=4, nbits=4)).costs.values())
    assert not any(c.hit for c in run(case, tmp_path, config("ivf_pq", pq_m=8, nbits=4)).costs.values())
    image = model.image.copy()
    image[0] = image[1]
    other = faiss_lists(ModelEmbeddings("m", image, model.text), caption_image, 10, config(), CPU, str(tmp_path))
    assert not other.costs["t2i"].hit and other.costs["i2t"].hit  # only the image index's items changed
    assert len(entries(tmp_path)) == 2 + 2 + 2 + 2 + 2 + 1


def _flip(folder: Path):
    data = bytearray((folder / DATA).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / DATA).write_bytes(bytes(data))


def _truncate(folder: Path):
    data = (folder / DATA).read_bytes()
    (folder / DATA).write_bytes(data[: len(data) // 3])


def _no_meta(folder: Path):  # killed after the index file, before meta.json
    (folder / "meta.json").unlink()


def _foreign_meta(folder: Path):  # another entry's meta.json copied over this one's
    other = next(p for p in folder.parent.parent.glob("??/*") if p.is_dir() and p != folder)
    (folder / "meta.json").write_text((other / "meta.json").read_text())


def _checksummed_other_index(folder: Path):
    """A readable index of the wrong size, with a meta.json whose size and checksum match it: only reading it back
    can tell."""
    import zlib

    meta = json.loads((folder / "meta.json").read_text())
    other = faiss.IndexFlatIP(meta["d"])
    other.add(np.eye(meta["d"], dtype=np.float32))
    data = faiss.serialize_index(other)
    (folder / DATA).write_bytes(data.tobytes())
    meta.update(bytes=int(data.nbytes), crc32=f"{zlib.crc32(data.tobytes()):08x}")
    (folder / "meta.json").write_text(json.dumps(meta))


def _directory(folder: Path):
    (folder / DATA).unlink()
    (folder / DATA).mkdir()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("damage", [_flip, _truncate, _no_meta, _foreign_meta, _checksummed_other_index, _directory])
@pytest.mark.parametrize("index", ["flat", "ivf_flat"])
def test_a_damaged_entry_is_reported_and_rebuilt(case, tmp_path, caplog, monkeypatch, damage, index):
    search = config(index)
    fresh = run(case, None, search)
    run(case, tmp_path, search)
    t2i = next(f for f in entries(tmp_path) if json.loads((f / "meta.json").read_text())["material"]["direction"] == "t2i")
    damage(t2i)
    caplog.set_level(logging.WARNING)
    rebuilt = run(case, tmp_path, search)
    assert not rebuilt.costs["t2i"].hit and rebuilt.costs["t2i"].stored and rebuilt.costs["i2t"].hit
    assert "index store entry" in caplog.text and "corrupt or outdated" in caplog.text
    assert str(t2i) in caplog.text
    assert_same(rebuilt, fresh)
    caplog.clear()
    with monkeypatch.context() as patch:
        no_build(patch)
        again = run(case, tmp_path, search)  # whole again
    assert all(c.hit for c in again.costs.values()) and not caplog.text
    assert_same(again, fresh)


def test_index_problem_checks_count_width_metric_kind_and_build_parameters():
    rng = np.random.default_rng(0)
    x = _unit(rng.standard_normal((100, 8)))
    material = index_material("d", 100, 8, "t2i", "ivf_flat", {"nlist": 4, "seed": 1}, "faiss x")
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(8), 8, 4, faiss.METRIC_INNER_PRODUCT)
    ivf.train(x)
    ivf.add(x)
    back = faiss.deserialize_index(faiss.serialize_index(ivf))
    assert index_problem(back, material) is None
    assert "expected 101 of width 8" in index_problem(back, {**material, "n": 101})
    assert "nlist=4 (expected 5)" in index_problem(back, {**material, "build": {"nlist": 5}})
    assert "holds a IndexIVFFlat, expected a IndexHNSWFlat" in index_problem(back, {**material, "index": "hnsw"})
    l2 = faiss.IndexFlatL2(8)
    l2.add(x)
    assert "IndexFlatL2" in index_problem(l2, {**material, "index": "flat", "build": {}})
    hnsw = faiss.IndexHNSWFlat(8, 6, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(x)
    hnsw_material = {**material, "index": "hnsw", "build": {"M": 8, "efConstruction": 40}}
    assert "M=6 (expected 8)" in index_problem(faiss.deserialize_index(faiss.serialize_index(hnsw)), hnsw_material)


def test_an_unwritable_store_keeps_the_index_and_stores_nothing(case, tmp_path, monkeypatch, caplog):
    fresh = run(case, None)

    def refuse(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("fusebench.stores.indexes._write_index_synced", refuse)
    result = run(case, tmp_path)
    assert_same(result, fresh)
    assert not any(c.stored or c.hit for c in result.costs.values()) and "could not store the index" in caplog.text
    assert IndexStore(tmp_path).entries() == []


def test_fusebench_cache_lists_and_removes_index_entries(case, tmp_path, capsys):
    run(case, tmp_path)
    listed = IndexStore(tmp_path).entries()
    assert len(listed) == 2 and all(e["complete"] and e["kind"] == "index" for e in listed)
    assert sorted(e["dtype"] for e in listed) == ["ivf_flat i2t", "ivf_flat t2i"]
    assert cache_cli.main(["list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count(" index ") == 2 and " m " in out and "200x16" in out and "complete" in out
    _no_meta(Path(listed[0]["path"]))
    assert cache_cli.main(["list", "--dir", str(tmp_path)]) == 0
    assert "partial" in capsys.readouterr().out
    assert cache_cli.main(["remove", listed[1]["key"][:10], "--dir", str(tmp_path)]) == 0
    assert [e["key"] for e in IndexStore(tmp_path).entries()] == [listed[0]["key"]]
    assert cache_cli.main(["clear", "--yes", "--dir", str(tmp_path)]) == 0
    assert IndexStore(tmp_path).entries() == []
    assert not list((tmp_path / "indexes").glob("??/*.lock"))


def test_listing_and_removing_needs_no_faiss(case, tmp_path, monkeypatch, capsys):
    run(case, tmp_path)
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss now raises ImportError
    assert cache_cli.main(["list", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count(" index ") == 2
    assert cache_cli.main(["clear", "--yes", "--dir", str(tmp_path)]) == 0
    assert IndexStore(tmp_path).entries() == []


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_two_jobs_build_an_index_once(case, tmp_path):
    model, _ = case
    material = index_material("digest", len(model.image), 16, "t2i", "flat", {}, "faiss test")
    builds, results = [], []

    def build():
        builds.append(1)
        time.sleep(0.3)  # the other jobs reach the lock meanwhile
        index = faiss.IndexFlatIP(16)
        index.add(np.ascontiguousarray(model.image))
        return index

    def job():
        results.append(IndexStore(tmp_path).get_or_build(material, build, {"model": "m"}))

    threads = [threading.Thread(target=job) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and sorted(r.hit for r in results) == [False, True, True]
    assert all(r.index.ntotal == len(model.image) and r.stored for r in results)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_padded_ivf_pq_index_is_stored_read_back_and_checked(case, tmp_path, monkeypatch):
    """pq_m=5 on width 16: the vectors are zero-padded to 20 (build parameter ``width``); the stored index is read
    back (no build) with the same lists, and a read-back index is refused when its padding is not the key's."""
    search = config("ivf_pq", pq_m=5, nbits=4)
    first = run(case, tmp_path, search)
    assert first.params["t2i"]["width"] == 20 and not any(c.hit for c in first.costs.values())
    with monkeypatch.context() as patch:
        no_build(patch)
        again = run(case, tmp_path, search)
    assert all(c.hit for c in again.costs.values())
    assert_same(first, again)
    assert not any(c.hit for c in run(case, tmp_path, config("ivf_pq", pq_m=4, nbits=4)).costs.values())  # unpadded
    rng = np.random.default_rng(0)
    x = _unit(rng.standard_normal((100, 16)))
    build = {"nlist": 4, "m": 5, "width": 20, "nbits": 4, "seed": 1}
    padded = ann.build_index(faiss, "ivf_pq", x, build, lambda n: None)
    back = faiss.deserialize_index(faiss.serialize_index(padded))
    material = index_material("d", 100, 16, "t2i", "ivf_pq", build, "faiss x")
    assert index_problem(back, material) is None
    assert "another transform than zero-padding from width 16 to 24" in index_problem(
        back, {**material, "build": {**build, "width": 24}})
    unpadded = {k: v for k, v in build.items() if k != "width"}
    assert "holds a IndexPreTransform, expected a IndexIVFPQ" in index_problem(back, {**material, "build": unpadded})
    plain = ann.build_index(faiss, "ivf_pq", x, {**unpadded, "m": 4}, lambda n: None)
    assert "expected padding" in index_problem(plain, {**material, "build": {**build, "m": 4}})
