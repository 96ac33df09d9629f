"""The commands' bad input (issue 29's second probe): one line, exit 2, nothing left behind, never a hang."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SIM = ["dataset.n_images=100", "dataset.n_captions=300", "logger=none", "plots=false"]


def command(name, *args, cwd, env=None, timeout=120):
    return subprocess.run([str(BIN / name), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def one_line_error(done, *fragments):
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.slow  # runs a fusebench command in a subprocess
@pytest.mark.parametrize("args,fragment", [
    ([], "the following arguments are required: sweep_dir"),
    (["S", "--bogus"], "unrecognized arguments: --bogus"),
    (["S", "--draws", "abc"], "--draws: invalid int value: 'abc'"),
    (["S", "--draws", "1000000000"], "valid: 1..100,000"),
    (["S", "--draws", "0"], "--draws=0 is not valid"),
])
def test_report_argument_mistakes_are_one_line(tmp_path, args, fragment):
    (tmp_path / "S").mkdir()
    one_line_error(command("fusebench-report", *args, cwd=tmp_path, timeout=60), fragment)


@pytest.mark.slow  # runs a fusebench command in a subprocess
def test_a_report_of_no_finished_run_is_one_line(tmp_path):
    (tmp_path / "S" / "0").mkdir(parents=True)
    (tmp_path / "S" / "0" / "metrics.json").write_text("{")
    one_line_error(command("fusebench-report", "S", cwd=tmp_path), "no finished runs", "1 not reported")


@pytest.mark.slow  # runs a fusebench command in a subprocess
def test_bootstrap_draws_are_bounded_before_any_work(tmp_path):
    """eval.bootstrap.draws=1e9 ran for minutes on 200 images: refused, for a run and for a sweep (whose report
    would draw as many), before any job."""
    one_line_error(command("fusebench", *SIM, "eval.bootstrap.draws=1000000000", "hydra.run.dir=R", cwd=tmp_path),
                   "eval.bootstrap.draws=1000000000", "1..100,000")
    one_line_error(command("fusebench", "-m", *SIM, "eval.bootstrap.draws=1000000000", "fusion=dbsf,rrf",
                           "hydra.sweep.dir=S", cwd=tmp_path), "eval.bootstrap.draws=1000000000")
    assert not (tmp_path / "S").exists() and not (tmp_path / "R").exists()


@pytest.mark.slow  # runs a fusebench command in a subprocess
def test_an_empty_fusebench_output_is_refused_by_the_cache_command(tmp_path):
    """FUSEBENCH_OUTPUT= put fusebench-cache's default at /cache, and clear --yes went there."""
    for args in (["clear", "--yes"], ["list"]):
        one_line_error(command("fusebench-cache", *args, cwd=tmp_path, env={"FUSEBENCH_OUTPUT": ""}),
                       "paths.output_dir is empty", "--dir")


@pytest.mark.slow  # runs a fusebench command in a subprocess
def test_a_refused_config_leaves_nothing_behind(tmp_path):
    one_line_error(command("fusebench", *SIM, "fusion.rrf_k=-1", "hydra.run.dir=fresh", cwd=tmp_path),
                   "fusion.params.rrf_k")  # the old key, read as the new one
    assert not (tmp_path / "fresh").exists() and not (tmp_path / "nested").exists()
    (tmp_path / "kept").mkdir()
    one_line_error(command("fusebench", *SIM, "fusion=rrf", "fusion.params.rrf_k=-1", "hydra.run.dir=kept/a/b/c",
                           cwd=tmp_path), "fusion.params.rrf_k")
    assert list((tmp_path / "kept").iterdir()) == []  # the folders it created above the run dir too
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    one_line_error(command("fusebench", *SIM, "search=faiss_flat", "search.nprobe=8", "hydra.run.dir=mine",
                           cwd=tmp_path), "search.nprobe=8")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_wilson_intervals_hold_the_recall_at_the_ends():
    """At R@k = 100% rounding put the interval's end a hair below 100: the recall plot's error bar was negative
    and every plot of the run was lost."""
    from fusebench.report.plots import wilson

    for n in range(1, 3000, 7):
        low, high = wilson(100.0, n)
        assert low <= 100.0 <= high <= 100.0 + 1e-9
        low, high = wilson(0.0, n)
        assert -1e-9 <= low <= 0.0 <= high


