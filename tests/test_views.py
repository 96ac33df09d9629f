"""A run's views (plots, W&B) made by the background process (``views=background``, the CLI's default, and
``wait``) are the ones the job makes itself (``views=inline``): the same PNG bytes, the same plots manifest, the same
W&B run; the views process takes the run dir's lock, which a new run waits for (never for a run); it never draws
over a record another run wrote; a bad ``views`` value is one line (exit 2)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tracking import records

from fusebench import FusebenchError
from fusebench.app import views
from fusebench.app.run_config import run_config
from fusebench.runtime import layout, run_lock

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
SMALL = ["dataset.n_images=200", "dataset.n_captions=1000", "eval.bootstrap.draws=100", "logger=none"]


def fusebench(*args, cwd: Path, mode: str, terminal: bool = False, **env):
    """One command; ``terminal``: its stderr a pseudo-terminal, as a user's (a command in a terminal does not wait
    for its views process: ``views.must_wait``)."""
    environ = {**os.environ, "FUSEBENCH_OUTPUT": str(cwd / "out"), "WANDB_MODE": "disabled", "FUSEBENCH_VIEWS": mode,
               **env}
    if not terminal:
        return subprocess.run([FUSEBENCH, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=600)
    main, secondary = pty.openpty()
    try:
        result = subprocess.run([FUSEBENCH, *args], cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=secondary,
                                text=True, timeout=600)
    finally:
        os.close(secondary)
        os.close(main)
    return result


def drawn(run_dir: Path, timeout: float = 120.0) -> dict[str, bytes]:
    """The run's plots once its manifest names every plot with its sha256 (polled: the views process may still
    be drawing), as {name: bytes}, the manifest included."""
    manifest = run_dir / "plots" / layout.PLOTS_MANIFEST
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = layout.read_plots_manifest(run_dir / "plots") if manifest.is_file() else None
        if found and all(found.values()):
            return {p.name: p.read_bytes() for p in sorted((run_dir / "plots").iterdir())}
        time.sleep(0.2)
    raise AssertionError(f"{run_dir}'s plots were not drawn within {timeout} s")


def test_views_value_is_checked(compose_cfg):
    with pytest.raises(FusebenchError, match=r"views.*background, wait, inline"):
        run_config(compose_cfg(["views=later"]))
    assert run_config(compose_cfg(["views=wait"])).views == "wait"


def test_the_environment_sets_the_default(compose_cfg, monkeypatch):
    monkeypatch.setenv("FUSEBENCH_VIEWS", "wait")
    assert run_config(compose_cfg([])).views == "wait"
    monkeypatch.delenv("FUSEBENCH_VIEWS")
    assert run_config(compose_cfg([])).views == "background"


def test_a_bad_or_empty_environment_value(compose_cfg, monkeypatch):
    monkeypatch.setenv("FUSEBENCH_VIEWS", "later")  # the user never typed views=: the message names the variable
    with pytest.raises(FusebenchError, match=r"^\$FUSEBENCH_VIEWS \(the default of views\)='later' is not valid; "
                                             r"valid: background, wait, inline\.$"):
        run_config(compose_cfg([]))
    assert run_config(compose_cfg(["views=wait"])).views == "wait"  # a typed value is the user's, not the variable's
    with pytest.raises(FusebenchError, match=r"^views='soon' is not valid"):
        run_config(compose_cfg(["views=soon"]))
    for empty in ("", "  "):  # set but empty: unset, as shells and CI files often leave it
        monkeypatch.setenv("FUSEBENCH_VIEWS", empty)
        assert run_config(compose_cfg([])).views == "background"


@pytest.mark.slow
def test_background_views_are_the_plots_the_job_draws_itself(tmp_path):
    inline = fusebench(*SMALL, "hydra.run.dir=inline", cwd=tmp_path, mode="inline")
    assert inline.returncode == 0, inline.stderr
    background = fusebench(*SMALL, "hydra.run.dir=background", cwd=tmp_path, mode="background")
    assert background.returncode == 0, background.stderr
    table = [[line for line in r.stdout.splitlines() if not line.startswith("[")] for r in (inline, background)]
    assert table[0] == table[1] and any("R@1" in line for line in table[0])  # printed before the views
    expected = drawn(tmp_path / "inline", timeout=0.1)  # inline: there when the command returned
    assert len(expected) >= 6 and set(expected) <= {*layout.run_plot_names(), layout.PLOTS_MANIFEST}
    assert drawn(tmp_path / "background") == expected
    assert (tmp_path / "background" / "metrics.json").read_bytes() != b""
    assert "outputs written to" in (tmp_path / "background" / "fusebench.log").read_text()


@pytest.mark.slow
def test_a_rerun_into_the_dir_waits_for_the_views_and_wait_mode_returns_with_them(tmp_path):
    first = fusebench(*SMALL, "hydra.run.dir=run", cwd=tmp_path, mode="background")
    second = fusebench(*SMALL, "fusion=rrf", "hydra.run.dir=run", cwd=tmp_path, mode="wait")
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    plots = drawn(tmp_path / "run", timeout=0.1)  # wait: drawn before the command returned
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["fusion"]["method"] == "rrf"
    rrf = fusebench(*SMALL, "fusion=rrf", "hydra.run.dir=again", cwd=tmp_path, mode="inline")
    assert rrf.returncode == 0 and drawn(tmp_path / "again", timeout=0.1) == plots  # the second run's plots


@pytest.mark.slow
def test_a_sweep_queues_every_job_to_one_views_process_and_logs_them_to_wandb(tmp_path):
    result = fusebench("-m", *SMALL[:-1], "fusion=rrf,dbsf", "hydra.sweep.dir=sw", cwd=tmp_path, mode="wait",
                       WANDB_MODE="offline")
    assert result.returncode == 0, result.stderr
    holders = [run_lock.holder(tmp_path / "sw" / str(i)) for i in (0, 1)]
    assert all(h["command"] == run_lock.VIEWS_COMMAND for h in holders)  # the views process took each job dir
    assert holders[0]["pid"] == holders[1]["pid"]  # one process for the sweep
    for i, method in enumerate(("rrf", "dbsf")):
        drawn(tmp_path / "sw" / str(i), timeout=0.1)
        got = records(tmp_path / "sw" / str(i))
        assert got["run"].run_group == "sw" and got["run"].display_name.endswith(f"fusion={method}")
        assert any(k.startswith("plots/recall_bars") for k in got["history"])
        metrics = json.loads((tmp_path / "sw" / str(i) / "metrics.json").read_text())
        assert got["summary"]["t2i/R@1"] == pytest.approx(metrics["retrievers"]["fused"]["t2i"]["R@1"])


def _hold(folder: Path, seconds: float, as_views: bool) -> subprocess.Popen:
    code = ("import sys, time\nfrom fusebench.runtime import run_lock\n"
            + ("sys.argv[:] = [run_lock.VIEWS_COMMAND]\n" if as_views else "")
            + f"run_lock.hold({str(folder)!r})\nprint('held', flush=True)\ntime.sleep({seconds})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.slow
def test_a_run_waits_for_a_views_process_but_never_for_a_run(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    proc = _hold(folder, 1.5, as_views=True)
    try:
        start = time.monotonic()
        assert run_lock.hold(folder) is True  # waited for the views process to end, then taken
        assert time.monotonic() - start > 0.5
        run_lock.release(folder)
    finally:
        proc.kill()
        proc.wait()
    proc = _hold(folder, 30, as_views=False)
    try:
        start = time.monotonic()
        with pytest.raises(run_lock.RunDirInUse):
            run_lock.hold(folder)
        with pytest.raises(run_lock.RunDirInUse):
            run_lock.check_free(folder)
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_run_waits_for_a_dir_handed_to_views_even_before_the_views_process_rewrote_its_record(tmp_path):
    """The lock held by a process whose record still names the run that handed the dir to a live views process (the
    instant after that process took it, or the run not yet gone) is waited for, not refused as a run's; once that
    views process has ended, a run holding the dir is refused at once."""
    folder = tmp_path / "run"
    folder.mkdir()
    views_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    code = ("import sys, time\nfrom fusebench.runtime import run_lock\n"
            f"run_lock.hold({str(folder)!r})\nrun_lock.hand_to_views({str(folder)!r}, {views_proc.pid})\n"
            "print('held', flush=True)\ntime.sleep(30)\n")
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline().strip() == "held"
        start = time.monotonic()
        with pytest.raises(run_lock.RunDirInUse):
            run_lock.hold(folder)
        assert time.monotonic() - start > 1.0  # waited while the views process lived, then refused: a run holds it
    finally:
        for proc in (run, views_proc):
            proc.kill()
            proc.wait()


def test_the_views_process_never_draws_over_another_runs_record(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text("{}")
    job = views.ViewsJob(run_dir=str(run_dir), metrics_sha256="0" * 64, plots=True, logger=None, resolved=None,
                         group=None, name=None, log_file=str(run_dir / "fusebench.log"))
    views.serve(job, record=None)  # a record that would fail to draw: never reached
    assert not (run_dir / "plots").exists()
    assert "is no longer the record this run wrote" in (run_dir / "fusebench.log").read_text()
    assert not run_lock.held_here(run_dir)


@pytest.mark.slow
def test_a_terminal_sweep_returns_before_its_report_plots_which_the_views_process_draws_as_a_sweep_would(tmp_path):
    """In a terminal (``background``, not waited for) the sweep's report plots and its W&B summary run are made by
    the views process after the command returns: the same PNG bytes and report.sha256 entries as a sweep that
    draws them itself, and the sweep dir's lock held by that process meanwhile."""
    args = ["-m", *SMALL[:-1], "fusion=rrf,dbsf", "logger=wandb"]
    inline = fusebench(*args, "hydra.sweep.dir=inline", cwd=tmp_path, mode="inline", WANDB_MODE="offline")
    assert inline.returncode == 0, inline.stderr
    terminal = fusebench(*args, "hydra.sweep.dir=sw", cwd=tmp_path, mode="background", terminal=True,
                         WANDB_MODE="offline")
    assert terminal.returncode == 0, terminal.stdout
    from fusebench.report import report_files

    sweep = tmp_path / "sw"
    plots = [f"plots/{name}" for name in report_files.plot_names() if (tmp_path / "inline" / "plots" / name).is_file()]
    assert len(plots) >= 3
    deadline = time.monotonic() + 120
    while not set(plots) <= set(report_files.read_manifest(sweep) or {}) and time.monotonic() < deadline:
        time.sleep(0.2)
    run_lock.check_free(sweep, key="hydra.sweep.dir")  # waits for the views process (the W&B run after the plots)
    holder = run_lock.holder(sweep)
    assert holder["command"] == run_lock.VIEWS_COMMAND  # the views process took the sweep dir to draw there
    manifest, expected = report_files.read_manifest(sweep), report_files.read_manifest(tmp_path / "inline")
    for rel in plots:
        assert (sweep / rel).read_bytes() == (tmp_path / "inline" / rel).read_bytes()
        assert manifest[rel] == expected[rel] and report_files.written(sweep, rel, manifest)
    for job in (0, 1):
        drawn(sweep / str(job))
    summary = records(sweep)  # the sweep's own W&B run: its tables and the plots drawn after it returned
    for rel in plots:
        assert any(key.startswith(f"plots/{Path(rel).stem}") for key in summary["history"]), rel
    assert summary["summary"]["runs"] == 2


