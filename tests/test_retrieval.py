import numpy as np
import pytest
import torch
from helpers.reference import fuse_one_query, i2t_rank, integer_embeddings, stable_order, t2i_rank
from helpers.tiers import fast_first

from fusebench.backends.retrieval import SearchSettings, retrieve
from fusebench.encoders.base import ModelEmbeddings
from fusebench.fusion import methods as registry
from fusebench.fusion.config import FUSE_ON, FusionConfig
from fusebench.fusion.whole_rankings import _read_ahead
from fusebench.search import model_lists

N_IMAGES = 23
METHODS = sorted(registry.names(), key=lambda m: m not in ("rrf", "dbsf"))  # every method; these two in the unit tier


def _case(seed: int, n_images: int, distractors: list[int]):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 5, size=n_images)
    counts[distractors] = 0  # distractors: retrievable, ask no i2t query
    caption_image = np.repeat(np.arange(n_images), counts)
    models = [ModelEmbeddings("a", integer_embeddings(rng, n_images), integer_embeddings(rng, len(caption_image))),
              ModelEmbeddings("b", integer_embeddings(rng, n_images, dim=5), integer_embeddings(rng, len(caption_image), dim=5),
                         weight=0.7)]
    return models, caption_image


@pytest.fixture(scope="module")
def case():
    return _case(42, N_IMAGES, [4, 17])


def _scores(model):
    return model.text @ model.image.T  # exact: small integers


def _run(models, caption_image, config, keep_k=None, **settings):
    return retrieve(models, caption_image, config, keep_k=keep_k, settings=SearchSettings(**settings))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("chunks", [(7, 16384), (5, 4), (1, 1), (64, 9)])
def test_single_model_ranks_and_lists_match_reference(case, chunks):
    models, caption_image = case
    out = _run(models[:1], caption_image, FusionConfig(method="none", top_k=4), chunk_size=chunks[0],
               item_chunk_size=chunks[1])
    scores = _scores(models[0])
    query_images = np.unique(caption_image)
    assert query_images.tolist() == [i for i in range(N_IMAGES) if i not in (4, 17)]
    lists = out["a"]
    for q in range(len(caption_image)):
        assert lists["t2i"].ranks[q] == t2i_rank(scores[q].tolist(), caption_image[q])  # exact even beyond top_k
        assert lists["t2i"].ids[q].tolist() == stable_order(scores[q].tolist())[:4]
        assert lists["t2i"].scores[q].tolist() == [scores[q, j] for j in stable_order(scores[q].tolist())[:4]]
    for row, image in enumerate(query_images):
        correct = set(np.flatnonzero(caption_image == image).tolist())
        assert lists["i2t"].ranks[row] == i2t_rank(scores[:, image].tolist(), correct)
        assert lists["i2t"].ids[row].tolist() == stable_order(scores[:, image].tolist())[:4]


@pytest.mark.parametrize("torch_path", [False, True])
@pytest.mark.parametrize("item_chunk", [16384, 9])
def test_t2i_ranks_past_the_list_are_counted_in_the_pass(case, monkeypatch, item_chunk, torch_path):
    """A caption whose target lies in the first item tile has its rank counted while its heap is fed (numba's
    heaps, or the torch path other devices take): no row is recomputed for it; only captions whose target lies
    past that tile and past their list are."""
    models, caption_image = case
    if torch_path:
        monkeypatch.setattr(model_lists, "_running_lists", lambda n, k, device: model_lists._TorchLists(n, k, device))
    recomputed = []
    full_rows = model_lists.full_rows
    monkeypatch.setattr(model_lists, "full_rows", lambda text, *a: recomputed.append(len(text)) or full_rows(text, *a))
    out = _run(models[:1], caption_image, FusionConfig(method="none", top_k=4), chunk_size=7,
               item_chunk_size=item_chunk, depth=4)
    scores = _scores(models[0])
    ranks = np.array([t2i_rank(scores[q].tolist(), caption_image[q]) for q in range(len(caption_image))])
    assert np.array_equal(out["a"]["t2i"].ranks, ranks)
    assert (ranks > 4).sum() > 10  # most ranks lie past the 4-entry lists
    assert sum(recomputed) == ((ranks > 4) & (caption_image >= min(item_chunk, N_IMAGES))).sum()