@pytest.mark.slow
def test_a_run_with_recall_100_draws_every_plot(tmp_path):
    done = command("fusebench", "dataset.n_images=100", "dataset.n_captions=300", "logger=none", "plots=true",
                   "eval.ks=[1,50]", "eval.bootstrap.draws=50", "hydra.run.dir=R", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "could not draw plots" not in done.stderr
    assert (tmp_path / "R" / "plots" / "recall_bars.png").is_file()


def test_an_error_txt_with_more_than_fusebenchs_line_is_the_users(tmp_path):
    from fusebench.runtime.layout import is_error_file

    path = tmp_path / "error.txt"
    path.write_text("fusebench: error: x\n")
    assert is_error_file(path)
    path.write_text("fusebench: error: x\nmy notes\n")
    assert not is_error_file(path)
    path.write_text("Traceback (most recent call last):\n  File ...\nValueError: x\n")
    assert is_error_file(path)


def test_ctrl_c_after_a_run_wrote_its_results_says_so(capsys, monkeypatch):
    """Ctrl-C while the plots were drawn said 'no outputs were written' over a run dir holding the new results."""
    from fusebench.app import cli
    from fusebench.runtime import state

    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # run_command sets it for its process: undone after this test
    monkeypatch.setattr(cli, "SHOW_TRACEBACKS", dict(cli.SHOW_TRACEBACKS))
    monkeypatch.setattr(cli.interrupts, "watch", lambda: None)  # no Ctrl-C handler of the run left behind

    def app():
        state.current().written.append("/tmp/R")
        raise KeyboardInterrupt

    fresh = state.start()
    try:
        with pytest.raises(SystemExit) as code:
            cli.run_command(app)
        assert code.value.code == 130
        err = capsys.readouterr().err
        assert "were written before it (/tmp/R" in err and "no outputs were written" not in err
    finally:
        assert fresh is state.current()
        state.start()


@pytest.mark.parametrize("name,module", [("fusebench-report", "fusebench.report.cli"),
                                         ("fusebench-cache", "fusebench.app.cache_cli")])
def test_ctrl_c_in_the_small_commands_is_one_line(monkeypatch, capsys, name, module):
    import importlib

    cli = importlib.import_module(module)

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_report" if name == "fusebench-report" else "_cache", interrupted)
    assert cli.main([]) == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}: interrupted")


@pytest.mark.slow  # runs a fusebench command in a subprocess
def test_a_folder_where_the_log_goes_is_one_line(tmp_path):
    (tmp_path / "R" / "fusebench.log").mkdir(parents=True)
    one_line_error(command("fusebench", *SIM, "hydra.run.dir=R", cwd=tmp_path), "fusebench.log is not a file")
    assert (tmp_path / "R" / "fusebench.log").is_dir()


@pytest.mark.slow  # runs a fusebench command in a subprocess
def test_a_sweep_refused_before_its_jobs_leaves_the_sweep_dir_as_it_was(tmp_path):
    (tmp_path / "S").mkdir()
    (tmp_path / "S" / "multirun.yaml").write_text("an earlier sweep's record\n")
    for folder in ("S", "fresh", "nested/a/b"):
        done = command("fusebench", "-m", *SIM, "eval.bogus=1,2", f"hydra.sweep.dir={folder}", cwd=tmp_path)
        assert done.returncode == 2 and "eval.bogus" in done.stderr
    assert (tmp_path / "S" / "multirun.yaml").read_text() == "an earlier sweep's record\n"
    assert not (tmp_path / "fresh").exists() and not (tmp_path / "nested").exists()


@pytest.mark.slow
def test_a_failed_rerun_leaves_the_earlier_runs_log_as_it_was(tmp_path):
    assert command("fusebench", *SIM, "eval.bootstrap.draws=50", "hydra.run.dir=R", cwd=tmp_path).returncode == 0
    log = (tmp_path / "R" / "fusebench.log").read_bytes()
    done = command("fusebench", *SIM, "gallery=sim", "gallery.size=200", "gallery.near_duplicate=0.1",
                   "hydra.run.dir=R", cwd=tmp_path)
    assert done.returncode == 2 and "gallery.near_duplicate=0.1 drops all" in done.stderr
    assert (tmp_path / "R" / "fusebench.log").read_bytes() == log


# -- every setting read or refused (issue 39, item 6): the probe's cases -----------------------------------------------

