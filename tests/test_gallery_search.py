"""Exact search over a gallery with distractors (search.gallery_search) against the in-memory search of the whole
gallery (compute_model_lists on the stacked rows) and slow references; the certified-margin path (search.margin)
forced on the CPU against fp32; the fused kernel against the heaps and an obvious count; the i2t skip of
compute_model_lists over captionless images."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.reference import integer_embeddings
from helpers.seeded_rows import SeededRows
from helpers.tiers import fast_first

from fusebench import FusebenchError
from fusebench.encoders.distractors import ArrayRows, normalised
from fusebench.search import gallery_search, margin
from fusebench.search.exact import column_target_ranks, similarity, target_ranks, topk_stable
from fusebench.search.gallery_search import gallery_lists
from fusebench.search.model_lists import _TorchLists, compute_model_lists, tiles
from fusebench.search.topk_kernels import Heaps, offer_rows_count


class RawRows:
    """Distractor rows handed back as given (integer rows: exact dot products, ties everywhere)."""

    key = {"kind": "raw"}

    def __init__(self, rows: np.ndarray):
        self.rows = np.ascontiguousarray(rows, dtype=np.float32)
        self.n, self.dim = self.rows.shape

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.rows[start:stop]


def tie_case(seed: int, n_test: int, n_distractors: int, n_captions: int, dim: int = 6):
    """Integer rows (many exact ties); a quarter of the distractors copy a test image (a tie with every caption of
    it, ranked after it), ten are caption 0 scaled up (its target is outranked by all ten)."""
    rng = np.random.default_rng(seed)
    image = integer_embeddings(rng, n_test, dim)
    caption_image = rng.integers(0, n_test, n_captions)
    caption_image[: n_test // 2] = np.arange(n_test // 2)
    text = integer_embeddings(rng, n_captions, dim)
    distractors = integer_embeddings(rng, n_distractors, dim)
    copies = n_distractors // 4
    distractors[:copies] = image[rng.integers(0, n_test, copies)]
    distractors[copies: copies + 10] = 10 * text[0]
    return text, image, caption_image, distractors


def assert_same(got, want):
    assert got.arrays().keys() == want.arrays().keys()
    for name in want.arrays():
        assert got.arrays()[name].dtype == want.arrays()[name].dtype, name
        assert np.array_equal(got.arrays()[name], want.arrays()[name]), name


SHAPES = [  # n_test, n_distractors, captions, depth, chunk, item_chunk
    (30, 100, 50, 10, 16, 20),  # a tile astride the test/distractor boundary
    (30, 100, 50, 200, 16, 20),  # depth above the gallery's size
    (50, 300, 70, 7, 13, 16),  # test images over four tiles: targets past the first tile
    (32, 64, 40, 5, 40, 16),  # the boundary on a tile edge
    (40, 0, 60, 9, 16, 16),  # no distractors
    (40, 200, 60, 9, 64, 1000),  # one tile holds the whole gallery
]


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("shape", SHAPES)
def test_gallery_lists_equal_the_in_memory_search_of_the_stacked_gallery(shape):
    n_test, n_distractors, n_captions, depth, chunk, item_chunk = shape
    text, image, caption_image, distractors = tie_case(sum(shape), n_test, n_distractors, n_captions)
    got = gallery_lists(text, image, caption_image, RawRows(distractors), depth, "cpu", chunk, item_chunk)
    want = compute_model_lists(text, np.vstack([image, distractors]), caption_image, depth, "cpu", chunk, item_chunk)
    assert_same(got, want)
    if n_distractors:
        assert got["t2i"].ranks[0] > 10  # caption 0's target is behind its ten scaled copies
        assert got["t2i"].ids.numpy().max() >= n_test  # distractors do make the lists


def test_normalised_rows_through_array_rows_with_near_copies():
    rng = np.random.default_rng(3)
    image = normalised(rng.standard_normal((45, 12)))
    caption_image = np.concatenate([np.arange(45), rng.integers(0, 45, 40)])
    text = normalised(image[caption_image] + 0.6 * rng.standard_normal((85, 12)))
    raw = rng.standard_normal((500, 12)).astype(np.float32)
    raw[:200] = image[rng.integers(0, 45, 200)] + 1e-6 * rng.standard_normal((200, 12))
    rows = ArrayRows(raw)
    got = gallery_lists(text, image, caption_image, rows, 25, "cpu", 32, 64)
    assert_same(got, compute_model_lists(text, np.vstack([image, rows.rows]), caption_image, 25, "cpu", 32, 64))


@pytest.mark.parametrize("n_test,item_chunk", [(40, 64), (150, 64)])
def test_streaming_reads_each_distractor_tile_once_and_holds_one_tile(n_test, item_chunk):
    """Rows generated per read: every tile's rows are read once, in order, none twice (the first pass over test
    tiles past the first reads the tile astride the boundary and keeps it), never more than a tile alive."""
    rng = np.random.default_rng(n_test)
    image = normalised(rng.standard_normal((n_test, 24)))
    caption_image = rng.integers(0, n_test, 90)
    text = normalised(image[caption_image] + rng.standard_normal((90, 24)))
    rows = SeededRows(1000, 24, seed=3)
    got = gallery_lists(text, image, caption_image, rows, 12, "cpu", 32, item_chunk)
    expected = [(max(c0 - n_test, 0), c1 - n_test) for c0, c1 in tiles(n_test + 1000, item_chunk) if c1 > n_test]
    assert rows.reads == expected
    assert 0 < rows.peak_live <= item_chunk
    everything = np.vstack([image, rows.all_rows()])
    assert_same(got, compute_model_lists(text, everything, caption_image, 12, "cpu", 32, item_chunk))


def test_torch_lists_path_equals_the_numba_heaps(monkeypatch):
    """The path other devices take (torch.topk candidates merged, counts in torch), run on the CPU."""
    text, image, caption_image, distractors = tie_case(5, 50, 300, 70)
    want = gallery_lists(text, image, caption_image, RawRows(distractors), 7, "cpu", 13, 16)
    monkeypatch.setattr(gallery_search, "_row_lists", lambda n, k, device, precision: gallery_search._TorchRows(n, k, device))
    monkeypatch.setattr(gallery_search, "_running_lists", lambda n, k, device: _TorchLists(n, k, device))
    assert_same(gallery_lists(text, image, caption_image, RawRows(distractors), 7, "cpu", 13, 16), want)


def test_progress_reports_every_caption_once():
    text, image, caption_image, distractors = tie_case(6, 30, 100, 50)
    updates = []
    gallery_lists(text, image, caption_image, RawRows(distractors), 5, "cpu", 16, 20, updates.append)
    assert sum(updates) == 50 and all(u > 0 for u in updates) and len(updates) > 1


def test_offer_rows_count_equals_the_heaps_and_an_obvious_count():
    rng = np.random.default_rng(9)
    block = rng.integers(-3, 4, size=(40, 500)).astype(np.float32)  # ties across every cut
    first_item = 1000
    target_item = rng.integers(first_item - 50, first_item + 550, 40)  # before, inside and past the block
    target_score = rng.integers(-3, 4, 40).astype(np.float32)
    for k in (1, 9, 100, 600):
        heaps, reference = Heaps(40, min(k, 500)), Heaps(40, min(k, 500))
        ahead = np.full(40, 5, dtype=np.int64)
        for half in (slice(0, 250), slice(250, 500)):
            part = np.ascontiguousarray(block[:, half])
            offer_rows_count(part, first_item + half.start, heaps.vals, heaps.ids, heaps.counts, target_score,
                             target_item, ahead)
            reference.offer_rows(part, first_item + half.start)
        for got, want in zip(heaps.lists(), reference.lists()):
            assert np.array_equal(got, want)
        items = first_item + np.arange(500)
        obvious = [5 + sum(1 for j in range(500) if block[r, j] > target_score[r]
                           or (block[r, j] == target_score[r] and items[j] < target_item[r])) for r in range(40)]
        assert ahead.tolist() == obvious


def near_tie_case(seed: int, n_test: int = 60, n_captions: int = 140, n_distractors: int = 2000, dim: int = 32):
    """Distractors that are tiny perturbations (1e-2 .. 1e-6) of test images and of captions: scores within the
    bf16 error of targets and of list entries everywhere."""
    rng = np.random.default_rng(seed)
    image = normalised(rng.standard_normal((n_test, dim)))
    caption_image = np.concatenate([np.arange(n_test), rng.integers(0, n_test, n_captions - n_test)])
    text = normalised(image[caption_image] + 0.5 * rng.standard_normal((n_captions, dim)))
    raw = rng.standard_normal((n_distractors, dim)).astype(np.float32)
    scale = 10.0 ** -rng.integers(2, 7, size=(n_distractors, 1))
    third = n_distractors // 3
    raw[:third] = image[rng.integers(0, n_test, third)] + scale[:third] * rng.standard_normal((third, dim))
    raw[third: 2 * third] = text[rng.integers(0, n_captions, third)] + scale[third: 2 * third] * rng.standard_normal(
        (third, dim))
    return text, image, caption_image, ArrayRows(raw)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("precision", fast_first(["bf16", "tf32"]))
def test_certified_margin_path_equals_fp32(precision):
    """Chunks of 32 captions (the last of 12, and tiles of 256 items, the last of 12: those go in fp32) over
    near-tied distractors: the lists and ranks of the bf16 / TF32 path equal the fp32 path's bit for bit.
    (Not compared with compute_model_lists: near ties of a few fp32 ulps here, and it recounts a missed rank on
    rows recomputed 3 at a time, which MKL rounds differently from the tile its lists came from.)"""
    text, image, caption_image, rows = near_tie_case(1)
    stats: dict = {}
    got = gallery_lists(text, image, caption_image, rows, 20, "cpu", 32, 256, precision=precision, stats=stats)
    want = gallery_lists(text, image, caption_image, rows, 20, "cpu", 32, 256, precision="fp32")
    assert_same(got, want)
    assert stats["precision"] == precision and 0 < stats["rescored"] < stats["entries"]


def test_the_margin_matters_on_near_ties(monkeypatch):
    """With no margin the bf16 path gets these lists or ranks wrong: the data do exercise the bound."""
    text, image, caption_image, rows = near_tie_case(1)
    want = gallery_lists(text, image, caption_image, rows, 20, "cpu", 32, 256)
    monkeypatch.setattr(margin, "margin", lambda q, v, dim, out_unit: torch.zeros_like(q.norm))
    got = gallery_lists(text, image, caption_image, rows, 20, "cpu", 32, 256, precision="bf16")
    assert not all(np.array_equal(got.arrays()[n], want.arrays()[n]) for n in ("t2i_ids", "t2i_scores", "t2i_ranks"))


@pytest.mark.parametrize("precision,unit", [("bf16", 2.0**-8), ("tf32", 2.0**-10)])
def test_margin_bounds_the_low_precision_error_and_is_tight(precision, unit):
    """Random unit rows and rows whose every entry sits just below a rounding point (each loses almost ``unit`` of
    itself, all the same way): |b - s| <= Delta everywhere, and on the adversarial pair within 2x of it."""
    rng = np.random.default_rng(2)
    dim = 256
    rows = normalised(rng.standard_normal((300, dim)))
    adversarial = np.full((2, dim), 2.0**-4 * (1 + unit - 2.0**-20), dtype=np.float32)
    adversarial[1, ::2] *= -1
    x = torch.from_numpy(np.vstack([rows, adversarial]))
    q, v = margin.low_rows(x, precision), margin.low_rows(x, precision)
    approx, out_unit = margin.approx_similarity(q.low, v.low, precision)
    error = (approx.double() - similarity(x, x).double()).abs()
    delta = margin.margin(q, v, dim, out_unit)
    assert bool((error <= delta[:, None]).all())
    assert error[-2, -2] >= 0.5 * delta[-2]
    assert float(delta.max()) < 4 * unit  # and not vacuous


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_margin_bounds_a_product_rounded_to_bf16_too():
    """Where the product is only available in bf16 (a bf16 output, here the CPU's), the bound adds its rounding."""
    rng = np.random.default_rng(3)
    x = torch.from_numpy(normalised(rng.standard_normal((200, 64))))
    q = margin.low_rows(x, "bf16")
    rounded = q.low.to(torch.bfloat16)
    approx, out_unit = margin.approx_similarity(rounded, rounded, "bf16")
    assert out_unit == 2.0**-8
    error = (approx.double() - similarity(x, x).double()).abs()
    assert bool((error <= margin.margin(q, q, 64, out_unit)[:, None]).all())


def test_rescore_gives_the_tile_bits_of_every_entry_asked_in_batched_groups():
    """Sparse, clustered and dense masks over a 100 x 1000 block: every entry asked (and any other given) has
    the bits of the whole block's fp32 product; sparse masks go through several batches of row groups."""
    rng = np.random.default_rng(6)
    text = torch.from_numpy(normalised(rng.standard_normal((100, 40))))
    items = torch.from_numpy(normalised(rng.standard_normal((1000, 40))))
    whole = similarity(text, items)
    for density, grouped in ((0.0005, True), (0.01, True), (0.3, False)):  # 0.01: unions of ~150 columns, 2 batches
        need = torch.from_numpy(rng.random((100, 1000)) < density)
        need[7, 990:] = True
        exact, computed = margin.rescore(text, items, need)
        given = exact > -np.inf
        assert bool(given[need].all()) and torch.equal(exact[given], whole[given])
        assert (computed < 100 * 1000) == grouped and bool(given.all()) != grouped
    assert margin.rescore(text, items, torch.zeros(100, 1000, dtype=torch.bool))[1] == 0


def test_compute_model_lists_skips_captionless_tiles_and_strips_with_unchanged_results(monkeypatch):
    """Captionless images in the middle of the corpus (a whole tile of them, and 64-column strips inside tiles):
    lists and ranks equal the dense reference, and the i2t heaps are offered only the tiles that ask a query."""
    from fusebench.search import model_lists

    rng = np.random.default_rng(4)
    image = normalised(rng.standard_normal((700, 16)))
    asking = np.concatenate([np.arange(0, 100), np.arange(400, 420), np.arange(690, 700)])
    caption_image = np.sort(np.concatenate([asking, rng.choice(asking, 170)]))
    text = normalised(image[caption_image] + rng.standard_normal((300, 16)))
    offered = []
    original = model_lists._CpuLists.offer_columns
    monkeypatch.setattr(model_lists._CpuLists, "offer_columns",
                        lambda self, block, first_row, slot: offered.append(first_row) or original(self, block,
                                                                                                    first_row, slot))
    got = compute_model_lists(text, image, caption_image, 15, "cpu", 64, 128)
    assert len(offered) == 3 * 5  # tiles [0, 128), [384, 512), [640, 700) x five caption chunks
    scores = similarity(torch.from_numpy(text), torch.from_numpy(image))
    values, ids = topk_stable(scores, 15)
    assert np.array_equal(got["t2i"].ids.numpy(), ids.numpy()) and np.array_equal(got["t2i"].scores.numpy(), values.numpy())
    cap = torch.from_numpy(caption_image)
    assert np.array_equal(got["t2i"].ranks, target_ranks(scores, cap).numpy())
    query = torch.unique(cap)
    values, ids = topk_stable(scores[:, query].T.contiguous(), 15)
    assert np.array_equal(got["i2t"].ids.numpy(), ids.numpy()) and np.array_equal(got["i2t"].scores.numpy(), values.numpy())
    assert np.array_equal(got["i2t"].ranks, column_target_ranks(scores[:, query], cap, query).numpy())


def test_bad_inputs_are_refused_with_what_is_valid():
    text, image, caption_image, distractors = tie_case(7, 30, 100, 50)
    with pytest.raises(FusebenchError, match="7 dimensions.*6"):
        gallery_lists(text, image, caption_image, RawRows(np.ones((5, 7))), 5)
    with pytest.raises(ValueError, match="precision 'fp16': valid values are fp32, bf16, tf32"):
        gallery_lists(text, image, caption_image, RawRows(distractors), 5, precision="fp16")

    class Short(RawRows):
        def read(self, start, stop):
            return self.rows[start:stop - 1]

    with pytest.raises(ValueError, match=r"distractor rows 0:.*'raw'.*expected"):
        gallery_lists(text, image, caption_image, Short(distractors), 5, "cpu", 16, 20)


@pytest.mark.slow
def test_200k_distractors_against_full_rows_counted_the_obvious_way():
    """2,000 captions x (1,000 test + 200,000 generated distractor) images: for 40 sampled captions, the whole
    row recomputed in fp32 (same item tiles), the list a stable sort of it, the rank counted over it."""
    rng = np.random.default_rng(8)
    dim, n_test, n_captions = 48, 1000, 2000
    mix = (rng.standard_normal((16, dim)) / 4).astype(np.float32)
    z = rng.standard_normal((n_test, 16)).astype(np.float32)
    caption_image = np.concatenate([np.arange(n_test), rng.integers(0, n_test, n_captions - n_test)])
    image = normalised(z @ mix + 0.5 * rng.standard_normal((n_test, dim)))
    text = normalised((z[caption_image] + 0.8 * rng.standard_normal((n_captions, 16))) @ mix
                      + 0.5 * rng.standard_normal((n_captions, dim)))
    rows = SeededRows(200_000, dim, seed=11, mix=mix, noise=0.5)
    got = gallery_lists(text, image, caption_image, rows, 50, "cpu", 1024, 16384)
    assert rows.peak_live <= 16384
    sample = rng.choice(n_captions, 40, replace=False)
    gallery = np.vstack([image, rows.all_rows()])
    full = np.concatenate([similarity(torch.from_numpy(text[sample]), torch.from_numpy(gallery[c0:c1])).numpy()
                           for c0, c1 in tiles(len(gallery), 16384)], axis=1)
    for i, q in enumerate(sample):
        row, target = full[i], caption_image[q]
        order = np.argsort(-row, kind="stable")[:50]
        assert np.array_equal(got["t2i"].ids.numpy()[q], order)
        assert np.array_equal(got["t2i"].scores.numpy()[q], row[order])
        ahead = np.count_nonzero(row > row[target]) + np.count_nonzero(row[:target] == row[target])
        assert got["t2i"].ranks[q] == ahead + 1
    assert (got["t2i"].ranks > 1).mean() > 0.2  # the distractors do outrank targets


def test_the_seconds_by_direction_split_the_one_pass(monkeypatch):
    """Issue 39 item 5: ``stats`` gets the pass's time by direction: i2t's own work (the image heaps' columns, the
    i2t lists and ranks: timed by the clock around them) and t2i, the rest; both cover the whole call between them."""
    import fusebench.search.gallery_search as module

    text, image, caption_image, rows = near_tie_case(1)
    ticks = iter(range(1000))
    monkeypatch.setattr(module.time, "perf_counter", lambda: float(next(ticks)))  # each reading one second later
    stats: dict = {}
    gallery_lists(text, image, caption_image, rows, 20, "cpu", 32, 256, precision="fp32", stats=stats)
    readings = next(ticks)  # how many times the clock was read
    offers = (readings - 4) // 2  # started, the two around i2t's tail and the last: the rest are offer_columns pairs
    assert offers >= 1 and stats["i2t_seconds"] == offers + 1  # one second inside each bracket
    assert stats["t2i_seconds"] + stats["i2t_seconds"] == readings - 1  # the last reading (value readings - 1) minus the first (0)
