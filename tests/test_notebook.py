"""notebooks/explore_results.ipynb, executed top to bottom against a small sim sweep, so it cannot rot."""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from fusebench.report.notebook import won_and_lost
from fusebench.report.sweep import load_runs

pytestmark = pytest.mark.slow  # whole jobs and subprocesses: not in the fast tier

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_results.ipynb"


def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    fusebench = str(Path(sys.executable).with_name("fusebench"))
    sweep = tmp_path / "sweep"
    result = subprocess.run([fusebench, "-m", "dataset.n_images=200", "dataset.n_captions=1000", "fusion=rrf,dbsf",
                             "eval.bootstrap.draws=100", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env={**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out")})
    assert result.returncode == 0, result.stderr
    monkeypatch.setenv("FUSEBENCH_SWEEP", str(sweep))
    reports = {name: (sweep / name).read_bytes() for name in ("summary.md", "summary.csv", "gains.csv", "cost.csv")}
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "2 runs, 2 with fusion" in outputs and "best single model:" in outputs
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert {name: (sweep / name).read_bytes() for name in reports} == reports  # the sweep's report is only read


def test_won_and_lost_agree_with_the_ranks(tmp_path):
    fusebench = str(Path(sys.executable).with_name("fusebench"))
    subprocess.run([fusebench, "dataset.n_images=200", "dataset.n_captions=1000", "eval.bootstrap.draws=100",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, check=True, capture_output=True,
                   env={**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out")})
    run = load_runs(tmp_path)[0][0]
    examples = won_and_lost(run, k=1)
    comparison = run.record.comparison("fused", examples["best_single"], "t2i", 1)
    assert len(examples["won"]) == comparison.wins and len(examples["lost"]) == comparison.losses
    row = examples["won"][0]
    assert row["rank fused"] == 1 and row[f"rank {examples['best_single']}"] > 1
    assert row["text"].startswith("simulated caption")
