"""One run per run dir at a time (issue 39, item 7): a run holds its run dir's lock (``runtime.run_lock``, an OS
advisory lock the kernel releases when the process ends) for its life. A second run into the dir, a sweep into a
sweep dir in use, and the Python API into an ``out_dir`` in use are refused (exit 2, one line naming the holder's
pid, host and start time); the engine folder's cleanup never takes a live run's database for a killed run's
leftovers; a run killed with SIGKILL holds nothing, and the next run proceeds and removes its true leftovers.

Each holder here is a real second process (a subprocess that takes the lock as a run does, and sleeps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.backends import engine_dirs
from fusebench.report.runs import scan_runs
from fusebench.runtime import run_lock

pytestmark = pytest.mark.slow  # every test starts a second process (and some whole jobs)

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
SMALL = ["dataset.n_images=200", "dataset.n_captions=1000", "eval.bootstrap.draws=100", "logger=none", "plots=false"]
HOLDER = ("import sys, time\nfrom fusebench.runtime import run_lock\nrun_lock.hold(sys.argv[2])\n"
          "print('held', flush=True)\ntime.sleep(600)\n")


@contextmanager
def held(folder: Path):
    """A second process holding ``folder``'s lock as a live run does, until the block ends (then killed)."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, "holder-of", str(folder)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def fusebench(*args, cwd):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(Path(cwd) / "out"), "WANDB_MODE": "disabled"}
    return subprocess.run([FUSEBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def refused(result, *fragments) -> str:
    """Exit 2 and nothing on stderr but one ``fusebench: error:`` line holding every fragment."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fusebench: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_lock_is_held_for_the_life_of_its_process_and_names_its_holder(tmp_path):
    run_dir = tmp_path / "run"
    with held(run_dir) as holder:
        info = run_lock.holder(run_dir)
        assert info["pid"] == holder.pid and info["host"] and info["started"].endswith("UTC")
        assert "holder-of" in info["command"]
        with pytest.raises(run_lock.RunDirInUse, match=rf"run dir {run_dir} is in use by another fusebench run "
                                                         rf"\(pid {holder.pid} on host .*, started .* UTC"):
            run_lock.hold(run_dir)
        with pytest.raises(run_lock.RunDirInUse, match=f"pid {holder.pid}"):
            run_lock.check_free(run_dir)
        assert not run_lock.held_here(run_dir)
        os.kill(holder.pid, signal.SIGKILL)  # a killed run: the kernel releases its lock
        holder.wait()
        run_lock.check_free(run_dir)  # free: its dir may hold its leftovers now
        assert run_lock.hold(run_dir) and run_lock.held_here(run_dir) and not run_lock.hold(run_dir)
        assert run_lock.holder(run_dir)["pid"] == os.getpid()
        run_lock.release(run_dir)
    assert not run_lock.held_here(run_dir)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / run_lock.LOCK_NAME).mkdir()  # not a file: no process could hold it
    with pytest.raises(FusebenchError, match=rf"{run_lock.LOCK_NAME} is not a file .* hydra.run.dir"):
        run_lock.hold(tmp_path / "other")


def test_the_engine_cleanup_never_takes_a_live_runs_database_for_leftovers(tmp_path):
    """The reproduction's cause: each run removed the other's live database as 'left by a killed run'."""
    run_dir = tmp_path / "run"
    live = engine_dirs.fresh_workdir(run_dir, "t2i")
    (live / "data.lance").write_text("the live run's database")
    with held(run_dir) as holder:
        with pytest.raises(run_lock.RunDirInUse, match=f"pid {holder.pid}"):
            engine_dirs.fresh_workdir(run_dir, "t2i")
        assert (live / "data.lance").read_text() == "the live run's database"
    again = engine_dirs.fresh_workdir(run_dir, "t2i")  # its holder killed: a true leftover, removed and rebuilt
    assert again == live and not (live / "data.lance").exists()


def test_a_second_run_into_a_live_run_dir_is_refused_and_a_killed_runs_leftovers_are_cleaned(tmp_path, capsys):
    pytest.importorskip("lancedb")
    run_dir = tmp_path / "X"
    leftover = engine_dirs.fresh_workdir(run_dir, "t2i")
    (leftover / "data.lance").write_text("the holder's database")
    with held(run_dir) as holder:
        before = snapshot(run_dir)
        line = refused(fusebench(*SMALL, "search=lancedb", f"hydra.run.dir={run_dir}", cwd=tmp_path),
                       f"the run dir {run_dir} is in use", f"pid {holder.pid} on host", "UTC", "hydra.run.dir=...")
        assert "wait for it to end" in line
        assert snapshot(run_dir) == before  # nothing of the live run's touched: its .hydra, database, lock
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    result = fusebench(*SMALL, "search=lancedb", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    log = (run_dir / "fusebench.log").read_text()
    assert "holds an engine database from an earlier run" in log and not (run_dir / "engine_db").exists()
    scan = scan_runs(run_dir)  # the lock file beside the outputs changes no scan, no checksum
    assert [r.path for r in scan.runs] == [run_dir] and scan.failed == {}
    assert "search=lancedb" in run_lock.holder(run_dir)["command"] and not run_lock.held_here(run_dir)
    from fusebench.report.cli import main as report_main

    with held(run_dir) as holder:  # a report into a run dir a run writes now: refused (its outputs would swap in)
        assert report_main([str(run_dir), "--draws", "50"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"fusebench-report: error: the report folder {run_dir} is in use") and "\n" not in err
        assert f"pid {holder.pid}" in err and not (run_dir / "summary.md").exists()
    assert report_main([str(run_dir), "--draws", "50"]) == 0 and not run_lock.held_here(run_dir)


def test_a_sweep_into_a_sweep_dir_in_use_is_refused_before_any_job(tmp_path):
    sweep_dir = tmp_path / "S"
    with held(sweep_dir) as holder:
        refused(fusebench("-m", *SMALL, "fusion=rrf,sum", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path),
                f"the sweep dir {sweep_dir} is in use", f"pid {holder.pid}", "hydra.sweep.dir=...")
        assert sorted(p.name for p in sweep_dir.iterdir()) == [run_lock.LOCK_NAME]  # no job dir, no multirun.yaml


def test_a_sweep_whose_job_dir_is_in_use_stops_naming_it(tmp_path):
    sweep_dir = tmp_path / "S"
    with held(sweep_dir / "1") as holder:
        refused(fusebench("-m", *SMALL, "fusion=rrf,sum", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path),
                f"job dir (job 1) {sweep_dir / '1'} is in use", f"pid {holder.pid}")
        assert sorted(p.name for p in (sweep_dir / "1").iterdir()) == [run_lock.LOCK_NAME]  # untouched
        assert not list(sweep_dir.rglob("metrics.json"))  # refused before any job ran
    with held(sweep_dir / "1") as holder:  # a job dir taken after the sweep was checked: the job stops it
        hold = subprocess.run([sys.executable, "-c", "from fusebench.app.callback import job_started; import sys; "
                               "job_started(sys.argv[1], sys.argv[2], 1, None)", str(sweep_dir / "1"),
                               str(sweep_dir)], capture_output=True, text=True)
        assert "RunDirRefused" in hold.stderr and f"pid {holder.pid}" in hold.stderr


def test_the_api_refuses_an_out_dir_in_use_and_releases_its_own(tmp_path):
    import fusebench

    rng = np.random.default_rng(0)
    image, text = rng.standard_normal((30, 8)), rng.standard_normal((60, 8))
    models, captions = {"a": (image, text), "b": (image + 0.1, text)}, np.repeat(np.arange(30), 2)
    out_dir = tmp_path / "api"
    overrides = ["eval.bootstrap.draws=50", f"embed.cache.dir={tmp_path / 'cache'}"]
    with held(out_dir) as holder:
        with pytest.raises(run_lock.RunDirInUse, match=rf"in use .*pid {holder.pid}.* out_dir=\.\.\."):
            fusebench.evaluate(models, captions, overrides=overrides, out_dir=out_dir)
        assert not (out_dir / "metrics.json").exists()
    result = fusebench.evaluate(models, captions, overrides=overrides, out_dir=out_dir)
    assert result.out_dir == out_dir and not run_lock.held_here(out_dir)
    with held(out_dir):  # released when the call returned: another process takes it at once
        pass


def test_a_filesystem_without_file_locks_is_one_line_naming_the_key(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(FusebenchError, match=r"cannot lock .*\.fusebench\.lock \(No locks available\): its filesystem "
                                             r"offers no file locks .* hydra\.sweep\.dir=\.\.\.$"):
        run_lock.hold(tmp_path, "hydra.sweep.dir")
    assert not run_lock.held_here(tmp_path)


def test_a_users_file_under_the_locks_name_is_refused_never_overwritten(tmp_path):
    """A file of the lock's name that fusebench did not write is refused, naming it, and left as it was; an empty
    one, or a holder record (whole or cut short while being written), is fusebench's (found by the hostile probe)."""
    mine = tmp_path / run_lock.LOCK_NAME
    mine.write_text("my notes\n")
    with pytest.raises(FusebenchError, match=r"is not a lock file fusebench wrote .* hydra\.run\.dir=\.\.\.$"):
        run_lock.hold(tmp_path)
    assert mine.read_text() == "my notes\n" and not run_lock.held_here(tmp_path)
    for ours in (b"", run_lock._holder_bytes()[:10], run_lock._holder_bytes()):
        mine.write_bytes(ours)
        assert run_lock.hold(tmp_path)
        assert run_lock.holder(tmp_path)["pid"] == os.getpid()
        run_lock.release(tmp_path)
