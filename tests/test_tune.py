"""Tune mode: the grid, the refusals, and a tuned run whose curve equals plain runs on the tuning split."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.app.pipeline import run
from fusebench.app.tracking import summary_metrics
from fusebench.config.run import dataset_config, tune_config
from fusebench.config.schema import TuneConfig
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.manifest import load_manifest
from fusebench.evaluation.subrecords import TunePoint
from fusebench.evaluation.tuning import best, grid, seeded_split
from fusebench.fusion.config import FusionConfig
from fusebench.report.sweep import build_report
from fusebench.report.table import format_table

BASE = {"enabled": True, "split": "auto", "fraction": 0.2, "seed": 0, "criterion": "t2i R@1",
        "weights": [0.5, 1.0, 2.0], "rrf_k": [], "ddof": [], "max_points": 500}


DATASETS = {"sim": {**asdict(SimDatasetConfig()), "n_images": 10, "n_captions": 20, "latent_dim": 4,
                    "caption_noise": 1.0, "shared_caption_noise": 1.0, "seed": 0},
            "karpathy": {"name": "coco5k", "kind": "karpathy", "annotations": "a.json", "image_root": "img",
                         "split": "test", "expected": {}, "allow_nonstandard": False, "verify_images": "none"}}


def tuning(changes: dict, kind: str = "sim") -> TuneConfig | None:
    """The tune group as run_config converts it, for a dataset of ``kind``."""
    return tune_config({**BASE, **changes}, dataset_config(DATASETS[kind]))


def settings(**changes) -> TuneConfig:
    return tuning(changes)


def test_grid_keeps_the_first_weight_and_crosses_the_parameters():
    points = grid(settings(rrf_k=[20, 60]), ["a", "b", "c"], FusionConfig(method="rrf"))
    assert len(points) == 3 * 3 * 2
    assert all(p.weights["a"] == 1.0 for p in points)
    assert points[0] == TunePoint({"a": 1.0, "b": 0.5, "c": 0.5}, {"rrf_k": 20})
    assert points[1].describe() == "b=0.5, c=0.5, rrf_k=60"
    with pytest.raises(FusebenchError, match="tune.max_points=5"):
        grid(settings(max_points=5), ["a", "b", "c"], FusionConfig())


def test_best_is_the_highest_and_the_first_on_ties():
    curve = [TunePoint({"a": 1, "b": w}, {}, v, {"a": 60.0} if w == 0.5 else None)
             for w, v in ((0.5, 70.0), (1, 71.0), (2, 71.0))]
    assert best(curve) == TunePoint({"a": 1, "b": 1}, {}, 71.0)


@pytest.mark.parametrize("changes,kind,fragment", [
    ({"split": "auto"}, "karpathy", None),  # auto -> val: allowed
    ({"split": "test"}, "karpathy", "tuning on the test split inflates the gain"),
    ({"split": "seeded"}, "karpathy", "use tune.split=val"),
    ({"split": "val"}, "sim", "use tune.split=seeded"),
    ({"criterion": "t2i mAP"}, "sim", "tune.criterion='t2i mAP' is not valid"),
    ({"weights": 2.0}, "sim", "tune.weights=2.0 is not valid: give a list"),
    ({"weights": [-1]}, "sim", "tune.weights"),
    ({"fraction": 1.0}, "sim", "tune.fraction"),
    ({"ddof": [2]}, "sim", "tune.ddof"),
    ({"bogus": 1}, "sim", "tune: unknown key"),
])
def test_settings_refuse_what_would_mislead(changes, kind, fragment):
    if fragment is None:
        assert tuning(changes, kind).split == "val"
        return
    with pytest.raises(FusebenchError, match=fragment):
        tuning(changes, kind)


def test_off_means_none_and_the_criterion_is_read_once():
    assert tuning({"enabled": False}) is None and tune_config(None, dataset_config(DATASETS["sim"])) is None
    parsed = tuning({"criterion": "mean  R@5"})
    assert (parsed.criterion, parsed.direction, parsed.k, parsed.split) == ("mean R@5", "mean", 5, "seeded")


def _manifest_case(tmp_path: Path, n_images: int = 300):
    rng = np.random.default_rng(5)
    z = rng.standard_normal((n_images, 8))
    lines, caption_image = [], []
    for i in range(n_images):
        caps = int(rng.integers(1, 4))
        lines.append({"image_id": f"i{i}", "captions": [f"c{i}.{j}" for j in range(caps)]})
        caption_image += [i] * caps
    caption_image = np.asarray(caption_image)
    vectors = {}
    for name, noise in (("a", 1.0), ("b", 1.4)):
        proj = rng.standard_normal((8, 12))
        vectors[name] = ((z + 0.4 * rng.standard_normal(z.shape)) @ proj,
                         (z[caption_image] + noise * rng.standard_normal((len(caption_image), 8))) @ proj)
    return lines, caption_image, vectors


def _write(tmp_path: Path, tag: str, lines, vectors, images: np.ndarray, captions: np.ndarray) -> list[str]:
    (tmp_path / f"{tag}.jsonl").write_text("\n".join(json.dumps(lines[i]) for i in images) + "\n")
    overrides = ["dataset=manifest", f"dataset.manifest={tmp_path / f'{tag}.jsonl'}", "models=[]", "logger=none",
                 "plots=false", "eval.bootstrap.draws=100", f"embed.cache.dir={tmp_path / 'cache'}"]
    for name, (image, text) in vectors.items():
        np.save(tmp_path / f"{tag}_{name}_img.npy", image[images].astype(np.float32))
        np.save(tmp_path / f"{tag}_{name}_txt.npy", text[captions].astype(np.float32))
        overrides += [f"+models.{name}.kind=vectors", f"+models.{name}.image_embeddings={tmp_path / f'{tag}_{name}_img.npy'}",
                      f"+models.{name}.text_embeddings={tmp_path / f'{tag}_{name}_txt.npy'}"]
    return overrides


@pytest.mark.slow  # whole jobs
def test_tuned_run_curve_equals_plain_runs_on_the_held_out_images(compose_cfg, tmp_path):
    """Each setting's value on the tuning split is what a plain run on exactly those images gives; the test
    evaluation runs on the other images with the chosen weight."""
    lines, caption_image, vectors = _manifest_case(tmp_path)
    everything = _write(tmp_path, "all", lines, vectors, np.arange(len(lines)), np.arange(len(caption_image)))
    record = run(compose_cfg(everything + ["tune=weights", "tune.weights=[0.25,1,4]"]), str(tmp_path / "tuned"))
    tune = record.tune
    assert tune.split == "seeded" and len(tune.curve) == 3 and tune.criterion == "t2i R@1"
    corpus = load_manifest(tmp_path / "all.jsonl")
    held = seeded_split(corpus, 0.2, 0)
    assert tune.n_images == int(held.sum()) == 60
    assert record.dataset.n_images == 300 - 60 and record.dataset.meta["tuning_held_out_images"] == 60
    held_captions = np.flatnonzero(held[caption_image])
    alone = _write(tmp_path, "held", lines, vectors, np.flatnonzero(held), held_captions)
    for point in tune.curve:
        plain = run(compose_cfg(alone + [f"+models.b.weight={point.weights['b']}"]), str(tmp_path / "plain"))
        assert plain.retrievers["fused"].recall("t2i", 1) == pytest.approx(point.value, abs=1e-9)
    chosen = max(tune.curve, key=lambda p: p.value)
    assert tune.chosen.weights == chosen.weights and tune.curve[tune.chosen_index] == chosen
    assert record.retrievers["b"].spec.weight == chosen.weights["b"]  # the test run used it
    summary = summary_metrics(record)  # W&B
    assert summary["tune/value"] == chosen.value and summary["tune/weight/b"] == chosen.weights["b"]
    assert "tuned on a seeded 20% of the images" in format_table(record)
    tuned = build_report(tmp_path / "tuned", draws=50).tuned  # the sweep report's "Tuned runs" row
    assert tuned[0]["on the tuning split"] == chosen.value and tuned[0]["settings tried"] == 3
    assert tuned[0]["on test"] == record.retrievers["fused"].recall("t2i", 1)


@pytest.mark.slow
def test_cli_refuses_tuning_on_the_test_split(tmp_path):
    fusebench = str(Path(sys.executable).with_name("fusebench"))
    result = subprocess.run([fusebench, "dataset=coco5k", "tune=weights", "tune.split=test", "logger=none"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "tuning on the test split inflates the gain" in result.stderr
    assert "Traceback" not in result.stderr