def test_t2i_ranks_are_counted_on_the_scores_the_lists_hold():
    """Float rows, duplicated images (exact ties) and ranks past 4-entry lists: each rank equals the count on the
    pass's own tile (the same matmul call), and each list's scores are that tile's (a row recomputed in another
    shape need not reproduce them bit for bit: fp32 products may depend on the shapes multiplied)."""
    rng = np.random.default_rng(12)
    text = rng.standard_normal((400, 16)).astype(np.float32)
    image = rng.standard_normal((20, 16)).astype(np.float32)[rng.integers(0, 20, 60)]  # duplicates: exact ties
    caption_image = rng.integers(0, len(image), size=len(text))
    got = model_lists.compute_model_lists(text, image, caption_image, 4, "cpu", chunk_size=17)
    for r0 in range(0, len(text), 17):
        block = torch.matmul(torch.from_numpy(text[r0:r0 + 17]), torch.from_numpy(image).T).numpy()
        for i, row in enumerate(block):
            q, target = r0 + i, caption_image[r0 + i]
            ahead = (row > row[target]).sum() + (row[:target] == row[target]).sum()
            assert got["t2i"].ranks[q] == ahead + 1, q
            assert np.array_equal(got["t2i"].scores[q].numpy(), row[got["t2i"].ids[q].numpy()])
    assert (got["t2i"].ranks > 4).sum() > 200


def _assert_same(base, other):
    assert base.keys() == other.keys()
    for name in base:
        for direction in ("t2i", "i2t"):
            assert np.array_equal(base[name][direction].ranks, other[name][direction].ranks), (name, direction)
            assert torch.equal(base[name][direction].ids, other[name][direction].ids), (name, direction)
            assert torch.equal(base[name][direction].scores, other[name][direction].scores), (name, direction)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("top_k", [6, None])
@pytest.mark.parametrize("chunks", fast_first([(1, 1000), (5, 3), (64, 1), (3, 7)], 2))
def test_results_do_not_depend_on_tile_sizes(case, top_k, chunks):
    models, caption_image = case
    config = FusionConfig(method="dbsf", top_k=top_k, final_top_k=8)
    base = _run(models, caption_image, config, chunk_size=1000, item_chunk_size=1000)
    _assert_same(base, _run(models, caption_image, config, chunk_size=chunks[0], item_chunk_size=chunks[1]))


def test_torch_selection_path_equals_cpu_heaps(case, monkeypatch):
    """The path other devices take (torch.topk candidates, merged per tile) gives the heaps' lists."""
    models, caption_image = case
    config = FusionConfig(method="rrf", top_k=5)
    heaps = _run(models, caption_image, config, chunk_size=4, item_chunk_size=6)
    monkeypatch.setattr(model_lists, "_running_lists", lambda n, k, device: model_lists._TorchLists(n, k, device))
    _assert_same(heaps, _run(models, caption_image, config, chunk_size=4, item_chunk_size=6))


