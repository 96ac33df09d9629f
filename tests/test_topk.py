import numpy as np
import pytest
import torch
from helpers.reference import i2t_rank, integer_embeddings, stable_order, t2i_rank

from fusebench.encoders.devices import resolve_device
from fusebench.search.exact import column_target_ranks, merge_topk, target_ranks, topk_stable


@pytest.fixture
def tied_scores():
    rng = np.random.default_rng(0)
    return torch.from_numpy(integer_embeddings(rng, 60) @ integer_embeddings(rng, 37).T)


@pytest.mark.parametrize("k", [1, 3, 10, 36, 37, 50])
def test_topk_stable_matches_stable_sort(tied_scores, k):
    values, ids = topk_stable(tied_scores, k)
    for row in range(tied_scores.shape[0]):
        expected = stable_order(tied_scores[row].tolist())[: min(k, 37)]
        assert ids[row].tolist() == expected
        assert values[row].tolist() == [tied_scores[row, j].item() for j in expected]


def test_topk_stable_tie_straddling_the_cut():
    scores = torch.tensor([[1.0, 5.0, 3.0, 5.0, 3.0, 3.0, 0.0]])
    values, ids = topk_stable(scores, 4)
    assert ids.tolist() == [[1, 3, 2, 4]]
    assert values.tolist() == [[5.0, 5.0, 3.0, 3.0]]


def test_topk_stable_on_transposed_view(tied_scores):
    values, ids = topk_stable(tied_scores.T, 7)
    for col in range(tied_scores.shape[1]):
        assert ids[col].tolist() == stable_order(tied_scores[:, col].tolist())[:7]


def test_target_ranks_match_reference(tied_scores):
    rng = np.random.default_rng(1)
    targets = torch.from_numpy(rng.integers(0, 37, size=60))
    ranks = target_ranks(tied_scores, targets)
    assert ranks.tolist() == [t2i_rank(tied_scores[r].tolist(), int(targets[r])) for r in range(60)]


def test_column_target_ranks_match_reference(tied_scores):
    rng = np.random.default_rng(2)
    owner = torch.from_numpy(rng.integers(0, 12, size=60))
    items = torch.unique(owner)
    ranks = column_target_ranks(tied_scores[:, : len(items)], owner, items)
    for j, item in enumerate(items.tolist()):
        correct = {c for c in range(60) if owner[c] == item}
        assert ranks[j].item() == i2t_rank(tied_scores[:, j].tolist(), correct)


def test_merge_topk_equals_topk_of_whole(tied_scores):
    columns = tied_scores.T.contiguous()  # 37 x 60: merge over blocks of the 60 "captions"
    chunks = []
    for start in range(0, 60, 16):
        values, ids = topk_stable(columns[:, start:start + 16], 9)
        chunks.append((values, ids + start))
    merged_values, merged_ids = merge_topk(chunks, 9)
    whole_values, whole_ids = topk_stable(columns, 9)
    assert torch.equal(merged_ids, whole_ids)
    assert torch.equal(merged_values, whole_values)


def test_resolve_device():
    from fusebench import FusebenchError

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in {"cpu", "cuda", "mps"}
    with pytest.raises(FusebenchError, match="not a torch device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(FusebenchError, match="no CUDA device"):
            resolve_device("cuda")


def test_descending_keys_order_special_floats():
    from fusebench.search.exact import decode_keys, descending_keys, sort_desc_with_tiebreak

    values = torch.tensor([[0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf"), 1e-30, -1e-30, 1.5]])
    sorted_values, positions = sort_desc_with_tiebreak(values)
    assert positions.tolist() == [[4, 2, 8, 6, 0, 1, 7, 3, 5]]
    assert torch.equal(sorted_values, values.gather(1, positions))
    tiebreak = torch.tensor([[5, 4, 3, 2, 1, 0, 7, 8, 9]])
    decoded_values, decoded_tiebreak = decode_keys(descending_keys(values, tiebreak))
    assert decoded_tiebreak.tolist() == tiebreak.tolist()
    assert torch.equal(decoded_values.abs(), values.abs())
