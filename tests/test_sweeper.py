"""fusebench's sweeper (hydra/sweeper: fusebench): Hydra's basic sweeper, each job's config composed once."""

import itertools
import json
import os
import re
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
    # one line per job start on stderr, naming what varies, with the time left once a job has finished
    lines = [line[line.index("job "):] for line in ours.stderr.splitlines() if re.search(r"job \d/4 \(", line)]
    assert [line.split(")")[0] for line in lines] == [
        f"job {i}/4 (fusion={f} fusion.top_k={k}" for i, (f, k) in enumerate(itertools.product(("rrf", "dbsf"),
                                                                                                 ("25", "null")), 1)]
    assert "unknown until a job finishes" in lines[0] and all(" left for the sweep" in line for line in lines[1:])
    assert "job 1/4" not in ours.stdout and "job 1/4" not in hydras.stderr  # stderr only; Hydra's sweeper has none
    blocks = [json.loads((tmp_path / "ours" / str(job) / "metrics.json").read_text())["run"]["similarity_blocks"]
              for job in range(4)]
    assert blocks[0] > 0 and blocks[1:] == [0, 0, 0]  # the first list pass stored the whole-ranking jobs' rows too
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


@pytest.mark.parametrize("arguments", [["a=1,2", "b=x,y,z"], ["a=1"], [], ["a=range(1,4)", "b=1", "a=7,8"],
                                       ["+c=1,2", "~d", "e='q,r'", "f=[1,2],[3]", "g=choice(1,2)"]])
@pytest.mark.parametrize("max_batch_size", [None, 1, 2, 5])
def test_jobs_and_batches_are_hydras_basic_sweepers(arguments, max_batch_size):
    """The jobs and batches equal Hydra's BasicSweeper's (the reference: its own split_arguments)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.fusebench_sweeper.sweeper import job_batches

    overrides = OverridesParser.create().parse_overrides(arguments)
    assert job_batches(overrides, max_batch_size) == BasicSweeper.split_arguments(overrides, max_batch_size)


@pytest.mark.parametrize(("arguments", "max_batch_size", "message"), [
    (["a=interval(0,1)"], None, "a: the sweeper takes a list of values"),
    (["a=1,2"], 0, "hydra.sweeper.max_batch_size is 0"), (["a=1,2"], -1, "hydra.sweeper.max_batch_size is -1"),
    (["a=range(0,30,0)"], None, "a: 'a=range\\(0,30,0\\)' gives no values")])
def test_a_sweep_it_cannot_make_is_one_message(arguments, max_batch_size, message):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fusebench import FusebenchError
    from hydra_plugins.fusebench_sweeper.sweeper import job_batches

    with pytest.raises(FusebenchError, match=message):
        job_batches(OverridesParser.create().parse_overrides(arguments), max_batch_size)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_only_the_basic_launcher_is_handed_the_composed_configs(compose_cfg):
    from hydra_plugins.fusebench_sweeper.sweeper import runs_in_this_process

    assert runs_in_this_process(compose_cfg([], return_hydra_config=True))
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    assert not runs_in_this_process(compose_cfg(["hydra/launcher=joblib"], return_hydra_config=True))


def test_the_sweeper_uses_hydras_public_api_only():
    """Nothing of fusebench imports Hydra's internals (hydra._internal), which a Hydra release may reshape."""
    src = Path(__file__).resolve().parents[1] / "src"
    found = [f"{path.relative_to(src)}:{n}" for path in sorted(src.rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if "hydra._internal" in line]
    assert found == []


def test_each_job_start_prints_its_line_with_the_varying_overrides_and_the_time_left(monkeypatch, capsys):
    from hydra_plugins.fusebench_sweeper import sweeper as module

    batches = [[["fusion=rrf", "eval.ks=[1]"], ["fusion=dbsf", "eval.ks=[1]"]], [["fusion=sum", "eval.ks=[1]"]]]
    assert module.varying_keys(batches) == {"fusion"}
    sweeper = module.ComposeOnceSweeper()
    sweeper.total, sweeper.varying, sweeper.started = 3, frozenset({"fusion"}), 0.0
    clock = iter([10.0, 70.0, 190.0, 200.0])
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    for number, job in enumerate(batches[0] + batches[1]):
        sweeper.job_started(number, job)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "job 1/3 (fusion=rrf), 10s elapsed, time left for the sweep unknown until a job finishes",
        "job 2/3 (fusion=dbsf), 1m10s elapsed, about 2m00s left for the sweep",  # job 1 took 60 s: 2 jobs left
        "job 3/3 (fusion=sum), 3m10s elapsed, about 1m30s left for the sweep"]  # 60 s and 120 s: 90 s each
    monkeypatch.setenv("TQDM_DISABLE", "1")
    sweeper.job_started(3, ["fusion=rrf"])
    assert capsys.readouterr().err == "" and len(sweeper.starts) == 4  # off with the bars, still counted