def _check_fused_against_reference(models, caption_image, method, fuse_on, top_k, final_k, out, keep=None,
                                   combine="sum", **settings):
    weights = [m.weight for m in models]
    all_scores = [_scores(m) for m in models]
    query_images = np.unique(caption_image)

    def per_model_lists(rows):
        return [(stable_order(row)[:top_k], [row[j] for j in stable_order(row)[:top_k]]) for row in rows]

    def check(ranked, row, expected, is_correct):
        shown = len(expected) if keep is None else min(keep, len(expected))
        assert ranked.ids[row].tolist()[:shown] == [e[0] for e in expected][:shown]
        assert ranked.scores[row].tolist()[:shown] == pytest.approx([e[1] for e in expected][:shown], abs=1e-6)
        assert ranked.contributors[row].tolist()[:shown] == [e[2] for e in expected][:shown]
        hits = [p for p, e in enumerate(expected, start=1) if is_correct(e[0])]
        assert ranked.ranks[row] == (hits[0] if hits else 0)

    for q in range(len(caption_image)):
        expected = fuse_one_query(per_model_lists([s[q].tolist() for s in all_scores]), method, fuse_on, final_k, weights,
                                  combine=combine, **settings)
        check(out["fused"]["t2i"], q, expected, lambda item, q=q: item == caption_image[q])
    for row, image in enumerate(query_images):
        expected = fuse_one_query(per_model_lists([s[:, image].tolist() for s in all_scores]), method, fuse_on,
                                  final_k, weights, combine=combine, **settings)
        check(out["fused"]["i2t"], row, expected, lambda item, image=image: caption_image[item] == image)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("method", fast_first(METHODS, 2))
@pytest.mark.parametrize("fuse_on", FUSE_ON)
def test_fused_lists_match_per_query_reference_both_directions(case, method, fuse_on):
    if registry.method(method).candidates and fuse_on == "document":
        pytest.skip("a Borda-like method needs fusion.fuse_on=source_object (a rule of the config)")
    models, caption_image = case
    config = FusionConfig(method=method, fuse_on=fuse_on, top_k=5, final_top_k=7)
    out = _run(models, caption_image, config, chunk_size=6)
    _check_fused_against_reference(models, caption_image, method, fuse_on, 5, 7, out)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("method", fast_first(METHODS, 2))
@pytest.mark.parametrize("fuse_on", FUSE_ON)
@pytest.mark.parametrize("final_top_k", fast_first([None, 9]))
def test_dense_path_matches_reference_on_whole_rankings(case, method, fuse_on, final_top_k):
    """top_k: null fuses whole rankings block by block; the reference fuses full per-query lists."""
    if registry.method(method).candidates and fuse_on == "document":
        pytest.skip("a Borda-like method needs fusion.fuse_on=source_object (a rule of the config)")
    models, caption_image = case
    config = FusionConfig(method=method, fuse_on=fuse_on, top_k=None, final_top_k=final_top_k)
    out = _run(models, caption_image, config, keep_k=12, chunk_size=5, item_chunk_size=4)
    n_items = max(N_IMAGES, len(caption_image))
    final_k = final_top_k or 2 * n_items
    _check_fused_against_reference(models, caption_image, method, fuse_on, n_items, final_k, out, keep=12)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("combine", ["max", "mnz"])
@pytest.mark.parametrize("method", fast_first(["sum", "rrf", "minmax", "isr"], 2))
@pytest.mark.parametrize("top_k", fast_first([5, None]))
def test_combmax_and_combmnz_match_the_reference(case, combine, method, top_k):
    """CombMAX / CombMNZ over per-model lists (top_k 5) and over whole rankings (dense path)."""
    models, caption_image = case
    config = FusionConfig(method=method, fuse_on="source_object", top_k=top_k, final_top_k=9, combine=combine)
    out = _run(models, caption_image, config, keep_k=9, chunk_size=5, item_chunk_size=4)
    n_items = max(N_IMAGES, len(caption_image))
    _check_fused_against_reference(models, caption_image, method, "source_object", top_k or n_items, 9, out, keep=9,
                                   combine=combine)


