"""fusebench's sweeper (hydra/sweeper: fusebench): Hydra's basic sweeper, each job's config composed once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hydra_plugins.fusebench_sweeper.sweeper import ComposedConfigs

SMALL = ["dataset.n_images=200", "dataset.n_captions=800", "eval.bootstrap.draws=100", "plots=false", "logger=none"]
# runs the CLI with Hydra's composition counted: the count goes to the file named by COUNT_FILE at exit
COUNTING_CLI = """
import atexit, os, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
calls = []
original = ConfigLoaderImpl.load_sweep_config
def counted(self, master_config, sweep_overrides):
    calls.append(list(sweep_overrides))
    return original(self, master_config, sweep_overrides)
ConfigLoaderImpl.load_sweep_config = counted
atexit.register(lambda: open(os.environ["COUNT_FILE"], "w").write(str(len(calls))))
from fusebench.app.cli import main
sys.argv = ["fusebench", *sys.argv[1:]]
main()
"""


class FakeLoader:
    def __init__(self):
        self.composed = []

    def load_sweep_config(self, master_config, sweep_overrides):
        self.composed.append(list(sweep_overrides))
        return {"overrides": list(sweep_overrides), "n": len(self.composed)}

    def get_sources(self):
        return ["sources"]


def test_composed_configs_are_handed_out_once_each_in_order():
    loader = FakeLoader()
    composed = ComposedConfigs(loader)
    for overrides in (["a=1"], ["a=2"], ["a=1"]):  # a repeated job gets its own config
        composed.compose_and_keep("master", overrides)
    assert composed.load_sweep_config("master", ["a=1"]) == {"overrides": ["a=1"], "n": 1}
    assert composed.load_sweep_config("master", ["a=2"]) == {"overrides": ["a=2"], "n": 2}
    assert composed.load_sweep_config("master", ["a=1"]) == {"overrides": ["a=1"], "n": 3}
    assert len(loader.composed) == 3  # nothing composed twice
    assert composed.load_sweep_config("master", ["a=1"]) == {"overrides": ["a=1"], "n": 4}  # used up: composed again
    assert composed.load_sweep_config("master", ["b=1"])["overrides"] == ["b=1"]
    assert composed.get_sources() == ["sources"]  # the rest of Hydra's loader is Hydra's


def _sweep(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    count = tmp_path / f"{name}.count"
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled",
           "COUNT_FILE": str(count)}
    result = subprocess.run([sys.executable, "-c", COUNTING_CLI, "-m", *SMALL, *args,
                             f"hydra.sweep.dir={tmp_path / name}"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    return result, int(count.read_text()) if count.is_file() else -1


@pytest.mark.slow
def test_each_job_is_composed_once_and_runs_as_with_hydras_sweeper(tmp_path):
    jobs = ["fusion=rrf,dbsf", "fusion.top_k=25,null"]
    ours, ours_count = _sweep(tmp_path, "ours", *jobs)
    assert ours.returncode == 0, ours.stderr
    hydras, hydras_count = _sweep(tmp_path, "hydras", *jobs, "hydra/sweeper=basic")
    assert hydras.returncode == 0, hydras.stderr
    assert (ours_count, hydras_count) == (4, 8)  # validation composes each of the 4 jobs; Hydra's launcher again
    for job in range(4):
        mine, theirs = tmp_path / "ours" / str(job), tmp_path / "hydras" / str(job)
        assert (mine / ".hydra" / "config.yaml").read_text() == (theirs / ".hydra" / "config.yaml").read_text()
        assert (mine / ".hydra" / "overrides.yaml").read_text() == (theirs / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((mine / "metrics.json").read_text())["retrievers"] == \
            json.loads((theirs / "metrics.json").read_text())["retrievers"]
        for ranks in (mine / "ranks").glob("*.npy"):
            assert np.array_equal(np.load(ranks), np.load(theirs / "ranks" / ranks.name))


@pytest.mark.slow
def test_a_job_that_cannot_compose_stops_the_sweep_before_any_job_runs(tmp_path):
    result, _ = _sweep(tmp_path, "bad", "eval.bootstrap.draws=100,abc")
    assert result.returncode == 2
    assert "eval.bootstrap.draws" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "bad" / "0").exists()  # validated up front, as Hydra's sweeper does
