"""Drive the real ``fusebench`` console script in a subprocess, as users do."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
FUSEBENCH = shutil.which("fusebench") or str(Path(sys.executable).with_name("fusebench"))
SMALL_SIM = ["dataset.n_images=200", "dataset.n_captions=1000", "eval.bootstrap.draws=200"]


def fusebench(*args, cwd):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(Path(cwd) / "outputs")}
    return subprocess.run([FUSEBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_documented_vectors_command(vectors_case, tmp_path):
    files = vectors_case["files"]
    out = tmp_path / "OUT"
    result = fusebench(
        "dataset=manifest", f"dataset.manifest={vectors_case['manifest']}", "models=[]",
        "+models.a.kind=vectors", f"+models.a.image_embeddings={files['A'][0]}", f"+models.a.text_embeddings={files['A'][1]}",
        "+models.b.kind=vectors", f"+models.b.image_embeddings={files['B'][0]}", f"+models.b.text_embeddings={files['B'][1]}",
        "fusion=dbsf", "fusion.fuse_on=source_object", "fusion.top_k=100", "fusion.final_top_k=100",
        "eval.ks=[1,5,10]", "eval.bootstrap.draws=2000", "eval.bootstrap.seed=0", "logger=none", f"hydra.run.dir={out}",
        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["retrievers"]) == {"a", "b", "fused"}
    assert metrics["dataset"]["n_images"] == 40 and metrics["dataset"]["i2t_queries"] == 39
    for name in ("a", "b", "fused"):
        for direction in ("t2i", "i2t"):
            assert (out / "ranks" / f"{name}.{direction}.npy").is_file()
            assert (out / "topk" / f"{name}.{direction}.npz").is_file()
    # 40 images < top_k=100: lists hold every image; the fused list every image once
    assert np.load(out / "topk" / "fused.t2i.npz")["ids"].shape[0] == len(vectors_case["caption_image"])
    assert "fused vs a" in result.stdout and "t2i R@1" in result.stdout


def test_default_job_shape_small(tmp_path):
    result = fusebench(*SMALL_SIM, "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "SIMULATED" in result.stdout
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["dataset"]["simulated"] is True


def test_multirun_sweep_over_methods_and_keys(tmp_path):
    result = fusebench("-m", *SMALL_SIM, "fusion=rrf,dbsf", "fusion.fuse_on=document,source_object",
                       "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = sorted((tmp_path / "sweep").glob("*/metrics.json"))
    assert len(jobs) == 4
    specs = {(m["fusion"]["method"], m["fusion"]["fuse_on"]) for m in (json.loads(p.read_text()) for p in jobs)}
    assert specs == {("rrf", "document"), ("rrf", "source_object"), ("dbsf", "document"), ("dbsf", "source_object")}


def test_cfg_job_prints_config_without_running(tmp_path):
    result = fusebench("--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0 and "sim_siglip2_like" in result.stdout and "fusion:" in result.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args,fragment", [
    ([*SMALL_SIM, "fusion.method=condorcet"], "valid: none, sum, minmax, zscore, isr, rrf, dbsf, l2, borda, rbc"),
    ([*SMALL_SIM, "fusion.fuse_on=pixels"], "valid: document, source_object"),
    ([*SMALL_SIM, "fusion.top_k=5"], "fusion.top_k=5 is below the largest eval.ks (10)"),
    (["dataset=manifest"], "dataset.manifest is not set"),
    (["dataset=manifest", "dataset.manifest=missing.jsonl"], "manifest file not found: missing.jsonl"),
])
def test_bad_input_exits_with_clear_error_and_no_outputs(tmp_path, args, fragment):
    result = fusebench(*args, "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.json").exists() and not (tmp_path / "run" / "ranks").exists()


def test_mismatched_vectors_name_the_file(vectors_case, tmp_path):
    files = vectors_case["files"]
    short = tmp_path / "short.npy"
    np.save(short, np.load(files["A"][0])[:-1])
    result = fusebench("dataset=manifest", f"dataset.manifest={vectors_case['manifest']}", "models=[]",
                       "+models.a.kind=vectors", f"+models.a.image_embeddings={short}",
                       f"+models.a.text_embeddings={files['A'][1]}", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2
    assert f"{short}: image embeddings has 39 rows but the corpus has 40 images" in result.stderr


def test_unknown_model_name_lists_the_registry(tmp_path):
    result = fusebench("models=[dfn5b_h14_224,no_such_model]", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown model(s) no_such_model" in result.stderr and "siglip2_so400m_p14_384" in result.stderr


def test_tiny_dataset_with_tiny_models_through_the_cli(tmp_path):
    from helpers.tiny_models import build_hf, build_open_clip

    oc, siglip = build_open_clip(tmp_path / "oc"), build_hf(tmp_path / "siglip", "siglip")
    args = ["dataset=tiny", "dataset.limit=8", "models=[]", "+models.oc.kind=open_clip", f"+models.oc.model=local-dir:{oc}",
            "+models.sg.kind=hf", f"+models.sg.checkpoint={siglip}", "embed.num_workers=1", "fusion.top_k=20",
            "eval.bootstrap.draws=100"]
    first = fusebench(*args, "hydra.run.dir=first", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = fusebench(*args, "hydra.run.dir=second", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    one = json.loads((tmp_path / "first" / "metrics.json").read_text())
    two = json.loads((tmp_path / "second" / "metrics.json").read_text())
    for name in ("oc", "sg"):
        assert one["retrievers"][name]["embedding"]["model_loaded"] is True
        assert two["retrievers"][name]["embedding"]["model_loaded"] is False
        assert two["retrievers"][name]["embedding"]["cache"]["image_hit"] is True
        assert one["retrievers"][name]["t2i"] == two["retrievers"][name]["t2i"]
    assert not any(r["hit"] for r in one["run"]["lists"].values()) and one["run"]["similarity_blocks"] > 0
    assert all(r["hit"] for r in two["run"]["lists"].values()) and two["run"]["similarity_blocks"] == 0
    listing = subprocess.run([str(Path(FUSEBENCH).with_name("fusebench-cache")), "list"], cwd=tmp_path,
                             env={**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "outputs")},
                             capture_output=True, text=True)
    rows = listing.stdout.splitlines()
    # image + text embeddings per model, and each model's stored ranked lists
    assert listing.returncode == 0 and "6 entries" in listing.stdout
    assert sum(" lists " in row for row in rows) == 2


def test_a_users_config_dir_adds_models(tmp_path):
    (tmp_path / "mine" / "models").mkdir(parents=True)
    (tmp_path / "mine" / "models" / "my_sim.yaml").write_text(
        "# @package models.my_sim\nkind: sim\ndim: 64\nimage_noise: 0.3\ntext_noise: 0.3\nseed: 9\n")
    result = fusebench("--config-dir", str(tmp_path / "mine"), "models=[sim_third,my_sim]", *SMALL_SIM, "logger=none",
                       "plots=false", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["retrievers"]) == {"sim_third", "my_sim", "fused"}
    listing = subprocess.run([shutil.which("fusebench-models") or str(Path(FUSEBENCH).with_name("fusebench-models")),
                              "--config-dir", str(tmp_path / "mine")], capture_output=True, text=True, check=True)
    assert "my_sim" in listing.stdout and "sim_third" in listing.stdout
