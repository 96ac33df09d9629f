"""A run's views: its plots (``plots/``) and its logger (W&B), made from the run dir once its record is written and
its table printed. Nothing in them is a result: they are drawn from the run's record and ranks/, final by then.

``views`` (a top-level config key) says where:

* ``background`` (the CLI's default): a separate process makes them. One such process serves every job of a
  command (a sweep's jobs queue their views to it, so matplotlib is imported once and a plot drawn alike for many
  jobs is drawn once). In a terminal the command returns without waiting for it (a job's fixed cost loses
  matplotlib's import, the drawing and W&B's start: docs/speed.md); wherever the command's end may take its
  processes with it, it waits for it at its end (:func:`must_wait`: not in a terminal, a batch scheduler's job, a
  container's first process, a launcher's worker process).
* ``wait``: the same process, and the command always waits for it before it returns.
* ``inline``: in the job itself, before the job returns.

A sweep's report plots and W&B summary run are a view too: the views process makes them, after the jobs', only where
the command will not wait for it (:func:`sweep_deferred`); the report's tables are written by the command first.

The views process takes the run dir's lock (``runtime.run_lock``) while it draws. The job hands the dir over
before it releases the lock (``run_lock.hand_to_views``), so a new run that takes the lock first waits for it
(a new run never waits for a run). It draws only when metrics.json is still the file the job wrote (its sha256,
sent with the request). Each run's plots manifest says what is being drawn until it is done, so a view that never
finished is told from the run's own plots by the next run in the dir. A failure is a warning in the run's log,
never a reason for the run to fail, as before.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import fusebench
from fusebench.app.tracking import job_identity, log_run, log_sweep
from fusebench.config.schema import LoggerConfig, WandbConfig
from fusebench.evaluation.record import RunRecord
from fusebench.report.plots import run_plots
from fusebench.runtime import run_lock
from fusebench.stores.files import file_sha256

log = logging.getLogger("fusebench.app.views")  # its name in the run's log, in the job or the views process
VIEWS_NICENESS = 19  # the views process yields a core to the jobs: plots are background work (docs/speed.md)
PIPE_BYTES = 1 << 20  # the requests' pipe: ~100 jobs' records queued without the job waiting (Linux's default cap)
LOCK_WAIT_S = 3600.0  # how long the views process waits for the job to release the run dir (a sweep job's whole life)
SCHEDULERS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "SUBMITIT_EXECUTOR")  # a batch job's markers


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
    argv: tuple[str, ...] = ()  # the command's argv (W&B records the program and its arguments)
    log_file: str | None = None  # the run's log (Hydra's RUN_DIR/JOB_NAME.log), where the views process writes


@dataclass(frozen=True)
class SweepViews:
    """What a sweep report's views need besides the report (sent beside it, pickled: the report its tables were
    written from): its plots, drawn after its tables, and its W&B summary run."""

    sweep_dir: str  # the sweep dir: its lock, held while they are made
    summary_sha256: str  # summary.md as the report wrote it: drawn only for that report
    logger: LoggerConfig | None
    argv: tuple[str, ...] = ()


def logs(logger: LoggerConfig) -> bool:
    """Whether ``logger`` logs anything (W&B, not disabled by ``logger.mode`` or ``$WANDB_MODE``)."""
    return isinstance(logger, WandbConfig) and (logger.mode or os.environ.get("WANDB_MODE")) != "disabled"


def make(job: ViewsJob, record: RunRecord) -> None:
    """The plots, then the logger (which logs the plots as images): a failure of either is a warning."""
    plots = []
    if job.plots:
        try:
            plots = run_plots(job.run_dir, record)
        except Exception as err:  # noqa: BLE001 - plots are a view of the outputs, never a reason to fail
            log.warning("could not draw plots: %s", err)
    log_run(job.logger, record, job.run_dir, plots, resolved=job.resolved, identity=(job.group, job.name))


def _run_log_file(run_dir: Path) -> str | None:
    """The file this job logs to inside ``run_dir`` (Hydra's job log), if any."""
    for handler in logging.getLogger().handlers:
        name = getattr(handler, "baseFilename", None)
        if name and Path(name).parent == run_dir.resolve():
            return name
    return None


def request(run_dir: str | Path, record: RunRecord, plots: bool, logger: LoggerConfig, resolved: dict | None) -> ViewsJob:
    """The views job of a run just written into ``run_dir`` (its metrics.json hashed now)."""
    group, name = job_identity()
    run_dir = Path(run_dir).resolve()
    return ViewsJob(run_dir=str(run_dir), metrics_sha256=file_sha256(run_dir / "metrics.json"), plots=plots,
                    logger=logger, resolved=resolved, group=group, name=name, argv=tuple(sys.argv),
                    log_file=_run_log_file(run_dir))


def in_terminal() -> bool:
    return any(stream is not None and hasattr(stream, "isatty") and stream.isatty()
               for stream in (sys.stdout, sys.stderr))


def must_wait() -> bool:
    """Whether the command must wait for its views process at its end (``background``): not in a terminal (a
    script, CI, a notebook), inside a batch scheduler's job (whose end kills what it started), as a container's
    first process or a child of it (``docker run``: the container ends with it), or in a launcher's worker
    process (``hydra/launcher=joblib``, submitit), which may be killed or reused once its job returns."""
    return (not in_terminal() or any(os.environ.get(v) for v in SCHEDULERS) or 1 in (os.getpid(), os.getppid())
            or in_worker())


COMMAND_PID = "FUSEBENCH_COMMAND_PID"  # the command's process, for the processes it starts (launcher workers)


def command_started() -> None:
    """The command's process is this one (the CLI calls it first): a job in another is a launcher's worker's."""
    os.environ[COMMAND_PID] = str(os.getpid())


def in_worker() -> bool:
    """Whether this process runs a job for a command in another process (``hydra/launcher=joblib``, submitit)."""
    return os.environ.get(COMMAND_PID, str(os.getpid())) != str(os.getpid())


def dispatch(mode: str, run_dir: str | Path, record: RunRecord, plots: bool, logger: LoggerConfig,
             resolved: dict | None) -> None:
    """Make the run's views where ``mode`` says (nothing to make: plots off and logger=none)."""
    if not plots and not logs(logger):
        return
    job = request(run_dir, record, plots, logger, resolved)
    if mode == "inline":
        make(job, record)
        return
    try:
        pid = _PROCESS.submit(job, record)
    except OSError as err:  # no process could be started (a full process table, no memory): made here instead
        log.warning("could not start the views process (%s); drawing the plots in the job instead", err)
        make(job, record)
        return
    run_lock.hand_to_views(run_dir, pid)  # a run taking the dir before the views process waits for it
    _PROCESS.wait_at_end |= mode == "wait" or must_wait()


def sweep_deferred(mode: str) -> bool:
    """Whether a sweep's report plots (and its W&B summary) go to the views process: only where the command will
    not wait for it (``background`` in a terminal). A command that waits draws them itself, beside the views
    process's last runs, which is sooner on the same cores."""
    return mode == "background" and not must_wait() and not _PROCESS.wait_at_end


def dispatch_sweep(report, logger: LoggerConfig | None) -> bool:
    """Hand a sweep report written without its plots (``report.sweep.write_report(plots=False)``) to the views
    process, which draws them and logs the summary run; False when no process could take it (the caller makes
    them itself)."""
    sweep_dir = Path(report.folder).resolve()
    job = SweepViews(sweep_dir=str(sweep_dir), summary_sha256=file_sha256(Path(report.out) / "summary.md"),
                     logger=logger, argv=tuple(sys.argv))
    try:
        pid = _PROCESS.submit(job, report)  # its runs pickled without their arrays
    except OSError as err:
        log.warning("could not start the views process (%s); drawing the sweep's plots here instead", err)
        return False
    run_lock.hand_to_views(sweep_dir, pid)
    return True


class _Views:
    """The views process of this process, fed (ViewsJob, RunRecord) pickles on its stdin, one per run."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.errors: Path | None = None  # its stderr (a start that failed says why there)
        self.wait_at_end = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        package_root = str(Path(fusebench.__file__).resolve().parent.parent)  # fusebench as this process imports it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                           if p)}
        fd, errors = tempfile.mkstemp(prefix="fusebench-views-", suffix=".log")
        self.errors = Path(errors)
        try:  # -P: the current folder is not searched first (a user's numpy.py there would hide numpy)
            self.proc = subprocess.Popen([sys.executable, "-P", "-m", "fusebench.app.views", errors],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=fd, env=env,
                                         start_new_session=True)  # a Ctrl-C at the terminal stops the command only
        finally:
            os.close(fd)
        _widen(self.proc.stdin)

    def submit(self, job: ViewsJob | SweepViews, record) -> int:
        """Send one run's views (or a sweep report's); the views process's pid."""
        data = pickle.dumps((job, record), protocol=pickle.HIGHEST_PROTOCOL)
        if not self.alive():
            self.start()
        if not self._send(data):  # it died (killed): a new one takes this job
            self.start()
            if not self._send(data):
                raise OSError(f"the views process ended as soon as it started ({self.why()})")
        return self.proc.pid

    def _send(self, data: bytes) -> bool:
        """``data`` written to the views process's stdin; False when it has ended."""
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return False
        return True

    def why(self) -> str:
        """The last line the views process wrote to its stderr."""
        try:
            lines = self.errors.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except (OSError, AttributeError):
            return "no message"
        return lines[-1] if lines else "no message"

    def close(self) -> None:
        """No more jobs: its stdin is closed (it ends once it has made what it was sent); waited for when a job asked
        (``wait_at_end``), and then a failed end is a warning."""
        proc, wait, self.proc, self.wait_at_end = self.proc, self.wait_at_end, None, False
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        if not wait:
            return
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            print(f"\nfusebench: interrupted; the run's results are written, and its plots and log are still being "
                  f"made by pid {proc.pid}", file=sys.stderr)
            raise SystemExit(130) from None
        if code != 0:
            print(f"fusebench: warning: the plots and log could not be made (the views process ended with {code}: "
                  f"{self.why()}); the runs' results are written", file=sys.stderr)
        if self.errors is not None:
            self.errors.unlink(missing_ok=True)


