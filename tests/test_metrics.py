import numpy as np
import pytest
import torch

from fusebench.evaluation.comparisons import retriever_result
from fusebench.evaluation.metrics import hits_at_k, median_rank, recall_at_k
from fusebench.evaluation.record import ModelRecord
from fusebench.search.ranked import i2t_list_ranks, t2i_list_ranks


def test_recall_and_median_exact_numbers():
    ranks = np.array([1, 2, 3, 11, 0, 1, 7, 1])
    assert recall_at_k(ranks, 1) == pytest.approx(37.5)
    assert recall_at_k(ranks, 5) == pytest.approx(62.5)
    assert recall_at_k(ranks, 10) == pytest.approx(75.0)
    # sorted with absent as +inf: 1 1 1 2 3 7 11 inf -> median (2 + 3) / 2
    assert median_rank(ranks) == pytest.approx(2.5)


def test_median_rank_absent_when_most_queries_missing():
    assert median_rank(np.array([0, 0, 0, 4])) is None


def test_hits_treat_zero_as_miss():
    assert hits_at_k(np.array([0, 1, 5, 6]), 5).tolist() == [False, True, True, False]


def test_list_ranks_both_directions():
    ids = torch.tensor([[4, 2, 9], [1, 3, -1], [7, 7, 2]])
    assert t2i_list_ranks(ids, torch.tensor([2, 5, 7])).tolist() == [2, 0, 1]
    caption_image = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    # query image 4 owns captions 8, 9; image 1 owns 2, 3; image 3 owns 6, 7
    assert i2t_list_ranks(ids, torch.tensor([4, 1, 3]), caption_image).tolist() == [3, 2, 1]


def test_retriever_result_and_mean_of_directions():
    result = retriever_result("m", {"t2i": np.array([1, 2, 3, 4]), "i2t": np.array([1, 1, 9, 0])}, [1, 5], ModelRecord({"kind": "sim"}))
    assert result.to_json()["t2i"] == {"R@1": 25.0, "R@5": 100.0, "median_rank": 2.5, "n_queries": 4}
    assert result.to_json()["mean"] == {"R@1": 37.5, "R@5": 75.0} and not result.is_fusion
    # the published DFN5B COCO "63.1" is this mean: (53.96 + 72.26) / 2 (5000 and 25000 queries here)
    t2i, i2t = np.r_[np.ones(2698), np.zeros(2302)], np.r_[np.ones(18065), np.zeros(6935)]
    assert retriever_result("d", {"t2i": t2i, "i2t": i2t}, [1], ModelRecord({})).recall("mean", 1) == pytest.approx(63.11)
