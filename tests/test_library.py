"""The library beneath the app (``fusebench.library``): each function equals what a run computes on the same rows
(its saved lists, ranks and comparisons, bit for bit), against slow references written the obvious way, and every
bad argument is one FusebenchError naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_api import _models, _write_inputs

import fusebench
from fusebench import DIRECTIONS, FusebenchError
from fusebench.fusion import methods as registry
from fusebench.library import Lists, compare, fuse, ranks, recall, search


def _reference_ranks(scores: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """1-based rank of each row's first correct column under a stable descending sort (the obvious way)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.array([int(np.flatnonzero(correct[r][order[r]])[0]) + 1 for r in range(len(scores))])


def _normalised(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_search_lists_and_ranks_against_a_sort_of_every_score():
    models, caption_image = _models(n=30)
    image, text = models["a"]
    found = search(text, image, 7, caption_image, chunk_size=16, item_chunk_size=8)  # several tiles
    scores = _normalised(text) @ _normalised(image).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(found["t2i"].ids, order)
    np.testing.assert_allclose(found["t2i"].scores, np.take_along_axis(scores, order, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(found["t2i"].ranks, _reference_ranks(scores, np.arange(30)[None, :] ==
                                                                        caption_image[:, None]))
    query_images = np.unique(caption_image)
    i2t_scores = scores.T[query_images]
    np.testing.assert_array_equal(found["i2t"].ranks, _reference_ranks(i2t_scores, caption_image[None, :] ==
                                                                        query_images[:, None]))
    # a score matrix gives the same exact ranks; the lists' ids their list ranks
    np.testing.assert_array_equal(ranks(scores, caption_image, "t2i"), found["t2i"].ranks)
    np.testing.assert_array_equal(ranks(scores.T, caption_image, "i2t"), found["i2t"].ranks)
    listed = ranks(found, caption_image)
    inside = found["t2i"].ranks <= 7
    np.testing.assert_array_equal(listed["t2i"][inside], found["t2i"].ranks[inside])
    assert (listed["t2i"][~inside] == 0).all()
    # without positives: lists only, i2t over every image
    bare = search(text, image, 5)
    assert bare["t2i"].ranks is None and bare["i2t"].ids.shape == (30, 5)
    np.testing.assert_array_equal(bare["t2i"].ids, order[:, :5])
    np.testing.assert_array_equal(bare["i2t"].ids, np.argsort(-scores.T, axis=1, kind="stable")[:, :5])


def test_recall_and_compare_against_their_definitions():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 12, 400), rng.integers(0, 12, 400)
    assert recall(a, [1, 5]) == {1: 100 * np.mean((a >= 1) & (a <= 1)), 5: 100 * np.mean((a >= 1) & (a <= 5))}
    row = compare(a, b, 5, draws=500, seed=2)
    hits_a, hits_b = (a >= 1) & (a <= 5), (b >= 1) & (b <= 5)
    assert row.gain == pytest.approx(100 * (hits_a.mean() - hits_b.mean()))
    assert (row.wins, row.losses) == (int((hits_a & ~hits_b).sum()), int((hits_b & ~hits_a).sum()))
    assert row.ci_low <= row.gain <= row.ci_high and 0 <= row.p_value <= 1 and row.draws == 500 and row.k == 5


def test_fuse_names_the_valid_methods_and_settings():
    found = search(*reversed(_models(n=10)[0]["a"]), 4)
    with pytest.raises(FusebenchError) as err:
        fuse([found, found], method="nope")
    assert all(name in str(err.value) for name in registry.names())
    with pytest.raises(FusebenchError, match="phi"):
        fuse([found, found], method="rrf", phi=0.5)
    with pytest.raises(FusebenchError, match="at least two"):
        fuse([found], method="rrf")
    with pytest.raises(FusebenchError, match="weights holds 3"):
        fuse([found, found], method="rrf", weights=[1, 2, 3])


@pytest.mark.parametrize("call,match", [
    (lambda: search(np.ones((3, 2)), np.ones((4, 3)), 2), "dims"),
    (lambda: search(np.ones((3, 2)), np.ones((4, 2)), 0), "k=0"),
    (lambda: search(np.ones((3, 2)), np.ones((4, 2)), 2, [0, 1]), "caption_image"),
    (lambda: search(np.ones((3, 2)), np.ones((4, 2)), 2, [0, 1, 9]), "outside"),
    (lambda: search(np.zeros((3, 2)), np.ones((4, 2)), 2), "all zeros"),
    (lambda: ranks(np.ones((3, 4)), [0, 1], "t2i"), "one row per text"),
    (lambda: ranks(np.ones((3, 4)), [0, 1, 2], "x2y"), "direction"),
    (lambda: recall(np.ones((2, 2))), "1-D"),
    (lambda: compare(np.ones(3, int), np.ones(4, int)), "same queries"),
    (lambda: compare(np.ones(3, int), np.ones(3, int), clusters=[1]), "clusters"),
    (lambda: compare(np.ones(3, int), np.ones(3, int), level=2), "level"),
])
def test_bad_arguments_are_one_message(call, match):
    with pytest.raises(FusebenchError, match=match):
        call()


@pytest.mark.slow  # a whole job
@pytest.mark.parametrize("method,settings", [("dbsf", {}), ("rrf", {"rrf_k": 20}), ("rbc", {"phi": 0.7})])
def test_the_library_equals_a_runs_saved_lists_ranks_and_comparisons(tmp_path, method, settings):
    models, caption_image = _models(n=60)
    overrides = [f"fusion={method}", "fusion.top_k=40", "eval.save_topk=null", "eval.bootstrap.draws=300",
                 "eval.bootstrap.seed=3", "eval.lists.store=false", "+models.b.weight=0.5",
                 *(f"fusion.{'params.' if key == 'phi' else ''}{key}={value}" for key, value in settings.items())]
    run = tmp_path / "run"
    fusebench.run([*_write_inputs(tmp_path / "in", models, caption_image), *overrides], out_dir=run)
    metrics = json.loads((run / "metrics.json").read_text())
    lists = {name: search(text, image, 100, caption_image) for name, (image, text) in models.items()}
    fused = fuse(lists, method, weights={"b": 0.5}, top_k=40, caption_image=caption_image,
                 n_items={"t2i": 60, "i2t": len(caption_image)}, **settings)
    for name, mine in {**lists, "fused": fused}.items():
        for d in DIRECTIONS:
            saved = np.load(run / "topk" / f"{name}.{d}.npz")
            np.testing.assert_array_equal(mine[d].ids[:, :40], saved["ids"])
            np.testing.assert_array_equal(mine[d].scores[:, :40], saved["scores"])
            np.testing.assert_array_equal(mine[d].ranks, np.load(run / "ranks" / f"{name}.{d}.npy"))
            if name == "fused":
                np.testing.assert_array_equal(mine[d].contributors, saved["contributors"])
            assert recall(mine[d].ranks, [1, 5, 10]) == {k: metrics["retrievers"][name][d][f"R@{k}"] for k in (1, 5, 10)}
    clusters = {"t2i": caption_image, "i2t": np.unique(caption_image)}
    for row in metrics["comparisons"]:
        d, k = row["direction"], row["k"]
        mine = compare(fused[d].ranks, lists[row["baseline"]][d].ranks, k, draws=300, seed=3, clusters=clusters[d],
                       direction=d, names=("fused", row["baseline"]))
        assert mine.to_json() == row
    assert isinstance(fused["t2i"], Lists)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_library_imports_no_hydra_and_no_app():
    """Plain arrays in, plain arrays out: importing the library loads neither Hydra nor the app above it."""
    import subprocess
    import sys

    code = ("import sys, fusebench.library; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf', 'wandb', 'matplotlib') "
            "or m.startswith(('fusebench.app', 'fusebench.backends', 'fusebench.report'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