def _widen(pipe) -> None:
    """Let the pipe hold ``PIPE_BYTES`` of requests (Linux: 64 KB by default, a few records): a job hands its record
    over without waiting for the views process, which may still be drawing earlier jobs' plots; elsewhere the
    default stays."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


_PROCESS = _Views()


def finish() -> None:
    """The views process gets no more jobs; the command waits for it in ``wait`` mode or where it must
    (:func:`must_wait`). Call after the run dir locks are released (the views process takes them): as the command
    ends, and as each job ends in a launcher's worker process (``app.cli.run_job``)."""
    _PROCESS.close()


# The views process.

def _run_log(job: ViewsJob) -> logging.Handler | None:
    """Append this process's log lines to the run's log (Hydra's format), while its views are made."""
    if job.log_file is None:
        return None
    handler = logging.FileHandler(job.log_file, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


def serve(job: ViewsJob, record: RunRecord) -> None:
    """Make one run's views in this (the views) process: the run dir's lock, the record checked, then ``make``."""
    run_dir = Path(job.run_dir)
    if not (run_dir / "metrics.json").is_file():  # removed since (or never written): nothing of it to draw
        return
    try:
        run_lock.hold(run_dir, wait=LOCK_WAIT_S)
    except Exception as err:  # noqa: BLE001 - never taken: the dir is another run's now; nothing of it is touched
        print(f"no plots or log made for {run_dir}: {err}", file=sys.stderr, flush=True)
        return
    handler, argv = _run_log(job), sys.argv[:]
    try:
        metrics = run_dir / "metrics.json"
        if not metrics.is_file() or file_sha256(metrics) != job.metrics_sha256:
            log.warning("no plots drawn and no log made: %s is no longer the record this run wrote (another run "
                        "took the dir)", metrics)
            return
        sys.argv[:] = list(job.argv) or argv  # W&B records the command's program and arguments
        make(job, record)
    except Exception as err:  # noqa: BLE001 - a view never fails a run; the run's log says why it is missing
        log.warning("could not make the plots or the log of %s: %s", run_dir, err, exc_info=True)
    finally:
        sys.argv[:] = argv
        run_lock.release(run_dir)
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


def make_sweep(job: SweepViews, report) -> None:
    """A sweep report's plots, then its W&B summary run (which logs them): each failure a warning."""
    from fusebench.report.sweep import write_report_plots  # lazy: heavy (scipy); only a sweep's views need it

    try:
        write_report_plots(report)
    except Exception as err:  # noqa: BLE001 - the tables are the record; plots are a view
        log.warning("could not draw the sweep's plots in %s: %s (fusebench-report %s draws them)", report.out, err,
                    job.sweep_dir)
    log_sweep(job.logger, report.folder, report)  # the sweep dir as the command had it (W&B's config and group)


class _Failures(logging.StreamHandler):
    """This process's warnings to its stderr (the errors file), noting that there were some: a sweep has no log of
    its own, so the file is kept for the user (``main``)."""

    seen = False

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            _Failures.seen = True
            super().emit(record)


def _failed(message: str) -> None:
    _Failures.seen = True
    print(message, file=sys.stderr, flush=True)


def serve_sweep(job: SweepViews, report) -> None:
    """Make a sweep report's views in this process: the sweep dir's lock, its summary.md checked, then
    ``make_sweep``; what fails is written to this process's errors file, kept (the command named it)."""
    handler = _Failures(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        _serve_sweep(job, report)
    finally:
        logging.getLogger().removeHandler(handler)


def _serve_sweep(job: SweepViews, report) -> None:
    sweep_dir, summary = Path(job.sweep_dir), Path(report.out) / "summary.md"
    if not summary.is_file():  # removed or moved since: nothing of it to draw (and no lock file left in a folder
        _failed(f"no sweep plots drawn: {summary} is gone")  # made again)
        return
    try:
        run_lock.hold(sweep_dir, key="hydra.sweep.dir", wait=LOCK_WAIT_S)
    except Exception as err:  # noqa: BLE001 - never taken: the dir is another sweep's now
        _failed(f"no sweep plots or log made for {sweep_dir}: {err}")
        return
    argv = sys.argv[:]
    try:
        if not summary.is_file() or file_sha256(summary) != job.summary_sha256:
            _failed(f"no sweep plots drawn: {summary} is no longer the report this sweep wrote")
            return
        sys.argv[:] = list(job.argv) or argv
        make_sweep(job, report)
    except Exception as err:  # noqa: BLE001 - a view never fails a sweep
        _failed(f"could not make the sweep's plots or log in {sweep_dir}: {err}")
    finally:
        sys.argv[:] = argv
        run_lock.release(sweep_dir)


def _stop(signum, _frame):
    raise SystemExit(128 + signum)  # a plot being written removes its temp file on the way out


def _yield_to_jobs() -> None:
    """Lower this process's priority: a job's parallel steps (torch's and numba's threads, one per core) wait for
    their slowest thread, so plots drawn on a core they use slowed a sweep's fusion up to 10x (docs/speed.md). At
    the lowest priority the views take only the time the jobs leave idle, and all of it once the command waits for
    them. Linux shares the CPU between sessions first (autogroups), so the session's priority is lowered too
    (``/proc/self/autogroup``), only where this process leads its own session (as the command starts it: never a
    terminal's session). Linux takes one such change every 0.1 s from a process without CAP_SYS_ADMIN: tried
    again a few times. Where either is missing this does nothing."""
    if hasattr(os, "nice"):
        try:
            os.nice(VIEWS_NICENESS)
        except OSError:
            pass
    if not hasattr(os, "getsid") or os.getsid(0) != os.getpid():
        return
    for _ in range(5):
        try:
            Path("/proc/self/autogroup").write_text(str(VIEWS_NICENESS))
            return
        except BlockingIOError:  # EAGAIN: another autogroup changed in the last 0.1 s
            time.sleep(0.11)
        except OSError:
            return


def errors_file() -> Path | None:
    """Where this command's views process writes what went wrong (kept after it ends when anything did)."""
    return _PROCESS.errors


def main() -> None:
    """``python -m fusebench.app.views ERRORS``: make the views of each run sent on stdin (a pickled
    (ViewsJob, RunRecord) each; a sweep report's: (SweepViews, SweepSummary)), in order, until stdin closes;
    ERRORS (its stderr) is removed at a clean end, unless a sweep's views failed (a sweep has no log of its own)."""
    errors = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    sys.argv[:] = [run_lock.VIEWS_COMMAND]  # how this process names itself in a run dir's lock (run_lock.describe)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    _yield_to_jobs()
    logging.getLogger().setLevel(logging.INFO)
    while True:
        try:
            job, record = pickle.load(sys.stdin.buffer)
        except EOFError:
            break
        except Exception:  # noqa: BLE001 - cut short (the command was killed mid-send): nothing more to make
            break
        (serve_sweep if isinstance(job, SweepViews) else serve)(job, record)
    if errors is not None and not _Failures.seen:  # a sweep's failure stays there (the command named the file)
        errors.unlink(missing_ok=True)


if __name__ == "__main__":
    from fusebench.app import views  # the module by its name, not __main__: the classes the requests were pickled as

    views.main()
