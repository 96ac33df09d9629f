"""The distractor-scaling study: simulated distractors (gallery=sim), the extrapolation math against Monte Carlo,
the sweep report's scaling tables from hand-built runs, and the CPU-sized study end to end (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.score_world import ScoreWorld

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig, SimDistractorConfig
from fusebench.config.schema import EvalConfig
from fusebench.config.specs import SimParams
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import (
    DISTRACTOR_BLOCK,
    distractor_latents,
    make_sim_corpus,
    model_projection,
    model_rng,
    sim_latents,
    sim_model_embeddings,
)
from fusebench.encoders.simulated import sim_distractor_rows
from fusebench.evaluation.comparisons import paired_comparisons, retriever_result
from fusebench.evaluation.extrapolation import METHOD, ScalingError, displacements, predict_recall
from fusebench.evaluation.record import RunRecord
from fusebench.evaluation.subrecords import DatasetSummary, GalleryModelCost, GalleryRecord, ModelRecord, RunInfo
from fusebench.fusion.config import FusionConfig
from fusebench.report.scaling import check_source, support
from fusebench.report.sweep import build_report, write_report
from fusebench.report.sweep_markdown import markdown
from fusebench.search.model_lists import compute_model_lists

CORPUS = make_sim_corpus(SimDatasetConfig(n_images=60, n_captions=150, latent_dim=8, seed=3))
MODEL = SimParams(dim=16, image_noise=0.3, text_noise=0.3, seed=1, score_scale=0.4, score_shift=0.12)


def gallery(size: int, **sim) -> GalleryConfig:
    return GalleryConfig(kind="sim", size=size, sim=SimDistractorConfig(**sim))


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


# --- simulated distractors ---

def test_any_read_range_gives_the_same_rows_and_galleries_nest():
    n = 2 * DISTRACTOR_BLOCK + 700
    rows = sim_distractor_rows(MODEL, CORPUS, gallery(n))
    whole = rows.read(0, n)
    assert whole.shape == (n, MODEL.dim + 2) and whole.dtype == np.float32 and whole.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-6)
    pieces = [rows.read(a, b) for a, b in ((0, 5), (5, 4097), (4097, 9000), (9000, n))]
    assert np.array_equal(np.vstack(pieces), whole)
    fresh = sim_distractor_rows(MODEL, CORPUS, gallery(n))  # nothing read before: the blocks drawn again
    assert np.array_equal(fresh.read(4100, 4200), whole[4100:4200])
    smaller = sim_distractor_rows(MODEL, CORPUS, gallery(1000))
    assert np.array_equal(smaller.read(0, 1000), whole[:1000]) and smaller.read(990, 5000).shape[0] == 10
    other_seed = sim_distractor_rows(MODEL, CORPUS, GalleryConfig(kind="sim", size=1000, seed=1))
    assert not np.array_equal(other_seed.read(0, 1000), whole[:1000])


def test_latents_are_shared_by_the_models_and_hard_ones_resemble_a_test_image():
    test_latents = sim_latents(CORPUS)[0]
    latents, hard = distractor_latents(3, 0, 2, test_latents, 0.3, 0.9)
    again, _ = distractor_latents(3, 0, 2, test_latents, 0.3, 0.9)
    assert np.array_equal(latents, again) and 0.2 < hard.mean() < 0.4
    nearest = (unit(latents) @ unit(test_latents).T).max(axis=1)
    assert nearest[hard].mean() > 0.85 > nearest[~hard].mean()  # pulled towards their test image by 0.9
    # each model sees them through its own noise and projection: back in the latent space, its rows point where
    # the latents do (dim 16 >= latent 8: the projection keeps inner products)
    for seed in (1, 2):
        params = SimParams(dim=16, image_noise=0.1, text_noise=0.3, seed=seed)
        rows = sim_distractor_rows(params, CORPUS, gallery(3 * DISTRACTOR_BLOCK, hard_fraction=0.3, closeness=0.9,
                                                           relevance=1.0)).read(2 * DISTRACTOR_BLOCK,
                                                                                3 * DISTRACTOR_BLOCK)
        proj = model_projection(model_rng(3, seed), 16, 8)
        back = unit(rows @ proj.T)
        assert np.einsum("ij,ij->i", back, unit(latents)).min() > 0.9


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_scores_sit_as_the_models_test_images_do_and_relevance_scales_caption_cosines():
    plain = SimParams(dim=16, image_noise=0.3, text_noise=0.3, seed=1)
    _, text = sim_model_embeddings(CORPUS, 16, 0.3, 0.3, 1)
    _, placed_text = sim_model_embeddings(CORPUS, 16, 0.3, 0.3, 1, MODEL.score)
    settings = {"hard_fraction": 0.2, "closeness": 0.8}
    raw = sim_distractor_rows(plain, CORPUS, gallery(3000, relevance=1.0, **settings)).read(0, 3000)
    scaled = sim_distractor_rows(plain, CORPUS, gallery(3000, relevance=0.7, **settings)).read(0, 3000)
    placed = sim_distractor_rows(MODEL, CORPUS, gallery(3000, relevance=1.0, **settings)).read(0, 3000)
    cosine = unit(text) @ raw.T
    # score_scale / score_shift: the same affine placement as the test images' scores
    np.testing.assert_allclose(unit(placed_text) @ placed.T, 0.4 * cosine + 0.12, atol=2e-6)
    hard = distractor_latents(3, 0, 0, sim_latents(CORPUS)[0], 0.2, 0.8)[1][:3000]
    mixed = unit(text) @ scaled.T
    np.testing.assert_allclose(mixed[:, hard], cosine[:, hard], atol=2e-6)  # hard ones: all on-topic
    np.testing.assert_allclose(mixed[:, ~hard], 0.7 * cosine[:, ~hard], atol=2e-6)  # the rest: 0.7 of the cosine


def test_key_names_everything_the_rows_depend_on():
    key = sim_distractor_rows(MODEL, CORPUS, gallery(500)).key
    json.dumps(key)
    assert key == sim_distractor_rows(MODEL, CORPUS, gallery(500)).key
    others = [sim_distractor_rows(MODEL, CORPUS, gallery(501)).key,
              sim_distractor_rows(MODEL, CORPUS, GalleryConfig(kind="sim", size=500, seed=2)).key,
              sim_distractor_rows(MODEL, CORPUS, gallery(500, closeness=0.5)).key,
              sim_distractor_rows(SimParams(dim=16, image_noise=0.31, text_noise=0.3, seed=1), CORPUS, gallery(500)).key,
              sim_distractor_rows(MODEL, make_sim_corpus(SimDatasetConfig(n_images=60, n_captions=150, latent_dim=8,
                                                                          seed=4)), gallery(500)).key]
    assert all(other != key for other in others)
    same_images = SimParams(dim=16, image_noise=0.3, text_noise=0.9, seed=1, score_scale=0.4, score_shift=0.12)
    assert sim_distractor_rows(same_images, CORPUS, gallery(500)).key == key  # text noise changes no distractor


def test_bad_setups_are_one_line_errors():
    real = make_sim_corpus(SimDatasetConfig(n_images=10, n_captions=20))
    real.meta["simulated"] = False
    with pytest.raises(FusebenchError, match="gallery=sim simulates distractors for dataset=sim"):
        sim_distractor_rows(MODEL, real, gallery(10))
    narrow = SimParams(dim=8, image_noise=0.3, text_noise=0.3, seed=1)
    with pytest.raises(FusebenchError, match=r"dim=8 <= dataset.latent_dim=8.*gallery.sim.relevance=1"):
        sim_distractor_rows(narrow, CORPUS, gallery(10))
    assert sim_distractor_rows(narrow, CORPUS, gallery(10, relevance=1.0)).read(0, 10).shape == (10, 8)
    with pytest.raises(FusebenchError, match="gallery.sim.relevance=0"):
        SimDistractorConfig(relevance=0)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_recall_falls_with_gallery_size():
    image, text = sim_model_embeddings(CORPUS, 16, 0.3, 0.3, 1)
    rows = sim_distractor_rows(SimParams(dim=16, image_noise=0.3, text_noise=0.3, seed=1), CORPUS, gallery(20000))
    recall = []
    for n in (0, 2000, 20000):
        lists = compute_model_lists(unit(text), np.vstack([unit(image), rows.read(0, n)]), CORPUS.caption_image, 1)
        recall.append(np.mean(lists["t2i"].ranks == 1))
    assert recall[0] > recall[1] > recall[2]


# --- the extrapolation's math ---

def test_a_rank_with_distractors_is_the_test_split_rank_plus_the_distractors_above_the_target():
    rng = np.random.default_rng(5)  # small integers: exact scores, and ties between targets and distractors
    text = rng.integers(-2, 3, (300, 6)).astype(np.float32)
    images, distractors_ = rng.integers(-2, 3, (50, 6)).astype(np.float32), rng.integers(-2, 3, (900, 6)).astype(np.float32)
    caption_image = rng.integers(0, 50, 300)
    rank_0 = compute_model_lists(text, images, caption_image, 5)["t2i"].ranks
    rank_n = compute_model_lists(text, np.vstack([images, distractors_]), caption_image, 5)["t2i"].ranks
    target = np.einsum("ij,ij->i", text, images[caption_image])
    above = (text @ distractors_.T > target[:, None]).sum(axis=1)
    assert (text @ distractors_.T == target[:, None]).any()  # ties happen, and distractors rank after them
    assert np.array_equal(displacements(rank_0, rank_n), above)


def test_ranks_that_are_not_a_pair_are_refused():
    with pytest.raises(ScalingError, match="rank better with distractors"):
        displacements(np.array([1, 2, 3]), np.array([1, 1, 5]))
    with pytest.raises(ScalingError, match="not one query set"):
        displacements(np.array([1, 2]), np.array([1, 2, 3]))
    with pytest.raises(ScalingError, match="rank below 1"):
        displacements(np.array([0, 2]), np.array([1, 2]))


# --- the sweep report, from runs built by hand ---

N_IMAGES, KS = 40, [1, 5, 10]
CAPTION_IMAGE = np.repeat(np.arange(N_IMAGES), 5)


def _write_run(folder: Path, size: int, ranks: dict[str, dict[str, np.ndarray]], fusion: str,
               caption_image: np.ndarray = CAPTION_IMAGE, seed: int = 0, dim_a: int = 16,
               lists: dict | None = None, available: int | None = None) -> None:
    """A run dir as the app writes one: ranks, queries, metrics.json with its comparisons and gallery (whose source
    records, as real sources do, a digest of the ids taken: it changes with the size)."""
    (folder / "ranks").mkdir(parents=True)
    specs = {"a": ModelRecord({"kind": "sim", "dim": dim_a, "seed": 1}), "b": ModelRecord({"kind": "sim", "dim": 8,
                                                                                       "seed": 2})}
    retrievers = {name: retriever_result(name, ranks[name], KS, specs[name]) for name in ("a", "b")}
    setting = FusionConfig(method=fusion, fuse_on="source_object")
    from fusebench.evaluation.subrecords import FusionRecord

    retrievers["fused"] = retriever_result("fused", ranks["fused"], KS, FusionRecord(["a", "b"], setting))
    clusters = {"t2i": caption_image, "i2t": np.arange(N_IMAGES)}
    comparisons = paired_comparisons(ranks, ["fused"], ["a", "b"], clusters, KS, 200, 0.95, 0)
    gallery_record = None if size == 0 else GalleryRecord(
        kind="sim", size=size, distractors=size, near_duplicates=0, near_duplicate=0.95, seed=seed,
        source={"kind": "sim", "seed": seed, "listing": f"ids of the first {size}", "undecodable": size % 3,
                **({} if available is None else {"available": available})},
        models={"a": GalleryModelCost(16, 4 * (N_IMAGES + size) * 16, 0, "none (generated)", search_ms_per_query=0.5),
                "b": GalleryModelCost(8, 4 * (N_IMAGES + size) * 8, 0, "none (generated)", search_ms_per_query=0.25)})
    meta = {"simulated": True, "sim_seed": 0, **({"gallery_size": size, "test_images": N_IMAGES} if size else {})}
    record = RunRecord(DatasetSummary("sim", N_IMAGES + size, len(caption_image), meta=meta), retrievers, comparisons,
                       setting, EvalConfig(ks=KS), RunInfo(), gallery=gallery_record)
    for name, by_direction in ranks.items():
        for direction, values in by_direction.items():
            np.save(folder / "ranks" / f"{name}.{direction}.npy", values.astype(np.int64))
    np.savez(folder / "ranks" / "queries.npz", t2i_image=caption_image, i2t_image=np.arange(N_IMAGES))
    for name, (ids, scores) in (lists or {}).items():  # the single models' saved t2i lists
        (folder / "topk").mkdir(exist_ok=True)
        np.savez(folder / "topk" / f"{name}.t2i.npz", ids=ids, scores=scores)
    (folder / "metrics.json").write_text(json.dumps(record.to_json()))


WORLDS = {"a": dict(seed=1, hard=0.0, target_mean=0.3), "b": dict(seed=2, hard=0.0, target_mean=0.28)}


def _study(folder: Path, sizes=(0, 1000, 10000), change_queries_at: int | None = None, worlds=None,
           available: int | None = None) -> dict:
    """Runs of a dbsf and an rrf job at each size; the single models' ranks and saved lists come from worlds of
    scores (helpers.score_world: nested galleries, one shared distractor tail unless ``worlds`` say otherwise)."""
    worlds = {m: ScoreWorld(CAPTION_IMAGE, N_IMAGES, **w) for m, w in (worlds or WORLDS).items()}
    all_ranks, all_lists = {}, {}
    for job, size in enumerate(sizes):
        at = {m: world.at(size) for m, world in worlds.items()}
        singles = {m: {"t2i": at[m][0], "i2t": np.full(N_IMAGES, {"a": 1, "b": 2}[m])} for m in "ab"}
        fused = {"t2i": np.minimum(singles["a"]["t2i"], singles["b"]["t2i"]), "i2t": np.ones(N_IMAGES, dtype=int)}
        all_ranks[size] = {**singles, "fused": fused}
        all_lists[size] = {m: at[m][1:] for m in "ab"}
        for i, method in enumerate(("dbsf", "rrf")):
            caption_image = CAPTION_IMAGE if size != change_queries_at else np.roll(CAPTION_IMAGE, 1)
            _write_run(folder / str(2 * job + i), size, all_ranks[size], method, caption_image,
                       lists=all_lists[size], available=available)
    return {"ranks": all_ranks, "lists": all_lists}


@pytest.mark.slow  # a whole sweep report, plots drawn (the fast tier builds one in test_runs_whose_queries_differ_are_not_paired)
def test_scaling_tables_hold_every_size(tmp_path):
    study = _study(tmp_path)
    ranks = study["ranks"]
    report = write_report(tmp_path, draws=200)
    s = report.scaling
    assert s is not None and s.simulated and not s.refused
    for size in (0, 1000, 10000):
        for name in ("a", "b"):
            row = next(r for r in s.recall if r["retriever"] == name and r["distractors"] == size)
            assert row["t2i R@1"] == pytest.approx(100 * np.mean(ranks[size][name]["t2i"] == 1))
            assert row["R@1 low"] <= row["t2i R@1"] <= row["R@1 high"] and row["gallery images"] == N_IMAGES + size
    assert len(s.recall) == 4 * 3  # a, b and the two fusions at three sizes; the singles counted once per size
    gains = [g for g in s.gains if g["k"] == 1]
    assert len(gains) == 2 * 3
    for g in gains:  # each run's own comparison, against its best single model
        best = max("ab", key=lambda m: (np.mean(ranks[g["distractors"]][m]["t2i"] == 1), m == "a"))
        assert g["over"] == best
        fused = np.mean(ranks[g["distractors"]]["fused"]["t2i"] == 1) - np.mean(ranks[g["distractors"]][best]["t2i"] == 1)
        assert g["gain"] == pytest.approx(100 * fused)
    for c in (c for c in s.changes if c["k"] == 1 and c["retriever"] == "a"):
        before, after = ranks[0]["a"]["t2i"] == 1, ranks[c["to"]]["a"]["t2i"] == 1
        assert c["change"] == pytest.approx(100 * (after.mean() - before.mean()))
        assert (c["gained"], c["lost"]) == (0, int((before & ~after).sum())) and c["ci_high"] < 0
    rows = {(e["model"], e["to"]): e for e in s.extrapolation}
    assert set(rows) == {(m, t) for m in "ab" for t in (10000, 100000)}
    check = rows["a", 10000]  # predicted from 1,000 distractors, checked against the 10,000 measured
    ids, scores = study["lists"][1000]["a"]
    expected = predict_recall(ranks[1000]["a"]["t2i"], CAPTION_IMAGE, ids, scores, N_IMAGES, CAPTION_IMAGE, 1000,
                              10000, draws=200, level=0.95, seed=0)
    assert (check["predicted R@1"], check["low"], check["high"]) == (expected.value, expected.low, expected.high)
    assert check["measured R@1"] == pytest.approx(100 * np.mean(ranks[10000]["a"]["t2i"] == 1))
    assert check["inside"] is True and check["method"] == METHOD and check["check"] == "inside"
    assert check["step"] == 10 and rows["a", 100000]["check"] == "checked at x10"
    assert rows["a", 100000]["measured R@1"] is None and rows["a", 100000]["inside"] is None
    summary = (tmp_path / "summary.md").read_text()
    assert "## Distractor scaling [SIMULATED" in summary and "| 10,000 | 10,040 |" in summary
    assert "### Extrapolated t2i R@1" in summary
    for name in ("recall", "gains", "changes", "extrapolation"):
        assert (tmp_path / f"scaling_{name}.csv").stat().st_size > 100
    for name in ("scaling_recall", "scaling_gain"):
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 5000
    cost = [r for r in report.cost if r["retriever"] == "a"]
    assert [r["gallery_bytes_fp32"] for r in cost] == [4 * (N_IMAGES + n) * 16 for n in (0, 1000, 10000)]
    fused_cost = next(r for r in report.cost if r["gallery_distractors"] == 1000 and r["fusion"])
    assert fused_cost["search_ms_per_query"] == 0.75 and fused_cost["gallery_bytes_stored"] == 0


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_missed_check_withholds_the_prediction_past_the_largest_gallery(tmp_path):
    """Distractors that are near copies of each query's own target (scores just under it, whatever its level):
    above the thresholds the queries' tails differ, neither tail model holds, and the check says so."""
    near = dict(hard=2e-3, gap=0.05, hard_spread=0.05)
    _study(tmp_path, worlds={"a": dict(seed=1, target_mean=0.5, **near), "b": dict(seed=2, target_mean=0.5, **near)})
    s = build_report(tmp_path, draws=200).scaling
    checks = {e["model"]: e for e in s.extrapolation}
    assert set(checks) == {"a", "b"} and all(e["to"] == 10000 and e["inside"] is False for e in checks.values())
    for model in "ab":
        assert any(f"{model}: no prediction at 100,000 distractors: a check between the sizes measured missed" in why
                   for why in s.refused)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_prediction_never_goes_past_what_the_source_holds(tmp_path):
    _study(tmp_path, sizes=(0, 1000, 2000), available=15000)
    s = build_report(tmp_path, draws=100).scaling
    assert {(e["model"], e["to"]) for e in s.extrapolation if e["measured R@1"] is None} == {("a", 15000),
                                                                                            ("b", 15000)}
    for e in s.extrapolation:  # a check of x2 held: it does not vouch for the x7.5 printed
        assert (e["step"], e["check"]) == ((2.0, "inside") if e["measured R@1"] is not None else
                                           (7.5, "checked only at x2"))
    for folder in tmp_path.iterdir():
        folder.rename(tmp_path.parent / f"{tmp_path.name}_{folder.name}")  # start over: the source holds 2,000
    _study(tmp_path, sizes=(0, 1000, 2000), available=2000)
    s = build_report(tmp_path, draws=100).scaling
    assert all(e["measured R@1"] is not None for e in s.extrapolation)
    assert any("a: no prediction past 2,000 distractors: the source holds 2,000" in why for why in s.refused)


