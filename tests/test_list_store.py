"""The list store: warm jobs do no similarity work, results equal cold ones, damaged entries are rebuilt."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers.lists import assert_same_lists, run_lists
from helpers.reference import integer_embeddings
from helpers.tiers import fast_first

from fusebench.app.cache_cli import main as cache_main
from fusebench.backends.retrieval import ListSource, SearchSettings, retrieve
from fusebench.encoders.base import ModelEmbeddings
from fusebench.fusion import methods as registry
from fusebench.fusion.config import FUSE_ON, FusionConfig
from fusebench.runtime import state
from fusebench.search import row_kernels
from fusebench.stores import scores
from fusebench.stores.lists import FORMAT, ListStore
from fusebench.stores.scores import ScoreStore

METHODS = sorted(registry.names(), key=lambda m: m not in ("rrf", "dbsf"))  # every method; these two in the unit tier


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 4, size=40)
    caption_image = np.repeat(np.arange(40), counts)
    models = [ModelEmbeddings("a", integer_embeddings(rng, 40), integer_embeddings(rng, len(caption_image))),
              ModelEmbeddings("b", integer_embeddings(rng, 40, dim=7), integer_embeddings(rng, len(caption_image), dim=7))]
    return models, caption_image


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("method", fast_first(METHODS))
@pytest.mark.parametrize("fuse_on", fast_first(FUSE_ON))  # six searches a case: the fast tier keeps one case
def test_stored_lists_reproduce_cold_results_and_warm_jobs_do_no_matmul(case, tmp_path, method, fuse_on):
    if registry.method(method).candidates and fuse_on == "document":
        pytest.skip("a Borda-like method needs fusion.fuse_on=source_object (a rule of the config)")
    models, caption_image = case
    for top_k in (5, 25):
        config = FusionConfig(method=method, fuse_on=fuse_on, top_k=top_k)
        cold, _, _ = run_lists(models, caption_image, config, store=None)
        first, records, _ = run_lists(models, caption_image, config, store=str(tmp_path))
        warm, warm_records, blocks = run_lists(models, caption_image, config, store=str(tmp_path))
        assert_same_lists(cold, first)
        assert_same_lists(cold, warm)
        assert blocks == 0, "a job whose lists are stored must not compute similarities"
        assert all(r["hit"] for r in warm_records.values())


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("fuse_on", fast_first(FUSE_ON))
def test_dense_jobs_take_single_models_from_the_store(case, tmp_path, fuse_on):
    models, caption_image = case
    config = FusionConfig(method="dbsf", fuse_on=fuse_on, top_k=None)
    cold, _, _ = run_lists(models, caption_image, config, store=None, keep_k=10)
    run_lists(models, caption_image, FusionConfig(method="rrf", top_k=5), store=str(tmp_path))
    warm, records, _ = run_lists(models, caption_image, config, store=str(tmp_path), keep_k=10)
    assert all(r["hit"] for r in records.values())
    assert_same_lists(cold, warm)


def test_deeper_request_recomputes_shallower_reuses(case, tmp_path):
    models, caption_image = case
    config = FusionConfig(method="rrf", top_k=10)
    _, records, _ = run_lists(models[:1], caption_image, config, store=str(tmp_path), depth=10)
    assert not records["a"]["hit"]
    _, records, _ = run_lists(models[:1], caption_image, config, store=str(tmp_path), depth=20)
    assert not records["a"]["hit"] and records["a"]["depth"] == 20
    _, records, blocks = run_lists(models[:1], caption_image, config, store=str(tmp_path), depth=15)
    assert records["a"]["hit"] and records["a"]["depth"] == 20 and blocks == 0
    assert len(ListStore(tmp_path).entries()) == 1  # one entry per model and corpus, whatever the depth


def _entry(tmp_path) -> Path:
    (entry,) = [Path(e["path"]) for e in ListStore(tmp_path).entries()]
    return entry


def _truncate(entry: Path):
    data = (entry / "lists.npz").read_bytes()
    (entry / "lists.npz").write_bytes(data[: len(data) // 2])


def _flip_byte(entry: Path):
    data = bytearray((entry / "lists.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (entry / "lists.npz").write_bytes(bytes(data))


def _meta_not_an_object(entry: Path):
    (entry / "meta.json").write_text("[1, 2, 3]")


def _meta_not_json(entry: Path):
    (entry / "meta.json").write_text("{not json")


def _older_format(entry: Path):
    meta = json.loads((entry / "meta.json").read_text())
    meta["format"] = FORMAT - 1
    (entry / "meta.json").write_text(json.dumps(meta))


def _wrong_shapes(entry: Path):
    with np.load(entry / "lists.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["t2i_ranks"] = arrays["t2i_ranks"][:-1]
    np.savez(entry / "lists.npz", **arrays)
    meta = json.loads((entry / "meta.json").read_text())
    from fusebench.stores.files import file_sha256

    meta.update(bytes=(entry / "lists.npz").stat().st_size, sha256=file_sha256(entry / "lists.npz"))
    (entry / "meta.json").write_text(json.dumps(meta))


def _killed_mid_write(entry: Path):
    (entry / "meta.json").unlink()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("damage", fast_first([_truncate, _flip_byte, _meta_not_an_object, _meta_not_json, _older_format,
                                               _wrong_shapes, _killed_mid_write], 2))
def test_damaged_entry_is_reported_and_recomputed(case, tmp_path, caplog, damage):
    models, caption_image = case
    config = FusionConfig(method="dbsf", top_k=8)
    first, _, _ = run_lists(models[:1], caption_image, config, store=str(tmp_path))
    damage(_entry(tmp_path))
    again, records, blocks = run_lists(models[:1], caption_image, config, store=str(tmp_path))
    assert not records["a"]["hit"] and blocks > 0
    assert_same_lists(first, again)
    if damage is not _killed_mid_write:
        assert "corrupt or outdated" in caplog.text
    third, records, blocks = run_lists(models[:1], caption_image, config, store=str(tmp_path))
    assert records["a"]["hit"] and blocks == 0  # rebuilt entry is whole again


@pytest.mark.slow
def test_two_processes_compute_one_entry_once(case, tmp_path):
    models, caption_image = case
    np.save(tmp_path / "image.npy", np.asarray(models[0].image))
    np.save(tmp_path / "text.npy", np.asarray(models[0].text))
    np.save(tmp_path / "caption_image.npy", caption_image)
    script = textwrap.dedent(f"""
        import json, numpy as np
        from fusebench.encoders.base import ModelEmbeddings
        from fusebench.backends.retrieval import ListSource, SearchSettings, model_lists
        d = {str(tmp_path)!r}
        model = ModelEmbeddings("a", np.load(d + "/image.npy"), np.load(d + "/text.npy"))
        source = ListSource()
        model_lists(model, np.load(d + "/caption_image.npy"), 30, SearchSettings(store_dir=d + "/store"), source)
        print(json.dumps(source.records["a"]["hit"]))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    hits = sorted(json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs)
    assert hits == [False, True]  # one computed it, the other waited on the lock and read it
    assert len(ListStore(tmp_path / "store").entries()) == 1


