"""The package as a user installs it (a wheel, not the checkout): configs inside, fusebench works anywhere."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_wheel_ships_the_configs_and_runs_from_any_folder(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(ROOT), "-w",
                            str(tmp_path / "wheel")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "wheel").glob("fusebench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "fusebench/conf/config.yaml" in names and "fusebench/conf/models/sim_siglip2_like.yaml" in names
    assert "fusebench/conf/experiment/fusion_ablation.yaml" in names
    assert "fusebench/conf/hydra/sweeper/fusebench.yaml" in names and "hydra_plugins/fusebench_sweeper/sweeper.py" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "FUSEBENCH_OUTPUT": str(elsewhere / "out"), "WANDB_MODE": "disabled"}
    where = subprocess.run([sys.executable, "-c", "import fusebench.app.cli as c; print(c.CONFIG_DIR)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(target))  # the installed copy, not the checkout
    result = subprocess.run([sys.executable, "-m", "fusebench.app.cli", "dataset.n_images=100", "dataset.n_captions=300",
                             "eval.bootstrap.draws=20", "logger=none", "plots=false"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert list((elsewhere / "out" / "runs").glob("*/*/metrics.json"))
    sweep = subprocess.run([sys.executable, "-m", "fusebench.app.cli", "-m", "fusion=rrf,dbsf", "dataset.n_images=100",
                            "dataset.n_captions=300", "eval.bootstrap.draws=20", "logger=none", "plots=false",
                            f"hydra.sweep.dir={elsewhere / 'sweep'}"], cwd=elsewhere, env=env, capture_output=True,
                           text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stderr  # fusebench's sweeper (a Hydra plugin) ships in the wheel
    assert (elsewhere / "sweep" / "1" / "metrics.json").is_file() and (elsewhere / "sweep" / "summary.md").is_file()
    listing = subprocess.run([sys.executable, "-c", "from fusebench.app.cli import list_models; list_models([])"],
                             cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert "siglip2_so400m_p14_384" in listing.stdout and "hf" in listing.stdout
