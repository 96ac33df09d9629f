"""The numba heaps against the stable top-k written with torch, on inputs that defeat the rows' and columns' floors."""

import numpy as np
import pytest
import torch

from fusebench.search import row_kernels, topk_kernels
from fusebench.search.exact import topk_stable
from fusebench.search.row_kernels import gather_rows, row_order, scatter_by_order, stable_ranks
from fusebench.search.topk_kernels import Heaps


def _blocks():
    rng = np.random.default_rng(11)
    yield "normal", rng.standard_normal((40, 3000)).astype(np.float32)
    yield "all equal", np.full((6, 2500), 0.25, dtype=np.float32)
    yield "ascending (best at the end)", np.tile(np.linspace(-1, 1, 2600, dtype=np.float32), (5, 1))
    ties = rng.integers(-3, 4, size=(30, 2000)).astype(np.float32)  # ties across every cut
    yield "few distinct values", ties
    spikes = rng.standard_normal((8, 4000)).astype(np.float32) * 0.01
    spikes[:, 3900:] += 5.0  # the whole top-k in one region the strided sample mostly misses
    yield "top in one region", spikes


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("k", [1, 7, 100, 300])
def test_row_heaps_equal_stable_topk(k):
    for label, block in _blocks():
        heaps = Heaps(block.shape[0], min(k, block.shape[1]))
        half = block.shape[1] // 2  # two item tiles, as with item_chunk_size < items
        heaps.offer_rows(np.ascontiguousarray(block[:, :half]), 0)
        heaps.offer_rows(np.ascontiguousarray(block[:, half:]), half)
        values, ids = heaps.lists()
        expected_values, expected_ids = topk_stable(torch.from_numpy(block), k)
        assert np.array_equal(ids, expected_ids.numpy()), label
        assert np.array_equal(values, expected_values.numpy()), label


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("k,cuts", [(1, 700), (9, 700), (100, 700), (100, (50, 750, 1650)), (300, (50, 750, 1650))])
def test_column_heaps_equal_stable_topk(k, cuts):
    """Tiles of 700 rows, or uneven ones: a first tile too short for a floor, a second while the heaps still
    fill (floors from chunk maxima), later ones once they are full (no floor pass)."""
    for label, block in _blocks():
        columns = block.T.copy()  # rows of ``columns`` arrive as caption tiles; each column is a query
        slot = np.arange(columns.shape[1])
        slot[::7] = -1  # columns that ask no query (distractor images)
        slot[slot >= 0] = np.arange((slot >= 0).sum())
        heaps = Heaps(int((slot >= 0).sum()), min(k, columns.shape[0]))
        starts = list(range(0, columns.shape[0], cuts)) if isinstance(cuts, int) else [0, *cuts]
        for r0, r1 in zip(starts, [*starts[1:], columns.shape[0]]):
            heaps.offer_columns(np.ascontiguousarray(columns[r0:r1]), r0, slot)
        values, ids = heaps.lists()
        expected_values, expected_ids = topk_stable(torch.from_numpy(block[slot >= 0]), k)
        assert np.array_equal(ids, expected_ids.numpy()), label
        assert np.array_equal(values, expected_values.numpy()), label


