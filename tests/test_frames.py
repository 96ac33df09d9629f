"""fusebench.report.frames: the notebook's DataFrames hold the run record's values, one row per what they say.

A hand-built run (fast), and a small sim sweep run by the app, read back the obvious way (json.load, np.load).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pandas")

from fusebench.data.corpus import Corpus  # noqa: E402
from fusebench.evaluation.record import RunRecord  # noqa: E402
from fusebench.report.frames import (  # noqa: E402
    comparison_frame,
    default_pair,
    outcome_frame,
    query_frame,
    retriever_frame,
    run_frame,
)
from fusebench.report.runs import Run, load_runs  # noqa: E402

# --- a run built by hand: 3 images (one caption each, image 2 has two), models a and b, their fusion ---
CAPTION_IMAGE = np.array([0, 1, 2, 2])
RANKS = {  # rank of the correct item per query; 0: not in the list
    "a": {"t2i": [1, 2, 1, 0], "i2t": [1, 1, 2]},
    "b": {"t2i": [2, 1, 1, 3], "i2t": [2, 1, 1]},
    "fused": {"t2i": [1, 1, 2, 1], "i2t": [1, 1, 1]},
}


def _metrics(ranks: list[int], ks: list[int]) -> dict:
    r = np.array(ranks)
    return {**{f"R@{k}": 100.0 * float(((r >= 1) & (r <= k)).mean()) for k in ks}, "median_rank": 1.0,
            "n_queries": len(r)}


def _hand_built_run(folder: Path) -> Run:
    ks = [1, 2]
    specs = {"a": {"kind": "sim", "dim": 4, "text": {"case": "lowercase"}}, "b": {"kind": "sim", "dim": 4, "weight": 2.0},
             "fused": {"kind": "fusion", "members": ["a", "b"], "method": "dbsf", "fuse_on": "source_object",
                       "top_k": 10, "final_top_k": None, "preset": None}}
    retrievers = {}
    for name, spec in specs.items():
        t2i, i2t = _metrics(RANKS[name]["t2i"], ks), _metrics(RANKS[name]["i2t"], ks)
        retrievers[name] = {"t2i": t2i, "i2t": i2t, "mean": {f"R@{k}": (t2i[f"R@{k}"] + i2t[f"R@{k}"]) / 2 for k in ks},
                            "spec": spec}
    comparison = {"baseline": "a", "candidate": "fused", "direction": "t2i", "k": 1, "gain": 25.0, "ci_low": -25.0,
                  "ci_high": 75.0, "wins": 2, "losses": 1, "cluster_ci_low": -30.0, "cluster_ci_high": 80.0,
                  "p_value": 1.0, "baseline_recall": 50.0, "candidate_recall": 75.0, "n_queries": 4, "level": 0.9,
                  "draws": 10}
    record = RunRecord.from_json({"dataset": {"name": "toy", "n_images": 3, "n_captions": 4}, "retrievers": retrievers,
                                  "comparisons": [comparison], "eval": {"ks": ks, "level": 0.9}, "fusion": {},
                                  "run": {"seconds": 1.5}})
    (folder / "ranks").mkdir(parents=True)
    (folder / "topk").mkdir()
    for name, by_direction in RANKS.items():
        for direction, ranks in by_direction.items():
            np.save(folder / "ranks" / f"{name}.{direction}.npy", np.array(ranks, dtype=np.int64))
            n_items = 3 if direction == "t2i" else 4
            ids = np.array([[(q + i) % n_items for i in range(2)] for q in range(len(ranks))], dtype=np.int32)
            np.savez(folder / "topk" / f"{name}.{direction}.npz", ids=ids, scores=np.zeros(ids.shape, np.float32))
    np.savez(folder / "ranks" / "queries.npz", t2i_image=CAPTION_IMAGE, i2t_image=np.arange(3))
    return Run(folder, "fusion=dbsf", record, ["fusion=dbsf", "+models.a.text.case=lowercase"])


def _corpus(paths: bool = True) -> Corpus:
    return Corpus("toy", ["i0", "i1", "i2"], ["c0", "c1", "c2", "c3"], CAPTION_IMAGE,
                  image_paths=["/p/0.jpg", "/p/1.jpg", "/p/2.jpg"] if paths else None)


def test_retriever_and_comparison_frames_hold_the_record(tmp_path):
    run = _hand_built_run(tmp_path)
    frame = retriever_frame([run])
    assert len(frame) == 3 * 2 * 2  # retrievers x directions x ks
    for _, row in frame.iterrows():
        assert row["recall"] == run.record.retrievers[row["retriever"]].recall(row["direction"], row["k"])
        assert row["recall_ci_low"] <= row["recall"] <= row["recall_ci_high"] and row["level"] == 0.9
    fused = frame[frame["retriever"] == "fused"].iloc[0]
    assert (fused["kind"], fused["models"], fused["method"], fused["fuse_on"], fused["top_k"]) == (
        "fusion", "a + b", "dbsf", "source_object", 10)
    assert fused["preprocessing"] == "lowercase + as_typed" and fused["weights"] == "1 + 2"
    assert fused["override.fusion"] == "dbsf" and fused["override.models.a.text.case"] == "lowercase"
    assert fused["run_dir"] == str(tmp_path) and fused["dataset"] == "toy" and not fused["simulated"]
    assert frame[frame["retriever"] == "a"]["method"].isna().all()

    comparisons = comparison_frame([run])
    assert len(comparisons) == 1
    row = comparisons.iloc[0]
    for key, value in run.record.comparisons[0].to_json().items():
        assert row[key] == value
    assert row["metric"] == "R@1" and row["method"] == "dbsf" and bool(row["vs_best_single"])  # a: best at t2i R@1

    runs = run_frame([run])
    assert runs.loc[0, "headline"] == "fused" and runs.loc[0, "seconds"] == 1.5 and runs.loc[0, "comparisons"] == 1


def test_query_frame_says_where_the_fusion_won_and_lost(tmp_path):
    run = _hand_built_run(tmp_path)
    assert default_pair(run, "t2i", 1) == ("fused", "a")
    queries = query_frame(run, "t2i", 1, corpus=_corpus())
    assert list(queries["outcome"]) == ["both hit", "won", "lost", "won"]
    for name, by_direction in RANKS.items():
        assert list(queries[f"rank {name}"]) == by_direction["t2i"]
    assert list(queries["text"]) == ["c0", "c1", "c2", "c3"] and list(queries["image_id"]) == ["i0", "i1", "i2", "i2"]
    assert list(queries["image_path"]) == ["/p/0.jpg", "/p/1.jpg", "/p/2.jpg", "/p/2.jpg"]
    assert list(queries["first fused id"]) == ["i0", "i1", "i2", "i0"]  # topk ids[:, 0] = query % 3
    assert list(queries["first a path"]) == ["/p/0.jpg", "/p/1.jpg", "/p/2.jpg", "/p/0.jpg"]
    assert queries.attrs["candidate"] == "fused" and queries.attrs["baseline"] == "a" and queries.attrs["note"] == ""

    i2t = query_frame(run, "i2t", 1, candidate="b", baseline="a", corpus=_corpus(paths=False))
    assert list(i2t["outcome"]) == ["lost", "both hit", "won"]
    assert list(i2t["image_id"]) == ["i0", "i1", "i2"] and i2t["text"].isna().all()
    assert list(i2t["first b id"]) == ["c0", "c1", "c2"]  # i2t lists hold captions
    assert "has no image files" in i2t.attrs["note"]

    wrong = Corpus("toy", ["i0", "i1", "i2"], ["c0", "c1", "c2"], np.array([0, 1, 2]))
    unmatched = query_frame(run, "t2i", 1, corpus=wrong)
    assert "text" not in unmatched and "corpus has 3 t2i queries, the run 4" in unmatched.attrs["note"]
    assert list(unmatched["outcome"]) == list(outcome_frame(run, "t2i", 1)["outcome"])


# --- a sim sweep run by the app ---

@pytest.fixture(scope="module")
def sim_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("frames")
    fusebench = str(Path(sys.executable).with_name("fusebench"))
    result = subprocess.run([fusebench, "-m", "dataset.n_images=200", "dataset.n_captions=1000", "fusion=rrf,dbsf",
                             "eval.bootstrap.draws=100", "logger=none", "plots=false",
                             f"hydra.sweep.dir={folder / 'sweep'}"], cwd=folder, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "FUSEBENCH_OUTPUT": str(folder / "out")})
    assert result.returncode == 0, result.stderr
    return folder / "sweep"


@pytest.mark.slow
def test_frames_of_a_sweep_equal_its_metrics_json(sim_sweep):
    metrics = {str(p.parent): json.loads(p.read_text()) for p in sorted(sim_sweep.glob("*/metrics.json"))}
    assert len(metrics) == 2
    frame = retriever_frame(sim_sweep)
    ks = [1, 5, 10]
    assert len(frame) == sum(len(m["retrievers"]) for m in metrics.values()) * 2 * len(ks)
    for _, row in frame.iterrows():
        assert row["recall"] == metrics[row["run_dir"]]["retrievers"][row["retriever"]][row["direction"]][f"R@{row['k']}"]
    assert set(frame[frame["kind"] == "fusion"]["method"]) == {"rrf", "dbsf"}
    assert set(frame["override.fusion"]) == {"rrf", "dbsf"}
    assert len(retriever_frame(sim_sweep, unique=True)) == (2 + 2) * 2 * len(ks)  # the two models counted once

    comparisons = comparison_frame(sim_sweep)
    assert len(comparisons) == sum(len(m["comparisons"]) for m in metrics.values())
    for run_dir, m in metrics.items():
        rows = comparisons[comparisons["run_dir"] == run_dir]
        assert rows[list(m["comparisons"][0])].to_dict("records") == m["comparisons"]
    assert len(run_frame(sim_sweep)) == 2


@pytest.mark.slow
def test_query_frames_of_every_run_agree_with_the_ranks(sim_sweep):
    runs, _ = load_runs(sim_sweep)
    for run in runs:
        for direction in ("t2i", "i2t"):
            queries = query_frame(run, direction, 1)
            cand, base = queries.attrs["candidate"], queries.attrs["baseline"]
            recorded = run.record.comparison(cand, base, direction, 1)
            counts = queries["outcome"].value_counts()
            assert (counts.get("won", 0), counts.get("lost", 0)) == (recorded.wins, recorded.losses)
            for name in run.record.retrievers:
                ranks = np.load(run.path / "ranks" / f"{name}.{direction}.npy")
                assert np.array_equal(queries[f"rank {name}"].to_numpy(), ranks)
            assert queries["image_path"].isna().all() and "(simulated)" in queries.attrs["note"]
        t2i = query_frame(run, "t2i", 1)
        row = t2i[t2i["outcome"] == "won"].iloc[0]
        assert row["text"].startswith("simulated caption") and row[f"rank {t2i.attrs['candidate']}"] == 1