def test_the_check_is_made_at_the_printed_step_where_the_sizes_allow():
    assert check_source([1000, 10000], 10000) == 1000
    assert check_source([1000, 5000, 10000, 100000], 100000) == 10000
    assert check_source([1000, 5000, 10000, 100000], 10000) == 1000  # x10, not the x2 from 5,000
    assert check_source([1000, 5000, 10000, 100000], 5000) == 1000  # no x10 below it: the next smaller
    assert check_source([500, 1000, 2000], 2000) == 1000
    assert check_source([1000, 10000], 10000, factor=20) == 1000
    assert support([], 10.0) == "unchecked"
    assert support([10.0, 2.0], 10.0) == "checked at x10" and support([5.0, 2.0], 10.0) == "checked only at x5"


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_no_prediction_from_a_gallery_larger_than_its_coverage_was_measured_from(tmp_path):
    """From more than COVERED_FROM distractors the interval is unmeasured (and missed when a review measured it):
    the checks are shown, the prediction past the largest is withheld, saying why (issue 39's review)."""
    from fusebench.evaluation.extrapolation import COVERED_FROM

    assert COVERED_FROM == 10000
    _study(tmp_path, sizes=(0, 1000, 20000))
    s = build_report(tmp_path, draws=100).scaling
    assert {(e["model"], e["to"]) for e in s.extrapolation} == {("a", 20000), ("b", 20000)}  # the checks only
    assert all(e["measured R@1"] is not None for e in s.extrapolation)
    for model in "ab":
        assert any(f"{model}: no prediction from 20,000 distractors: the interval's coverage is measured from "
                   "galleries of at most 10,000" in why for why in s.refused)


