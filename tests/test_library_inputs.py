"""Every bad argument of the library (``fusebench.library``) is one FusebenchError naming it and what is valid,
raised at the entry before any work: never a wrong number with no error, never a raw traceback."""

from __future__ import annotations

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.library import Lists, compare, fuse, ranks, recall, search

CI = np.array([0, 0, 1, 1])  # 4 texts on images 0 and 1


def _rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 3))


def _found(seed: int = 0) -> dict[str, Lists]:
    return search(_rows(4, seed), _rows(3, seed + 1), 3, CI)


A, B = _found(0), _found(2)


def _swap(found: dict[str, Lists], **arrays) -> dict[str, Lists]:
    """``found`` with its t2i lists' arrays replaced."""
    return {**found, "t2i": Lists(**{"ids": found["t2i"].ids, "scores": found["t2i"].scores, **arrays})}


def _nan_scores() -> np.ndarray:
    scores = np.random.default_rng(0).random((4, 2))
    scores[0] = np.nan
    return scores


def _nan_lists() -> dict[str, Lists]:
    scores = A["t2i"].scores.copy()
    scores[1, 0] = np.nan
    return _swap(A, scores=scores)


RANKS = np.array([1, 0, 3, 2])

CASES = {
    # ranks
    "ranks nan row": (lambda: ranks(_nan_scores(), CI), "lists_or_scores row 0"),
    "ranks nan column (i2t)": (lambda: ranks(_nan_scores().T.copy(), CI, "i2t"), "lists_or_scores row"),
    "ranks int matrix": (lambda: ranks(np.zeros((3, 5), int), CI), "lists_or_scores"),
    "ranks negative image": (lambda: ranks(_nan_scores() * 0, CI - 1), "caption_image"),
    # fuse: weights, by the run's rule
    "weights all zero": (lambda: fuse([A, B], weights=[0, 0]), "every model weight is 0"),
    "weights negative": (lambda: fuse([A, B], weights=[1, -1]), "weights[1]"),
    "weights nan": (lambda: fuse([A, B], weights=[1, float("nan")]), "weights[1]"),
    "weights huge": (lambda: fuse([A, B], weights=[1, 1e30]), "weights[1]"),
    "weights string": (lambda: fuse([A, B], weights="12"), "weights="),
    "weights mapping negative": (lambda: fuse([A, B], weights={"1": -2}), "weights['1']"),
    # fuse: the lists
    "ids outside n_items": (lambda: fuse([_swap(A, ids=A["t2i"].ids + 1000), B], n_items={"t2i": 3, "i2t": 4}),
                            "lists['0']['t2i'].ids"),
    "ids below -1": (lambda: fuse([_swap(A, ids=A["t2i"].ids - 1000), B]), "lists['0']['t2i'].ids"),
    "nan scores": (lambda: fuse([A, _nan_lists()]), "lists['1']['t2i'].scores"),
    "shapes differ": (lambda: fuse([_swap(A, scores=A["t2i"].scores[:, :2]), B]), "lists['0']['t2i'].scores"),
    "float ids": (lambda: fuse([_swap(A, ids=A["t2i"].ids.astype(float)), B]), "lists['0']['t2i'].ids"),
    "zero width": (lambda: fuse([_swap(A, ids=A["t2i"].ids[:, :0], scores=A["t2i"].scores[:, :0]), B]),
                   "lists['0']['t2i'].ids"),
    "caption_image length": (lambda: fuse([A, B], caption_image=CI[:3]), "caption_image"),
    "n_items negative": (lambda: fuse([A, B], n_items={"t2i": -1}), "n_items['t2i']"),
    "n_items not a mapping": (lambda: fuse([A, B], n_items=5), "n_items"),
    "query counts differ": (lambda: fuse([_swap(A, ids=A["t2i"].ids[:3], scores=A["t2i"].scores[:3]), B]),
                            "different numbers of queries"),
    # recall
    "recall empty": (lambda: recall([]), "ranks"),
    "recall k 0": (lambda: recall(RANKS, [0]), "ks"),
    "recall k -1": (lambda: recall(RANKS, [-1]), "ks"),
    "recall negative ranks": (lambda: recall(np.array([1, -2])), "ranks"),
    "recall float ranks": (lambda: recall(np.array([1.0, 2.5])), "ranks"),
    "recall ks string": (lambda: recall(RANKS, "15"), "ks"),
    # compare
    "compare k 0": (lambda: compare(RANKS, RANKS, k=0), "k=0"),
    "compare k -1": (lambda: compare(RANKS, RANKS, k=-1), "k=-1"),
    "compare negative ranks": (lambda: compare(RANKS, -RANKS), "ranks_b"),
    "compare float ranks": (lambda: compare(RANKS * 1.5, RANKS), "ranks_a"),
    "compare names": (lambda: compare(RANKS, RANKS, names="a"), "names"),
    "compare lengths": (lambda: compare(RANKS, RANKS[:3]), "ranks_a and ranks_b"),
    # search
    "search no texts": (lambda: search(np.empty((0, 3)), _rows(3, 1), 2), "texts"),
    "search no images": (lambda: search(_rows(4, 0), np.empty((0, 3)), 2), "images"),
    "search device": (lambda: search(_rows(4, 0), _rows(3, 1), 2, device="tpu"), "device"),
    "search chunk_size 0": (lambda: search(_rows(4, 0), _rows(3, 1), 2, chunk_size=0), "chunk_size"),
    "search item_chunk_size -1": (lambda: search(_rows(4, 0), _rows(3, 1), 2, item_chunk_size=-1),
                                  "item_chunk_size"),
    "search chunk_size float": (lambda: search(_rows(4, 0), _rows(3, 1), 2, chunk_size=1.5), "chunk_size"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_argument_is_one_line_naming_it(case):
    call, fragment = CASES[case]
    with pytest.raises(FusebenchError) as err:
        call()
    message = str(err.value)
    assert fragment in message and "\n" not in message, message


def test_valid_numpy_scalars_and_arrays_still_read():
    """What the checks convert (NumPy scalars, a weights array) gives what the Python values give."""
    plain = fuse([A, B], "rrf", weights=[1, 0.5], n_items={"t2i": 3, "i2t": 4}, caption_image=CI)
    numpy = fuse([A, B], "rrf", weights=np.array([1, 0.5], np.float32), n_items={"t2i": np.int64(3), "i2t": 4},
                 caption_image=CI)
    for d in plain:
        np.testing.assert_array_equal(plain[d].ids, numpy[d].ids)
        np.testing.assert_array_equal(plain[d].scores, numpy[d].scores)
    assert recall(RANKS, np.array([1, 5])) == recall(RANKS, [1, 5]) == {1: 25.0, 5: 75.0}
    assert compare(RANKS, RANKS, np.int64(2)).gain == 0