ENGINE_SETTINGS = {  # the engine presets' mechanics (conf/fusion/*.yaml), each on both paths
    "opensearch_minmax": {"method": "minmax", "combine": "mean", "flat_score": 1.0, "floor": 0.001,
                          "score_map": "cosine01"},
    "opensearch_zscore": {"method": "zscore", "combine": "mean", "flat_score": 1.0, "floor": 0.001},
    "opensearch_geometric": {"method": "minmax", "combine": "geometric", "flat_score": 1.0, "floor": 0.001},
    "opensearch_harmonic": {"method": "l2", "combine": "harmonic", "score_map": "cosine01"},
    "elasticsearch_linear_l2": {"method": "l2", "score_map": "cosine01"},
    "milvus_weighted_ip": {"method": "sum", "score_map": "atan"},
    "concatenated_ranks": {"method": "rrf", "rrf_ranks": "concatenated"},
    "running_ranks_geometric": {"method": "rrf", "rrf_ranks": "concatenated", "combine": "geometric"},
    "ranx_borda": {"method": "borda"},
}


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("name", fast_first(list(ENGINE_SETTINGS), 2))
@pytest.mark.parametrize("top_k", [5, None])
def test_engine_mechanics_match_the_reference_on_both_paths(case, name, top_k):
    """Score maps, flat values, floors, OpenSearch's means, LanceDB's running ranks and Borda: per-model lists
    (top_k 5) and whole rankings (the dense path) against the per-query reference."""
    models, caption_image = case
    settings = dict(ENGINE_SETTINGS[name])
    method, combine = settings.pop("method"), settings.pop("combine", "sum")
    config = FusionConfig(method=method, fuse_on="source_object", top_k=top_k, final_top_k=9, combine=combine,
                          **settings)
    out = _run(models, caption_image, config, keep_k=9, chunk_size=5, item_chunk_size=4)
    n_items = max(N_IMAGES, len(caption_image))
    _check_fused_against_reference(models, caption_image, method, "source_object", top_k or n_items, 9, out, keep=9,
                                   combine=combine, **settings)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_dense_blocks_of_one_query_give_the_same_result(case):
    models, caption_image = case
    config = FusionConfig(method="rrf", fuse_on="source_object", top_k=None)
    base = _run(models, caption_image, config, keep_k=10)
    _assert_same(base, _run(models, caption_image, config, keep_k=10, chunk_size=1, item_chunk_size=1))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_many_distractors_tiled_on_both_axes_equal_untiled():
    """Most images have no caption: t2i must still rank them, i2t asks them nothing; tiles change nothing."""
    models, caption_image = _case(5, 300, list(range(12, 300)))
    for config in (FusionConfig(method="dbsf", top_k=20), FusionConfig(method="rrf", fuse_on="document", top_k=None)):
        base = _run(models, caption_image, config, keep_k=15, chunk_size=10_000, item_chunk_size=10_000)
        tiled = _run(models, caption_image, config, keep_k=15, chunk_size=7, item_chunk_size=32)
        _assert_same(base, tiled)
        assert base["a"]["i2t"].ranks.shape == (12,)
    scores = _scores(models[0])
    for q in range(len(caption_image)):
        assert base["a"]["t2i"].ranks[q] == t2i_rank(scores[q].tolist(), caption_image[q])


def test_no_fused_retriever_for_one_model_or_method_none(case):
    models, caption_image = case
    assert set(_run(models[:1], caption_image, FusionConfig(method="rrf", top_k=5))) == {"a"}
    assert set(_run(models, caption_image, FusionConfig(method="none", top_k=5))) == {"a", "b"}


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_keep_k_cuts_stored_lists_not_ranks(case):
    models, caption_image = case
    config = FusionConfig(method="rrf", top_k=None)
    full = _run(models, caption_image, config, keep_k=None, chunk_size=8)
    cut = _run(models, caption_image, config, keep_k=3, chunk_size=8)
    for name in full:
        for direction in ("t2i", "i2t"):
            assert np.array_equal(full[name][direction].ranks, cut[name][direction].ranks)
            assert torch.equal(full[name][direction].ids[:, :3], cut[name][direction].ids)