def test_the_views_process_never_draws_a_sweeps_plots_over_another_report(tmp_path, capsys):
    from fusebench.report.sweep import SweepSummary

    (tmp_path / "summary.md").write_text("# another report\n")
    report = SweepSummary(folder=tmp_path, runs=[], reasons={}, ks=[1], level=0.95, draws=10, article=[], gains=[],
                          cost=[], beside_article=[], positives=[], positive_gains=[], tuned=[], out=tmp_path)
    job = views.SweepViews(sweep_dir=str(tmp_path), summary_sha256="0" * 64, logger=None)
    views._Failures.seen = False
    views.serve_sweep(job, report)
    assert not (tmp_path / "plots").exists() and not run_lock.held_here(tmp_path)
    assert "is no longer the report this sweep wrote" in capsys.readouterr().err
    assert views._Failures.seen  # the views process keeps its errors file, which the command named
    gone = tmp_path / "moved"
    report.out = report.folder = gone
    views.serve_sweep(views.SweepViews(sweep_dir=str(gone), summary_sha256="0" * 64, logger=None), report)
    assert not gone.exists()  # a sweep dir removed or moved since is never made again (its lock file)
    assert "is gone" in capsys.readouterr().err
    views._Failures.seen = False


def test_where_a_sweeps_report_plots_are_drawn(monkeypatch):
    """Only a command that will not wait for the views process leaves them to it; one that waits draws them
    itself, beside the views process's last runs."""
    monkeypatch.setattr(views, "in_terminal", lambda: True)
    for name in views.SCHEDULERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(views.COMMAND_PID, raising=False)
    monkeypatch.setattr(views._PROCESS, "wait_at_end", False)
    assert views.sweep_deferred("background")
    assert not views.sweep_deferred("wait") and not views.sweep_deferred("inline")
    monkeypatch.setattr(views._PROCESS, "wait_at_end", True)  # a job of the command asked for the wait
    assert not views.sweep_deferred("background")
    monkeypatch.setattr(views._PROCESS, "wait_at_end", False)
    monkeypatch.setattr(views, "in_terminal", lambda: False)  # a script: the command waits anyway
    assert not views.sweep_deferred("background")