@pytest.mark.slow  # runs a fusebench command in a subprocess
@pytest.mark.parametrize("args,fragments", [
    (["fusion=none", "fusion.rrf_k=5"], ("fusion.params.rrf_k=5.0 is never read with fusion.method=none",
                                         "read only with fusion.method=rrf")),
    (["fusion=none", "fusion.fuse_on=document"], ("fusion.fuse_on='document' is never read with fusion.method=none",)),
    (["fusion=none", "models.sim_siglip2_like.weight=0.5"],
     ("models.sim_siglip2_like.weight=0.5 is never read: no fusion runs (fusion.method=none)",)),
    (["fusion=milvus_weighted", "fusion.rrf_k=5"],
     ("fusion.params.rrf_k=5.0 is never read", "with fusion.preset=milvus_weighted, fusion.method=sum reads",
      "fusion.score_map and fusion.flat_score")),
    (["fusion=qdrant_rrf", "fusion.ddof=1"],
     ("fusion.params.ddof=1 is never read", "with fusion.preset=qdrant_rrf, fusion.method=rrf reads",
      "fusion.params.rrf_k, fusion.params.rrf_weighting and fusion.rrf_ranks",
      "read only with fusion.method=zscore | dbsf")),
    (["fusion=qdrant_rrf", "+fusion.params.ddof=1"],
     ("fusion.params.ddof=1 is never read", "with fusion.preset=qdrant_rrf, fusion.method=rrf reads")),
    (["fusion=rrf", "fusion.rrf_k=30", "fusion.params.rrf_k=50"],  # the old key and its new place: neither is read
     ("fusion.rrf_k and fusion.params.rrf_k are both given", "give fusion.params.rrf_k alone")),
])
def test_a_setting_the_run_never_reads_is_refused(tmp_path, args, fragments):
    """Each ran with exit 0 before, recording the value (or warning that the preset had changed while it ran as the
    plain preset): one line naming the key, nothing written."""
    done = command("fusebench", *SIM, *args, "hydra.run.dir=R", cwd=tmp_path)
    one_line_error(done, *fragments)
    assert not (tmp_path / "R").exists() and "dropped" not in done.stdout + done.stderr


@pytest.mark.slow  # runs a sweep in a subprocess
def test_a_sweep_job_with_a_setting_it_never_reads_fails_alone(tmp_path):
    """fusion=none,rrf fusion.rrf_k=5: the none job fails with the same message (error.txt, the sweep's jobs file),
    the rrf job runs with rrf_k=5; exit 1 (some jobs failed)."""
    import json

    done = command("fusebench", "-m", *SIM, "eval.bootstrap.draws=100", "fusion=none,rrf", "fusion.rrf_k=5",
                   "hydra.sweep.dir=S", cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr
    message = "fusion.params.rrf_k=5.0 is never read with fusion.method=none"
    assert f"job 0 failed: {message}" in done.stderr
    assert message in (tmp_path / "S" / "0" / "error.txt").read_text()
    assert not (tmp_path / "S" / "0" / "metrics.json").exists()
    ran = json.loads((tmp_path / "S" / "1" / "metrics.json").read_text())
    assert ran["fusion"]["method"] == "rrf" and ran["fusion"]["params"]["rrf_k"] == 5.0
    assert "fusion.rrf_k is now fusion.params.rrf_k; the old key is read until the next release" in done.stdout


@pytest.mark.slow  # runs a sweep in a subprocess
def test_a_setting_the_method_reads_changes_the_ranks_and_the_record(tmp_path):
    """fusion=rrf fusion.rrf_k=5 and fusion=qdrant_rrf fusion.rrf_k=5 run (exit 0) and rank otherwise than with the
    preset's own rrf_k (1; qdrant_rrf keeps its label there, loses it at 5 with a warning naming rrf_k, and records 5)."""
    import json

    import numpy as np

    done = command("fusebench", "-m", *SIM, "eval.bootstrap.draws=100", "fusion=qdrant_rrf,rrf", "fusion.params.rrf_k=1,5",
                   "hydra.sweep.dir=S", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    jobs = {(f, k): tmp_path / "S" / str(i) for i, (f, k) in enumerate((f, k) for f in ("qdrant_rrf", "rrf")
                                                                         for k in (1, 5))}
    records = {job: json.loads((path / "metrics.json").read_text())["fusion"] for job, path in jobs.items()}
    assert records[("qdrant_rrf", 1)]["preset"] == "qdrant_rrf" and records[("qdrant_rrf", 5)]["preset"] is None
    assert records[("qdrant_rrf", 5)]["params"] == {"rrf_k": 5.0, "rrf_weighting": "rank"}
    assert records[("rrf", 5)]["params"]["rrf_k"] == 5.0 and records[("rrf", 1)]["params"]["rrf_k"] == 1.0
    assert "now fusion.params" not in done.stdout + done.stderr  # the new key: no warning
    assert "fusion.preset=qdrant_rrf dropped: this fusion changes the preset's own settings (rrf_k=5.0)" in done.stdout
    for fusion in ("qdrant_rrf", "rrf"):
        ranks = [np.load(jobs[(fusion, k)] / "ranks" / "fused.t2i.npy") for k in (1, 5)]
        assert not np.array_equal(*ranks), fusion