@pytest.mark.parametrize("ahead", [False, True])
def test_read_ahead_loads_each_block_once_in_order_and_at_most_one_ahead(ahead):
    """Stored score rows are read one block ahead on a second thread; what the caller gets is the same blocks,
    in order, each loaded once; a load's error reaches the caller."""
    loaded, yielded = [], []

    def load(r0, r1, i):
        assert (r0, r1) == [(0, 2), (2, 4), (4, 5)][i]
        assert len(yielded) >= i - 1  # the caller is done with block i - 2 (its buffers may be refilled)
        loaded.append(r0)
        return r0 * 10
    for (r0, _), value in _read_ahead(load, [(0, 2), (2, 4), (4, 5)], ahead):
        yielded.append((r0, value))
        assert len(loaded) <= len(yielded) + (1 if ahead else 0)  # never more than one block ahead
    assert yielded == [(0, 0), (2, 20), (4, 40)] and sorted(loaded) == [0, 2, 4]

    def broken(r0, r1, i):
        raise OSError(f"rows {r0}:{r1} ended early")
    with pytest.raises(OSError, match="rows 0:2 ended early"):
        list(_read_ahead(broken, [(0, 2), (2, 4)], ahead))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("method,fuse_on", fast_first([("dbsf", "document"), ("rrf", "source_object"), ("zscore", "source_object")],
                                                       unpack=True))
