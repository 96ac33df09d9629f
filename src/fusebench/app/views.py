"""A run's views: its plots (``plots/``) and its logger (W&B), made from the run dir once its record is written and
its table printed. Nothing in them is a result: they are drawn from the run's record and ranks/, final by then.

``views`` (a top-level config key) says where:

* ``background`` (the CLI's default): a separate process makes them, and the command returns without waiting for
  them (a job's fixed cost loses matplotlib's import, the drawing and W&B's start: docs/speed.md). One such process
  serves every job of a command (a sweep's jobs queue their views to it, so matplotlib is imported once and a plot
  drawn alike for many jobs is drawn once). Inside a SLURM job (``SLURM_JOB_ID``), whose end takes its processes
  with it, the command waits for it.
* ``wait``: the same process, and the command waits for it before it returns (a sweep's plots are drawn beside
  its next jobs, and are all there when the command ends).
* ``inline``: in the job itself, before the job returns (the Python API's default: a notebook reads the plots
  right after the call).

The views process takes the run dir's lock (``runtime.run_lock``) while it draws, after the job has released it:
a new run into the dir waits for it (``run_lock`` waits for a views holder, never for a run). It draws only when
metrics.json is still the file the job wrote (its sha256, sent with the request): a run dir another run took in
between is left to that run. Each run's plots manifest says what is being drawn until it is done, so a view that
never finished (the machine went down) is told from the run's own plots by the next run in the dir. A failure is a
warning in the run's ``fusebench.log``, never a reason for the run to fail, as before.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import fusebench
from fusebench.app.tracking import job_identity, log_run
from fusebench.config.schema import LoggerConfig, WandbConfig
from fusebench.evaluation.record import RunRecord
from fusebench.report.plots import run_plots
from fusebench.runtime import run_lock
from fusebench.stores.files import file_sha256

log = logging.getLogger(__name__)
LOG_NAME = "fusebench.log"  # the run's log (hydra.job.name + .log), where the views process writes its lines
LOCK_WAIT_S = 3600.0  # how long the views process waits for the job to release the run dir (a sweep job's whole life)


@dataclass(frozen=True)
class ViewsJob:
    """What the views of one run need besides its run dir's files and its record (sent beside it, pickled, so the
    views process draws from the very record the job wrote, not from its JSON)."""

    run_dir: str
    metrics_sha256: str  # metrics.json as the job wrote it: drawn only from that file
    plots: bool
    logger: LoggerConfig  # the typed logger config
    resolved: dict | None  # the composed config, W&B's run config
    group: str | None  # W&B's group and name (the sweep and the job's overrides), read from Hydra in the job
    name: str | None


def make(job: ViewsJob, record: RunRecord) -> None:
    """The plots, then the logger (which logs the plots as images): a failure of either is a warning."""
    plots = []
    if job.plots:
        try:
            plots = run_plots(job.run_dir, record)
        except Exception as err:  # noqa: BLE001 - plots are a view of the outputs, never a reason to fail
            log.warning("could not draw plots: %s", err)
    log_run(job.logger, record, job.run_dir, plots, resolved=job.resolved, identity=(job.group, job.name))


def request(run_dir: str | Path, record: RunRecord, plots: bool, logger: LoggerConfig, resolved: dict | None) -> ViewsJob:
    """The views job of a run just written into ``run_dir`` (its metrics.json hashed now)."""
    group, name = job_identity()
    return ViewsJob(run_dir=os.path.abspath(run_dir), metrics_sha256=file_sha256(Path(run_dir) / "metrics.json"),
                    plots=plots, logger=logger, resolved=resolved, group=group, name=name)


def dispatch(mode: str, run_dir: str | Path, record: RunRecord, plots: bool, logger: LoggerConfig,
             resolved: dict | None) -> None:
    """Make the run's views where ``mode`` says (nothing to make: plots off and logger=none)."""
    if not plots and not isinstance(logger, WandbConfig):
        return
    job = request(run_dir, record, plots, logger, resolved)
    if mode == "inline":
        make(job, record)
        return
    try:
        _PROCESS.submit(job, record)
    except OSError as err:  # no process could be started (a full process table, no memory): draw them here
        log.warning("could not start the views process (%s); drawing the plots in the job instead", err)
        make(job, record)
        return
    if mode == "wait" or os.environ.get("SLURM_JOB_ID"):
        _WAIT["on"] = True


_WAIT = {"on": False}  # whether the command waits for its views process before it ends (``finish``)


class _Views:
    """The views process of this process, fed (ViewsJob, RunRecord) pickles on its stdin, one per run."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        package_root = str(Path(fusebench.__file__).resolve().parent.parent)  # fusebench as this process imports it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                           if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "fusebench.app.views"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)  # a Ctrl-C at the terminal stops the command, not this

    def submit(self, job: ViewsJob, record: RunRecord) -> None:
        data = pickle.dumps((job, record), protocol=pickle.HIGHEST_PROTOCOL)
        for attempt in (0, 1):
            if not self.alive():
                self.start()
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
                return
            except (BrokenPipeError, ValueError):  # it died (killed): a new one takes this job
                if attempt:
                    raise OSError("the views process ended as soon as it started") from None
                self.proc = None

    def close(self, wait: bool) -> None:
        """No more jobs: its stdin is closed (it ends once it has made what it was sent); ``wait`` for that."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if wait:
            self.proc.wait()
        self.proc = None


_PROCESS = _Views()


def finish() -> None:
    """The command ends: the views process gets no more jobs; wait for it in ``wait`` mode or inside SLURM. Call
    after the command's run dir locks are released (the views process takes them)."""
    wait, _WAIT["on"] = _WAIT["on"], False
    _PROCESS.close(wait)


# The views process.

def _run_log(run_dir: Path) -> logging.Handler | None:
    """Append this process's log lines to the run's log (Hydra's format), while its views are made."""
    try:
        handler = logging.FileHandler(run_dir / LOG_NAME, encoding="utf-8")
    except OSError:
        return None
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


def serve(job: ViewsJob, record: RunRecord) -> None:
    """Make one run's views in this (the views) process: the run dir's lock, the record checked, then ``make``."""
    run_dir = Path(job.run_dir)
    handler = _run_log(run_dir)
    try:
        run_lock.hold(run_dir, wait=LOCK_WAIT_S)
        try:
            metrics = run_dir / "metrics.json"
            if not metrics.is_file() or file_sha256(metrics) != job.metrics_sha256:
                log.warning("no plots drawn: %s is no longer the record this run wrote (another run took the dir)",
                            metrics)
                return
            make(job, record)
        finally:
            run_lock.release(run_dir)
    except Exception as err:  # noqa: BLE001 - a view never fails a run; the run's log says why it is missing
        log.warning("could not make the plots or the log of %s: %s", run_dir, err, exc_info=True)
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


def main() -> None:
    """``python -m fusebench.app.views``: make the views of each run sent on stdin (a pickled (ViewsJob, RunRecord)
    each), in order, until stdin closes."""
    sys.argv[:] = [run_lock.VIEWS_COMMAND]  # how this process names itself in a run dir's lock (run_lock.describe)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger().setLevel(logging.INFO)
    while True:
        try:
            job, record = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        except Exception:  # noqa: BLE001 - cut short (the command was killed mid-send): nothing more to make
            return
        serve(job, record)


if __name__ == "__main__":
    main()