def test_a_step_is_read_on_the_sizes_asked_so_near_duplicates_never_shorten_it():
    """2,000 asked (1,998 kept) and 20,000 asked (19,995 kept): a x10 check, not 'checked only at x10' (9.9975)."""
    assert check_source([1998, 19995], 19995) == 1998  # kept sizes alone: 1,998 x 10 <= 19,995 still
    assert check_source([2000, 19995], 19995) == 2000  # no size at x10 by the kept counts: the next smaller
    assert check_source([2000, 5000, 19995], 19995, asked={2000: 2000, 5000: 5000, 19995: 20000}) == 2000
    assert check_source([2000, 5000, 19995], 19995) == 5000  # without the sizes asked: the x4 step
    assert support([20000 / 2000], 10.0) == "checked at x10"


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_prediction_with_no_check_is_labelled_unchecked_and_the_title_says_what_is_printed(tmp_path):
    _study(tmp_path, sizes=(0, 1000))
    report = build_report(tmp_path, draws=100)
    s = report.scaling
    assert [(e["model"], e["from"], e["to"], e["check"]) for e in s.extrapolation] == [
        ("a", 1000, 10000, "unchecked"), ("b", 1000, 10000, "unchecked")]
    lines = markdown(report)
    assert "| a | 1,000 | 10,000 | x10 |" in lines and "| unchecked |" in lines
    assert "printed only when every check held" not in lines
    assert "withheld when a check missed" in lines and "unchecked)" in lines


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_runs_whose_ranks_fall_as_distractors_are_added_are_not_paired(tmp_path):
    ranks = _study(tmp_path, sizes=(0, 1000))["ranks"][1000]
    better = np.maximum(ranks["a"]["t2i"] - 1, 1)  # not the same model over nested galleries
    _write_run(tmp_path / "4", 10000, {**ranks, "a": {**ranks["a"], "t2i": better}}, "dbsf")
    s = build_report(tmp_path, draws=100).scaling
    assert [e["model"] for e in s.extrapolation if e["measured R@1"] is not None] == ["b"]  # a's check refused
    assert any("a: no extrapolation from 1,000 distractors: " in why and "rank better with distractors" in why
               for why in s.refused)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_runs_whose_queries_differ_are_not_paired(tmp_path):
    _study(tmp_path, change_queries_at=10000)
    s = build_report(tmp_path, draws=100).scaling
    assert {c["to"] for c in s.changes} == {1000}
    assert any("not paired with 0 distractors: ranks/queries.npz differ" in why for why in s.refused)
    assert not s.extrapolation  # 1,000 -> 10,000 and 10,000 -> 100,000 both need the 10,000 runs' queries
    assert any("a: no extrapolation from 1,000 distractors: ranks/queries.npz differ" in why for why in s.refused)