def test_dense_blocks_read_into_reused_buffers_give_the_same_result(case, tmp_path, monkeypatch, method, fuse_on):
    """Block i is read into block i - 2's buffers (scores, stored orders and moments, fresh or stored rows), and
    fused in the work arrays of the blocks before it (the fused evidence, RRF's gathered values; the last block
    is smaller): the same lists and ranks as fresh arrays for every block."""
    import fusebench.fusion.whole_rankings as dense

    models, caption_image = case
    config = FusionConfig(method=method, fuse_on=fuse_on, top_k=None)
    refilled, reworked = [], []
    read, scratch = dense.BlockBuffers.read, dense.BlockBuffers.scratch

    def spy(self, rows, r0, r1, i, key):
        refilled.append(key in self.sets[i % len(self.sets)])
        return read(self, rows, r0, r1, i, key)

    def scratch_spy(self, name, like):
        reworked.append(name in self.work)
        return scratch(self, name, like)
    monkeypatch.setattr(dense.BlockBuffers, "read", spy)
    monkeypatch.setattr(dense.BlockBuffers, "scratch", scratch_spy)
    tiny = {"keep_k": 12, "chunk_size": 5, "item_chunk_size": 4}
    reused = [_run(models, caption_image, config, **tiny),  # fresh rows, then stored rows (read ahead) twice
              *(_run(models, caption_image, config, store_dir=str(tmp_path), **tiny) for _ in range(2))]
    assert any(refilled) and not all(refilled)  # the first two blocks allocate, later ones refill
    assert (fuse_on == "source_object") == any(reworked)  # the document passes keep no work array
    monkeypatch.setattr(dense.BlockBuffers, "read", lambda self, rows, r0, r1, i, key: rows(r0, r1))
    monkeypatch.setattr(dense.BlockBuffers, "scratch", lambda self, name, like: None)
    fresh = _run(models, caption_image, config, **tiny)
    for out in reused:
        _assert_same(fresh, out)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_list_pass_stores_the_score_matrices_a_whole_ranking_job_reads(tmp_path):
    """With ``whole_rows`` (a job of the process fuses whole rankings) the list pass writes the model's score
    matrices too: the very files a separate score pass writes (float rows, several row tiles: the same matmul
    shapes, so the same bits), read by the whole-ranking job without another similarity, with the same results."""
    from fusebench.runtime import state
    from fusebench.stores.scores import ScoreStore

    rng = np.random.default_rng(3)
    caption_image = np.repeat(np.arange(40), 3)
    models = [ModelEmbeddings(name, rng.standard_normal((40, dim)).astype(np.float32),
                              rng.standard_normal((120, dim)).astype(np.float32)) for name, dim in (("a", 48), ("b", 40))]
    tiny = {"chunk_size": 7, "item_chunk_size": 64}
    dense = FusionConfig(method="dbsf", top_k=None, final_top_k=10)
    apart, together = tmp_path / "apart", tmp_path / "together"
    _run(models, caption_image, FusionConfig(method="dbsf", top_k=5), store_dir=str(apart), **tiny)
    assert not list(apart.rglob("t2i.npy"))  # no whole-ranking job: the lists alone
    want = _run(models, caption_image, dense, store_dir=str(apart), **tiny)  # a second pass for the matrices

    _run(models, caption_image, FusionConfig(method="dbsf", top_k=5), store_dir=str(together), whole_rows=True, **tiny)
    for direction in ("t2i", "i2t"):
        written = sorted(p.relative_to(together).as_posix() for p in together.rglob(f"{direction}.npy"))
        assert written == sorted(p.relative_to(apart).as_posix() for p in apart.rglob(f"{direction}.npy"))
        for name in written:
            assert (together / name).read_bytes() == (apart / name).read_bytes(), name
    before = state.current().similarity_blocks
    got = _run(models, caption_image, dense, store_dir=str(together), whole_rows=True, **tiny)
    assert state.current().similarity_blocks == before  # lists and score matrices both read from the stores
    _assert_same(want, got)
    assert ScoreStore(str(together)).entries()  # the entries are the score store's own


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_whole_ranking_job_computes_its_lists_and_score_matrices_in_one_pass(case, tmp_path):
    from fusebench.runtime import state

    models, caption_image = case
    dense = FusionConfig(method="rrf", fuse_on="source_object", top_k=None, final_top_k=9)
    tiny = {"chunk_size": 5, "item_chunk_size": 64}
    blocks = state.current().similarity_blocks
    one = _run(models, caption_image, dense, store_dir=str(tmp_path / "one"), whole_rows=True, **tiny)
    one_pass = state.current().similarity_blocks - blocks
    two = _run(models, caption_image, dense, store_dir=str(tmp_path / "two"), **tiny)
    two_passes = state.current().similarity_blocks - blocks - one_pass
    tiles_per_pass = 2 * -(-len(caption_image) // 5)  # two models, one item tile
    assert two_passes - one_pass == tiles_per_pass  # the score matrices cost no second pass
    _assert_same(two, one)
    assert one["fused"]["t2i"].ranks.tolist() == two["fused"]["t2i"].ranks.tolist()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_score_store_that_cannot_be_written_leaves_the_list_job_its_lists(case, tmp_path, monkeypatch, caplog):
    """The lists need no score matrices: a full disk under the score store is a warning, and the lists take a pass
    of their own (a whole-ranking job that needs the matrices still fails, as before)."""
    import errno

    from fusebench.backends.retrieval import ListSource
    from fusebench.stores import scores

    models, caption_image = case
    config = FusionConfig(method="dbsf", top_k=5)
    want = _run(models, caption_image, config, chunk_size=5)

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(scores, "_write_blocks", full)
    source = ListSource()
    got = retrieve(models, caption_image, config, None, settings=SearchSettings(store_dir=str(tmp_path), whole_rows=True,
                                                                          chunk_size=5), source=source)
    _assert_same(want, got)
    assert "computed alone" in caplog.text and not any(r.get("with_scores") for r in source.records.values())
    with pytest.raises(OSError):
        _run(models, caption_image, FusionConfig(method="dbsf", top_k=None), store_dir=str(tmp_path / "b"))
    monkeypatch.undo()
    source = ListSource()
    retrieve(models, caption_image, config, None, settings=SearchSettings(store_dir=str(tmp_path / "c"), whole_rows=True,
                                                                    chunk_size=5), source=source)
    assert all(r["with_scores"] for r in source.records.values())  # the list record says what its pass also wrote
