"""notebooks/explore_results.ipynb, executed top to bottom against a small sim sweep, so it cannot rot."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("pandas")
from nbclient import NotebookClient  # noqa: E402

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
    assert "fusebench.evaluate: fused t2i R@1" in outputs  # the Python API cell
    assert "library: fused vs model_a t2i R@1" in outputs  # the library cell (its ranks asserted equal to the run's)
    assert "the dataset 'sim' has no image files (simulated)" in outputs  # said, not shown
    images = sum("image/png" in o.get("data", {}) for c in notebook.cells for o in c.get("outputs", []))
    assert images >= 3  # recall, gains, ranks: plotted from the frames
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert {name: (sweep / name).read_bytes() for name in reports} == reports  # the sweep's report is only read