@pytest.mark.slow  # a whole sweep report, plots drawn
def test_galleries_of_one_size_from_two_sources_stay_apart_and_a_lone_series_is_skipped(tmp_path):
    ranks = _study(tmp_path, sizes=(0, 1000))["ranks"]
    other = {m: {d: r + 1 for d, r in by.items()} for m, by in ranks[1000].items()}
    _write_run(tmp_path / "other_seed", 1000, other, "dbsf", seed=1)  # same size, another gallery
    _write_run(tmp_path / "no_gallery_run", 0, ranks[0], "dbsf", dim_a=32)  # a model run without distractors only
    report = write_report(tmp_path, draws=100)
    columns = {key for row in report.article for key in row if key.startswith("sim") and key.endswith("t2i R@1")}
    assert len(columns) == 3, columns  # 0, +1,000 from seed 0 and +1,000 from seed 1: none overwrites another
    recall = [r for r in report.scaling.recall if r["retriever"] == "a" and r["distractors"] == 1000]
    assert sorted(r["t2i R@1"] for r in recall) == sorted(100 * np.mean(x["a"]["t2i"] == 1) for x in (ranks[1000], other))


@pytest.mark.slow  # a whole sweep report, plots drawn
def test_no_scaling_section_for_runs_of_one_size(tmp_path):
    _study(tmp_path, sizes=(1000,))
    report = write_report(tmp_path, draws=100)
    assert report.scaling is None and "Distractor scaling" not in (tmp_path / "summary.md").read_text()
    assert not list(tmp_path.glob("scaling_*.csv"))