def test_fusebench_cache_lists_and_removes_list_entries(case, tmp_path, capsys):
    models, caption_image = case
    run_lists(models, caption_image, FusionConfig(method="rrf", top_k=5), store=str(tmp_path))
    assert cache_main(["--dir", str(tmp_path), "list"]) == 0
    listing = capsys.readouterr().out
    assert listing.count(" lists ") == 2 and "2 entries" in listing
    key = ListStore(tmp_path).entries()[0]["key"]
    assert cache_main(["--dir", str(tmp_path), "remove", key[:8]]) == 0
    assert len(ListStore(tmp_path).entries()) == 1
    assert cache_main(["--dir", str(tmp_path), "clear", "--yes"]) == 0
    assert ListStore(tmp_path).entries() == []


def _dense(models, caption_image, store, method="zscore", fuse_on="source_object", max_scores_mb=2048):
    source = ListSource()
    before = state.current().similarity_blocks
    out = retrieve(models, caption_image, FusionConfig(method=method, fuse_on=fuse_on, top_k=None), keep_k=10,
                   settings=SearchSettings(chunk_size=16, item_chunk_size=16, store_dir=store,
                                           max_scores_mb=max_scores_mb), source=source)
    return out, source.records, state.current().similarity_blocks - before


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rrf", "dbsf"])
@pytest.mark.parametrize("fuse_on", FUSE_ON)
def test_whole_ranking_jobs_read_stored_score_matrices(case, tmp_path, method, fuse_on):
    models, caption_image = case
    cold, _, _ = _dense(models, caption_image, None, method, fuse_on)
    first, records, _ = _dense(models, caption_image, str(tmp_path), method, fuse_on)
    assert all(r["scores"]["stored"] and not r["scores"]["hit"] for r in records.values())
    warm, records, blocks = _dense(models, caption_image, str(tmp_path), method, fuse_on)
    assert blocks == 0 and all(r["scores"]["hit"] for r in records.values())
    assert_same_lists(cold, first)
    assert_same_lists(cold, warm)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("tile_bytes", [64, 20_000, 1 << 20])  # one transposed row per block .. one block