def test_where_a_command_must_wait_for_its_views(monkeypatch):
    monkeypatch.setattr(views, "in_terminal", lambda: True)
    for name in (*views.SCHEDULERS, views.COMMAND_PID):
        monkeypatch.delenv(name, raising=False)
    assert not views.must_wait()  # a user's terminal: the command returns at once
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert views.must_wait()  # the job's end would take the views process with it
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv(views.COMMAND_PID, str(os.getpid() + 1))
    assert views.in_worker() and views.must_wait()  # a launcher's worker: waited for as its job ends
    monkeypatch.setenv(views.COMMAND_PID, str(os.getpid()))
    assert not views.in_worker() and not views.must_wait()
    monkeypatch.setattr(views, "in_terminal", lambda: False)
    assert views.must_wait()  # a script, CI, a notebook: whatever runs it may end its processes


@pytest.mark.slow
def test_a_run_taking_a_dir_handed_to_views_waits_for_that_process(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    try:
        assert run_lock.hold(folder)
        run_lock.hand_to_views(folder, sleeper.pid)
        assert run_lock.holder(folder)["views_pending"] == sleeper.pid
        run_lock.release(folder)
        start = time.monotonic()
        assert run_lock.hold(folder) is True  # waited for the views process it was handed to (here: its end)
        assert time.monotonic() - start > 0.5
        assert "views_pending" not in run_lock.holder(folder)  # taken: ours now
        run_lock.release(folder)
    finally:
        sleeper.kill()
        sleeper.wait()
    start = time.monotonic()
    assert run_lock.hold(folder) is True and time.monotonic() - start < 0.5  # a dead views process: no wait
    run_lock.release(folder)


def test_a_plot_write_cut_short_is_the_runs_own(tmp_path):
    from fusebench.app import rundir
    from fusebench.runtime.layout import plots_manifest_text

    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / layout.PLOTS_MANIFEST).write_text(plots_manifest_text({"recall_bars.png": None}))
    (plots / ".recall_bars.png.ab12cd34.tmp").write_bytes(b"\x89PNG cut short")
    assert rundir.foreign(tmp_path) == []  # being drawn when the views process was killed: a rerun replaces it
    (plots / ".wins_losses.png.ab12cd34.tmp").write_bytes(b"x")  # not named as being drawn: someone else's
    assert rundir.foreign(tmp_path) == ["plots/.wins_losses.png.ab12cd34.tmp"]