# --- end to end ---

@pytest.mark.slow
def test_the_cpu_sized_study_runs_as_documented(tmp_path):
    fusebench = str(Path(sys.executable).with_name("fusebench"))
    result = subprocess.run(
        [fusebench, "experiment=distractor_scaling", "dataset=sim", "gallery=sim", "gallery.size=0,500,5000",
         "dataset.n_images=300", "dataset.n_captions=1500", "eval.bootstrap.draws=200", "logger=none",
         f"hydra.sweep.dir={tmp_path / 'study'}", f"embed.cache.dir={tmp_path / 'cache'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env={**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = build_report(tmp_path / "study", draws=200)
    s = report.scaling
    assert len(report.runs) == 6 and s is not None and s.simulated and not s.refused
    assert {r["asked"] for r in s.recall} == {0, 500, 5000}  # the command line's sizes, not the experiment's
    for name in ("siglip2_so400m_p14_384 (lowercase)", "dfn5b_h14_224"):
        r1 = [r["t2i R@1"] for r in s.recall if r["retriever"] == name]
        assert r1[0] > r1[1] > r1[2]
    assert {g["fusion"].split(" ")[1] for g in s.gains} == {"dbsf", "rrf"}
    assert len([e for e in s.extrapolation if e["measured R@1"] is not None]) == 2
    summary = (tmp_path / "study" / "summary.md").read_text()
    first = RunRecord.from_json(json.loads((tmp_path / "study" / "2" / "metrics.json").read_text()))
    assert first.gallery.size == 500 and first.gallery.models["dfn5b_h14_224"].search_ms_per_query > 0
    largest = next(r for r in s.recall if r["asked"] == 5000)
    kept = f"{largest['distractors']:,}" + ("" if largest["distractors"] == 5000 else " (of 5,000)")
    assert "## Distractor scaling [SIMULATED" in summary and f"| {kept} | {300 + largest['distractors']:,} |" in summary
    i2t = [np.load(tmp_path / "study" / job / "ranks" / "fused.i2t.npy") for job in ("0", "4")]
    assert np.array_equal(*i2t)  # distractors ask no i2t query and are no i2t item