def test_transposed_rows_of_a_stored_matrix(tmp_path, tile_bytes):
    """The i2t matrix is built from the stored t2i file: the rows of its transpose for any columns, in blocks
    and slabs of any size (one reused read buffer; the copy goes in 64 x 64 tiles, here with ragged edges),
    equal numpy's transpose exactly."""
    rng = np.random.default_rng(2)
    matrix = rng.standard_normal((150, 140)).astype(np.float32)
    np.save(tmp_path / "m.npy", matrix)
    columns = np.sort(rng.choice(140, size=100, replace=False))
    blocks = list(scores.transposed_rows(scores.StoredRows(tmp_path / "m.npy"), columns, tile_bytes))
    assert (len(blocks) > 1) == (tile_bytes < 4 * 150 * len(columns))
    assert np.array_equal(np.concatenate(blocks), matrix[:, columns].T)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_stored_i2t_is_the_transposed_t2i_from_one_similarity_pass(tmp_path, monkeypatch):
    """A model's score entry costs one similarity pass (its t2i rows): the i2t matrix is the t2i matrix's
    transpose for the images with captions, bit for bit, so a pair has one score in both directions."""
    from fusebench.backends import retrieval

    rng = np.random.default_rng(8)
    caption_image = np.repeat(np.arange(30), rng.integers(0, 3, size=30))  # some images have no caption

    def unit(rows: int) -> np.ndarray:
        x = rng.standard_normal((rows, 12)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    models = [ModelEmbeddings(name, unit(30), unit(len(caption_image))) for name in "ab"]
    rows, full_rows = [], retrieval.full_rows
    monkeypatch.setattr(retrieval, "full_rows", lambda q, *rest: rows.append(len(q)) or full_rows(q, *rest))
    _dense(models, caption_image, str(tmp_path))
    assert sum(rows) == 2 * len(caption_image)  # each model's t2i rows, once
    for entry in ScoreStore(tmp_path).entries():
        model = next(m for m in models if m.name == entry["model"])
        t2i, i2t = (np.load(Path(entry["path"]) / f"{d}.npy") for d in ("t2i", "i2t"))
        np.testing.assert_allclose(t2i, model.text @ model.image.T, atol=1e-6)
        assert np.array_equal(i2t, t2i[:, np.unique(caption_image)].T)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_score_matrices_over_the_size_cap_are_recomputed_not_stored(case, tmp_path):
    models, caption_image = case
    _dense(models, caption_image, str(tmp_path), max_scores_mb=0)
    _, records, blocks = _dense(models, caption_image, str(tmp_path), max_scores_mb=0)
    assert blocks > 0 and not any(r["scores"]["stored"] for r in records.values())
    assert ScoreStore(tmp_path).entries() == []


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("damage", fast_first(["truncate", "flip", "meta_list", "older_format"]))
def test_damaged_score_entry_is_rebuilt(case, tmp_path, caplog, damage):
    models, caption_image = case
    first, _, _ = _dense(models, caption_image, str(tmp_path))
    entry = Path(ScoreStore(tmp_path).entries()[0]["path"])
    if damage == "truncate":
        data = (entry / "t2i.npy").read_bytes()
        (entry / "t2i.npy").write_bytes(data[:-8])
    elif damage == "flip":
        data = bytearray((entry / "i2t.npy").read_bytes())
        data[-3] ^= 0x10
        (entry / "i2t.npy").write_bytes(bytes(data))
    elif damage == "meta_list":
        (entry / "meta.json").write_text("[]")
    else:
        meta = json.loads((entry / "meta.json").read_text())
        (entry / "meta.json").write_text(json.dumps({**meta, "format": 0}))
    state.start()  # as a new process would: checksums are verified once per process
    again, records, blocks = _dense(models, caption_image, str(tmp_path))
    assert blocks > 0 and "score store entry" in caplog.text
    assert_same_lists(first, again)


def _count_sorts(monkeypatch) -> list[int]:
    calls = []
    sort = row_kernels.row_order
    monkeypatch.setattr(row_kernels, "row_order", lambda block, *how: calls.append(len(block)) or sort(block, *how))
    return calls


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("combine", fast_first(["sum", "geometric"]))
def test_rrf_by_source_object_sorts_each_stored_matrix_once(case, tmp_path, monkeypatch, combine):
    """Whole-ranking RRF by source object needs every row's order: sorted once into the store (beside the
    scores, as uint16 for up to 65,536 items), then read back by every later job with no sort at all."""
    models, caption_image = case
    config = FusionConfig(method="rrf", fuse_on="source_object", top_k=None, combine=combine)
    cold, _, _ = run_lists(models, caption_image, config, store=None, keep_k=12)
    sorts = _count_sorts(monkeypatch)
    first, records, _ = run_lists(models, caption_image, config, store=str(tmp_path), keep_k=12)
    assert sum(sorts) == 2 * (len(caption_image) + len(np.unique(caption_image))) and all(r["scores"]["orders"] for r in records.values())
    entry = Path(ScoreStore(tmp_path).entries()[0]["path"])
    assert np.load(entry / "t2i_order.npy").dtype == np.uint16
    assert np.array_equal(np.load(entry / "t2i_order.npy"), np.argsort(-np.load(entry / "t2i.npy"), axis=1, kind="stable"))
    sorts.clear()
    state.start()  # a new process: the stored orders' checksums are verified, not trusted
    warm, _, blocks = run_lists(models, caption_image, config, store=str(tmp_path), keep_k=12)
    assert sorts == [] and blocks == 0
    assert_same_lists(cold, first)
    assert_same_lists(cold, warm)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("damage", fast_first(["truncate", "flip", "wrong_type"]))
def test_damaged_stored_order_is_sorted_again(case, tmp_path, monkeypatch, caplog, damage):
    models, caption_image = case
    config = FusionConfig(method="rrf", fuse_on="source_object", top_k=None)
    first, _, _ = run_lists(models, caption_image, config, store=str(tmp_path), keep_k=12)
    path = Path(ScoreStore(tmp_path).entries()[0]["path"]) / "i2t_order.npy"
    data = bytearray(path.read_bytes())
    if damage == "wrong_type":  # a valid .npy of the right shape, but scores instead of column indices
        np.save(path, np.load(path).astype(np.float32))
    else:
        path.write_bytes(bytes(data[:-2]) if damage == "truncate" else bytes(data[:-1]) + bytes([data[-1] ^ 1]))
    state.start()
    sorts = _count_sorts(monkeypatch)
    again, _, _ = run_lists(models, caption_image, config, store=str(tmp_path), keep_k=12)
    assert "i2t_order.npy is damaged" in caplog.text and sum(sorts) == len(np.unique(caption_image))
    assert_same_lists(first, again)


def test_stored_rows_read_orders_in_their_own_dtype(tmp_path):
    order = np.array([[2, 0, 1], [1, 2, 0]], dtype=np.uint16)
    np.save(tmp_path / "o.npy", order)
    rows = scores.StoredRows(tmp_path / "o.npy")(1, 2).numpy()
    assert rows.dtype == np.uint16 and rows.tolist() == [[1, 2, 0]]
    assert scores.order_dtype(65536) == np.uint16 and scores.order_dtype(65537) == np.int32


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("method,fuse_on,ddof,damage", fast_first([("dbsf", "source_object", 0, "truncate"),
                                                                    ("zscore", "document", 1, "flip"),
                                                                    ("dbsf", "document", 1, "wrong_type")], unpack=True))
def test_row_moments_are_computed_once_and_stored(case, tmp_path, monkeypatch, caplog, method, fuse_on, ddof, damage):
    """DBSF and z-score over whole rankings take each row's mean and sd: computed once into the store (the
    values row_kernels.row_mean_std gives), then read back by later jobs, which compute no moments."""
    models, caption_image = case
    config = FusionConfig(method=method, fuse_on=fuse_on, top_k=None, params={"ddof": ddof})
    cold, _, _ = run_lists(models, caption_image, config, store=None, keep_k=12)
    calls = []
    moments = row_kernels.row_mean_std
    counted = lambda block, d: calls.append(len(block)) or moments(block, d)  # noqa: E731
    monkeypatch.setattr(row_kernels, "row_mean_std", counted)  # the store's computation
    monkeypatch.setattr("fusebench.fusion.normalisers.row_mean_std", counted)  # the one a job makes without stored moments
    first, records, _ = run_lists(models, caption_image, config, store=str(tmp_path), keep_k=12)
    assert sum(calls) == 2 * (len(caption_image) + len(np.unique(caption_image)))
    assert all(r["scores"]["moments"] and not r["scores"]["orders"] for r in records.values())
    entry = Path(ScoreStore(tmp_path).entries()[0]["path"])
    stored = np.load(entry / f"t2i_moments_ddof{ddof}.npy")
    assert np.array_equal(stored, np.stack(moments(np.load(entry / "t2i.npy"), ddof), axis=1))
    calls.clear()
    state.start()
    damaged = entry / f"i2t_moments_ddof{ddof}.npy"  # one file damaged: reported and recomputed
    data = damaged.read_bytes()
    if damage == "wrong_type":  # a valid .npy of the right shape, but float64
        np.save(damaged, np.load(damaged).astype(np.float64))
    else:
        damaged.write_bytes(data[:-4] if damage == "truncate" else data[:-1] + bytes([data[-1] ^ 0x20]))
    warm, _, _ = run_lists(models, caption_image, config, store=str(tmp_path), keep_k=12)
    assert sum(calls) == len(np.unique(caption_image)) and f"{damaged.name} is damaged" in caplog.text
    assert_same_lists(cold, first)
    assert_same_lists(cold, warm)


def test_key_material_hashed_in_parallel_equals_each_array_hashed_alone():
    """The job's models are hashed at once on all cores: the same digests, in the same places, as one array
    at a time (store keys are unchanged by the threads)."""
    from fusebench.stores.lists import array_digest, array_digests, list_materials

    rng = np.random.default_rng(3)
    pairs = [(rng.standard_normal((40, 8)).astype(np.float32), rng.standard_normal((90, 8)).astype(np.float32)),
             (rng.standard_normal((40, 6)).astype(np.float32), rng.standard_normal((90, 6)).astype(np.float32))]
    caption_image = rng.integers(0, 40, 90)
    arrays = [a for pair in pairs for a in pair]
    assert array_digests(arrays) == [array_digest(a) for a in arrays]
    together = list_materials(pairs, caption_image, "cpu")
    assert together == [list_materials([pair], caption_image, "cpu")[0] for pair in pairs]
    assert together[0]["text"] == array_digest(pairs[0][1]) and together[1]["image"] == array_digest(pairs[1][0])
    assert together[0]["caption_image"] == array_digest(caption_image.astype(np.int64))