@pytest.mark.slow
def test_reruns_from_a_terminal_lose_no_plots_and_no_wandb_run(tmp_path):
    """Each command returns without waiting (a terminal); the next run into the dir waits for the earlier run's
    views process, so every run's W&B run is made and the plots are the last record's."""
    for method in ("rrf", "dbsf", "sum"):
        result = fusebench(*SMALL[:-1], "logger=wandb", f"fusion={method}", "hydra.run.dir=run", cwd=tmp_path,
                           mode="background", terminal=True, WANDB_MODE="offline")
        assert result.returncode == 0
    plots = drawn(tmp_path / "run")
    run_lock.check_free(tmp_path / "run")  # waits for the last views process (its W&B run comes after the plots)
    assert len(list((tmp_path / "run" / "wandb").glob("offline-run-*"))) == 3
    alone = fusebench(*SMALL, "fusion=sum", "hydra.run.dir=alone", cwd=tmp_path, mode="inline")
    assert alone.returncode == 0 and drawn(tmp_path / "alone", timeout=0.1) == plots


@pytest.mark.slow
def test_a_launchers_worker_waits_for_its_jobs_views(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    result = fusebench("-m", *SMALL, "fusion=rrf,dbsf", "hydra.sweep.dir=sw", "hydra/launcher=joblib",
                       "hydra.launcher.n_jobs=2", cwd=tmp_path, mode="background", terminal=True)
    assert result.returncode == 0, result.stdout
    for job in (0, 1):
        drawn(tmp_path / "sw" / str(job), timeout=0.1)  # there when the command returned


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="POSIX priorities")
def test_the_views_process_yields_the_cores_to_the_jobs_and_takes_requests_without_blocking():
    process = views._Views()
    process.start()
    try:
        pid = process.proc.pid
        autogroup = Path(f"/proc/{pid}/autogroup")

        def lowered() -> bool:  # the session's last: its priority set, the process's is
            if autogroup.is_file():  # Linux shares the CPU between sessions first: the views' session yields too
                return autogroup.read_text().split()[-1] == str(views.VIEWS_NICENESS)
            return os.getpriority(os.PRIO_PROCESS, pid) == views.VIEWS_NICENESS
        deadline = time.monotonic() + 60
        while not lowered() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lowered()
        assert os.getpriority(os.PRIO_PROCESS, pid) == views.VIEWS_NICENESS  # plots take only the idle time
        if sys.platform == "linux" and int(Path("/proc/sys/fs/pipe-max-size").read_text()) >= views.PIPE_BYTES:
            import fcntl

            assert fcntl.fcntl(process.proc.stdin.fileno(), fcntl.F_GETPIPE_SZ) == views.PIPE_BYTES
    finally:
        process.proc.kill()
        process.proc.wait()
