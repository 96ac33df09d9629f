"""The numba heaps against the stable top-k written with torch, on inputs that defeat the sampled floor."""

import numpy as np
import pytest
import torch

from fusebench.kernels import Heaps, gather_rows, row_order, scatter_by_order, stable_ranks
from fusebench.topk import topk_stable


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


@pytest.mark.parametrize("k", [1, 9, 100])
def test_column_heaps_equal_stable_topk(k):
    for label, block in _blocks():
        columns = block.T.copy()  # rows of ``columns`` arrive as caption tiles; each column is a query
        slot = np.arange(columns.shape[1])
        slot[::7] = -1  # columns that ask no query (distractor images)
        slot[slot >= 0] = np.arange((slot >= 0).sum())
        heaps = Heaps(int((slot >= 0).sum()), min(k, columns.shape[0]))
        for r0 in range(0, columns.shape[0], 700):
            heaps.offer_columns(np.ascontiguousarray(columns[r0:r0 + 700]), r0, slot)
        values, ids = heaps.lists()
        expected_values, expected_ids = topk_stable(torch.from_numpy(block[slot >= 0]), k)
        assert np.array_equal(ids, expected_ids.numpy()), label
        assert np.array_equal(values, expected_values.numpy()), label


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
    assert np.array_equal(gather_rows(block, stored), np.take_along_axis(block, order, 1))