@pytest.mark.parametrize("k,rows", [(9, 360), (9, 100), (40, 1000), (40, 120)])
def test_column_floor_keeps_exactly_enough(k, rows):
    """One tile whose top k are one entry in each of k chunks (the floor's chunks: rows // (4 k) rows each,
    single rows below 4 k): the k-th largest chunk maximum is the k-th best entry itself, so a floor one
    place too high, or one built from too few chunks, loses it."""
    rng = np.random.default_rng(k + rows)
    chunk = max(1, rows // (4 * k))
    columns = rng.uniform(-1, 0, size=(rows, 70)).astype(np.float32)
    for j in range(70):
        chunks = rng.permutation(rows // chunk)
        columns[chunks * chunk + rng.integers(0, chunk, chunks.size), j] = rng.permutation(chunks.size) + 1.0
    slot = np.arange(70)
    heaps = Heaps(70, k)
    heaps.offer_columns(columns, 0, slot)
    values, ids = heaps.lists()
    expected_values, expected_ids = topk_stable(torch.from_numpy(columns.T.copy()), k)
    assert np.array_equal(ids, expected_ids.numpy())
    assert np.array_equal(values, expected_values.numpy())


def _group_maxima(row: np.ndarray, k: int) -> np.ndarray:
    """The maxima of the row's 2 k interleaved groups, written the obvious way."""
    return np.array([row[g::2 * k].max() for g in range(2 * k)])


def _assert_floor_below_kth(floor: float, maxima: np.ndarray, k: int) -> None:
    """``floor`` is at most the k-th largest of ``maxima`` and within 2^-BISECTION_STEPS of their range of it (one
    float32 step of slack for the halvings' rounding)."""
    kth = np.sort(maxima)[::-1][k - 1]
    gap = (maxima.max() - maxima.min()) * 2.0 ** -topk_kernels.BISECTION_STEPS
    assert floor <= kth
    assert kth - floor <= gap + np.spacing(np.float32(abs(kth) + gap))


@pytest.mark.parametrize("k", [1, 2, 7, 100])
def test_row_floor_lies_just_below_the_kth_group_maximum_and_keeps_enough(k):
    """The row floor (a bisection over the group maxima) against sorting them, on the blocks above and on rows
    whose width is not a multiple of 2 k, ties among the maxima included; at least k entries of each row lie at
    or above it; under 4 k entries it is -inf."""
    rng = np.random.default_rng(k)
    rows = [row for _, block in _blocks() for row in block[:3]]
    rows += [rng.integers(0, 3, size=width).astype(np.float32) for width in (4 * k, 4 * k + 1, 9 * k + 5)]
    rows += [np.full(4 * k + 3, 0.25, dtype=np.float32)]
    for row in rows:
        floor = row_kernels._row_floor(np.ascontiguousarray(row), k)
        _assert_floor_below_kth(floor, _group_maxima(row, k), k)
        assert (row >= floor).sum() >= k
    assert row_kernels._row_floor(np.zeros(4 * k - 1, dtype=np.float32), k) == -np.inf


def test_floor_bisection_keeps_k_entries_at_its_extremes():
    """The bisection alone on values spread over many orders of magnitude, denormal, all equal, or holding -inf and
    +inf: never a floor with fewer than k values at or above it (nor NaN), and on finite values of a moderate range
    within 2^-BISECTION_STEPS of it below the k-th largest. Near float32's largest magnitudes the middle may overflow:
    the floor must stay safe there, not tight."""
    rng = np.random.default_rng(5)
    tight = [(rng.standard_normal(200) * 10.0 ** rng.integers(-30, 30, 200)).astype(np.float32),
             np.full(200, -7.5, dtype=np.float32), rng.uniform(-1, 1, 64).astype(np.float32),
             (rng.uniform(0, 1, 64) * 1e-40).astype(np.float32)]  # denormals
    loose = [np.array([3.4e38, 3.39e38, 3.38e38, 3.37e38, -3.4e38, 0.0], dtype=np.float32),
             np.array([-np.inf, np.inf, -np.inf, -np.inf], dtype=np.float32),
             np.array([-np.inf, 0.5, np.inf, 0.25, -np.inf, 0.75], dtype=np.float32),
             np.array([-np.inf] * 3 + [0.1, 0.2, 0.3], dtype=np.float32),
             np.full(8, np.inf, dtype=np.float32)]
    for values in tight + loose:
        for k in sorted({1, 2, len(values) // 2, len(values)}):
            floor = topk_kernels._floor_below_kth(values, k)
            assert not np.isnan(floor)
            assert (values >= floor).sum() >= k
            if any(values is case for case in tight):
                _assert_floor_below_kth(floor, values, k)
            else:
                assert floor <= np.sort(values)[::-1][k - 1]
    # a row's floor through the group maxima: [-inf, +inf, -inf, -inf] at k = 1 keeps its +inf entry and only it
    row = np.array([-np.inf, np.inf, -np.inf, -np.inf], dtype=np.float32)
    floor = row_kernels._row_floor(row, 1)
    assert floor > -np.inf and (row >= floor).sum() == 1


@pytest.mark.parametrize("k,width", [(9, 36), (9, 1000), (100, 5000), (100, 5037)])
def test_row_floor_keeps_exactly_enough(k, width):
    """A row whose top k lie one in each of k distinct groups (entries j, j + 2k, ... form group j): the k-th
    largest group maximum is the k-th best entry itself, so a floor one place too high loses it."""
    rng = np.random.default_rng(k + width)
    block = rng.uniform(-1, 0, size=(5, width)).astype(np.float32)
    for row in block:
        groups = rng.choice(2 * k, size=k, replace=False)
        row[groups + 2 * k * rng.integers(0, width // (2 * k), size=k)] = rng.permutation(k) + 1.0
        floor = row_kernels._row_floor(row, k)
        assert 1.0 - (k + 1.0) * 2.0 ** -topk_kernels.BISECTION_STEPS <= floor <= 1.0  # maxima range over (-1, k]
    heaps = Heaps(5, k)
    heaps.offer_rows(block, 0)
    values, ids = heaps.lists()
    expected_values, expected_ids = topk_stable(torch.from_numpy(block), k)
    assert np.array_equal(ids, expected_ids.numpy())
    assert np.array_equal(values, expected_values.numpy())


def test_bad_slot_map_raises_instead_of_writing_out_of_bounds():
    heaps = Heaps(3, 2)
    with pytest.raises(ValueError, match="slot"):
        heaps.offer_columns(np.zeros((4, 5), dtype=np.float32), 0, np.arange(5))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_row_order_scatter_and_gather_against_numpy(dtype):
    """Row orders (score desc, index asc: numpy's stable argsort of the negated scores), the ranks scattered
    from them and the values gathered by them, with an order of each dtype the score store writes."""
    rng = np.random.default_rng(5)
    block = rng.integers(-3, 4, size=(9, 40)).astype(np.float32)  # many ties
    order = row_order(block)
    assert np.array_equal(order, np.argsort(-block, axis=1, kind="stable"))
    ranks, _ = stable_ranks(block)
    assert np.array_equal(np.take_along_axis(ranks, order, 1), np.tile(np.arange(1, 41), (9, 1)))
    stored = order.astype(dtype)
    by_rank = rng.standard_normal(40).astype(np.float32)
    out = np.zeros_like(block)
    scatter_by_order(stored, by_rank, out, False)
    scatter_by_order(stored, by_rank, out, True)
    expected = np.zeros_like(block)
    for r in range(9):
        expected[r, order[r]] = 2 * by_rank
    assert np.array_equal(out, expected)
    assert np.array_equal(gather_rows(block, stored, np.empty_like(block)), np.take_along_axis(block, order, 1))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_row_order_of_a_large_block_on_threads(dtype):
    """A block large enough for one thread per core (ties, -0.0 against 0.0, infinities) gives numpy's stable
    argsort of the negated scores, in the dtype asked for; a dtype too narrow for the columns is refused."""
    rng = np.random.default_rng(11)
    block = rng.integers(-20, 21, size=(301, 4000)).astype(np.float32)  # 1.2M entries: 2 threads
    block[5, :7] = [0.0, -0.0, np.inf, -np.inf, 0.0, -0.0, np.inf]
    assert block.size > 1 << 20
    order = row_order(block, dtype)
    assert order.dtype == dtype
    assert np.array_equal(order, np.argsort(-block, axis=1, kind="stable"))
    with pytest.raises(ValueError, match="columns"):
        row_order(np.zeros((2, 70_000), dtype=np.float32), np.uint16)


def test_row_order_radix_passes_against_numpy():
    """The radix sort's passes: keys that differ only in their low, middle or high digit (a pass that moves
    entries beside passes it skips), every digit at once (scores spread over many exponents, subnormals, both
    signs), all equal (every pass skipped), one column and none, and rows wider than the 2,048 buckets."""
    rng = np.random.default_rng(5)
    base = np.float32(0.3)
    low = base + np.arange(64, dtype=np.float32) * np.spacing(base)  # the same high bits, the low digit varies
    middle = np.float32(0.3) * (1 + rng.integers(0, 64, 300).astype(np.float32) / 2**12)
    spread = (rng.standard_normal(3000) * 10.0 ** rng.integers(-40, 30, 3000)).astype(np.float32)
    spread[:6] = [0.0, -0.0, 1e-45, -1e-45, np.float32(np.finfo(np.float32).max), -np.inf]
    rows = [low, rng.permutation(low), middle, spread, np.full(2500, -0.25, np.float32), np.zeros(1, np.float32),
            np.zeros(0, np.float32), np.repeat(rng.standard_normal(40).astype(np.float32), 100)]
    for row in rows:
        block = np.ascontiguousarray(np.vstack([row, row[::-1]]))
        assert np.array_equal(row_order(block), np.argsort(-block, axis=1, kind="stable")), row[:3]


@pytest.mark.parametrize("flat_rows", [False, True])
def test_affine_count_top_equals_evidence_count_and_heap_passes(flat_rows):
    """The fused document pass equals its three parts: the evidence row (affine_evidence), the entries ahead
    of (best, tiebreak, index) counted on it with the scores as tiebreak (count_ahead), and the row's top k
    (offer_rows) - on rows with many ties and, with flat_rows, some rows that are flat."""
    from fusebench.search.row_kernels import affine_count_top, affine_evidence, count_ahead

    rng = np.random.default_rng(11)
    rows, width, k = 12, 300, 7
    block = rng.integers(-4, 5, size=(rows, width)).astype(np.float32) / 4
    low = rng.uniform(-1, 0, rows).astype(np.float32)
    scale = rng.uniform(0.5, 2, rows).astype(np.float32)
    flat = np.zeros(rows, dtype=bool)
    if flat_rows:
        flat[::3] = True
    evidence = np.empty_like(block)
    affine_evidence(block, low, scale, flat, 0.5, 0.7, evidence, False)
    pick = rng.integers(0, width, rows)
    best = evidence[np.arange(rows), pick].copy()
    tb = np.where(np.arange(rows) % 3 == 0, -np.inf, np.where(np.arange(rows) % 3 == 1, block[np.arange(rows), pick],
                                                               np.inf)).astype(np.float32)
    index = np.where(np.arange(rows) % 3 == 1, pick, 0).astype(np.int64)
    heaps = Heaps(rows, k)
    got = affine_count_top(block, low, scale, flat, 0.5, 0.7, best, tb, index, heaps.vals, heaps.ids, heaps.counts)
    assert np.array_equal(got, count_ahead(evidence, block, True, best, tb, index))
    from fusebench.fusion.normalisers import RowAffine
    from fusebench.fusion.whole_rankings import _affine_at  # the same evidence from scores in torch, bit for bit

    rows_affine = RowAffine(torch.from_numpy(low)[:, None], torch.from_numpy(scale)[:, None],
                            torch.from_numpy(flat)[:, None], 0.5)
    assert torch.equal(_affine_at(torch.from_numpy(block), rows_affine, 0.7), torch.from_numpy(evidence))
    reference = Heaps(rows, k)
    reference.offer_rows(block, 0)
    for a, b in zip(heaps.lists(), reference.lists()):
        assert np.array_equal(a, b)
