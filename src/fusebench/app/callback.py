"""Hydra callback of every fusebench run: before Hydra creates the run or sweep dir, check it (``rundir``), the
folders it lies under (``paths.*``), and for a sweep its job dir pattern (``hydra.sweep.subdir``) and that it has
jobs at all; read an earlier run's ``.hydra`` files, which Hydra is about to rewrite; at the end of a multirun,
write the sweep report (and log it to W&B when enabled; in a terminal whose command will not wait for its views
process, that process draws the report's plots and logs it: ``app.views.sweep_deferred``), or for
``fusebench-embed`` (``SweepReport.kind``) the shard summary (``fusebench.app.embed_cli.sweep_summary``), or for
slice jobs (``gallery.slice=...``) the slice summary (``fusebench.app.slice_job.slice_summary``).

The report never replaces a file fusebench did not write (``fusebench.report.report_files``): a sweep dir that
holds one is refused before any job runs (exit 2); one put there while the jobs ran leaves the jobs' results as
they are, and the sweep ends with exit 2 and one line naming the file and the ``fusebench-report`` command that
writes the report. Any other failure of the report is logged and never fails the sweep.

``SweepReport.failed`` holds the job dirs that did not finish (or whose outputs are damaged), and the jobs
that failed in this process (``jobs_failed``: a failed job may keep an earlier run's outputs), so that the
``fusebench`` command can exit non-zero and name them."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fusebench import FusebenchError
from fusebench.app import rundir
from fusebench.app.run_config import views_choice
from fusebench.app.tracking import log_sweep
from fusebench.config.run import logger_config
from fusebench.config.schema import check_draws
from fusebench.report.report_files import ReportBlocked, check
from fusebench.runtime import run_lock

log = logging.getLogger(__name__)


class RunDirRefused(BaseException):
    """A run or sweep dir refused before Hydra touched it. A BaseException, not an Exception: Hydra's callback
    runner turns an Exception into a warning and carries on; this one reaches ``cli.main`` (exit 2)."""


def _check_dir(config: DictConfig, key: str) -> Path | None:
    """The run or sweep dir (``key``), refused with ``RunDirRefused`` when ``rundir.check_dir`` refuses it (another
    live run holding it too: its lock, taken here for this run's or sweep's life, ``runtime.run_lock``); None when
    only Hydra can resolve it now (Hydra then reports what is wrong; the job takes the lock when it starts)."""

    try:
        value = OmegaConf.select(config, key)
    except Exception:  # noqa: BLE001 - e.g. an interpolation of hydra:runtime, set later by Hydra
        return None
    folders = [_value(config, k) for k in ("paths.output_dir", "embed.cache.dir")]
    cwd = Path.cwd().resolve()
    inside = [Path(f).resolve() for f in folders if isinstance(f, str) and f.strip()]
    own = tuple(f.relative_to(cwd).parts[0] for f in inside if f != cwd and f.is_relative_to(cwd))
    try:
        return rundir.check_dir(value, key, own, subdir=_value(config, "hydra.output_subdir"), hold=True)
    except FusebenchError as err:
        raise RunDirRefused(str(err)) from None


def _value(config: DictConfig, key: str):
    """``key``'s value, or None when it cannot be resolved now (its own check reports it when it is used)."""
    try:
        return OmegaConf.select(config, key, default=None)
    except Exception:  # noqa: BLE001
        return None


# the folders every path of a run lies under: an empty one (a variable set to nothing) puts them at the root
ROOTS = {"paths.output_dir": ("FUSEBENCH_OUTPUT", "the outputs and the embedding cache would be written at the "
                              "filesystem root (/runs/..., /cache/...)"),
         "paths.data_root": ("FUSEBENCH_DATA", "the datasets would be read from the filesystem root (/coco/...)")}


def _check_roots(config: DictConfig) -> None:
    """Refuse an empty paths.output_dir or paths.data_root before Hydra creates anything under it."""
    for key, (variable, consequence) in ROOTS.items():
        value = _value(config, key)
        if isinstance(value, str) and not value.strip():
            raise RunDirRefused(f"{key} is empty ({variable} set to nothing, or {key}= given), so {consequence}; "
                                f"unset {variable} or set it to a folder, or give {key}=FOLDER.")


def _check_subdir(config: DictConfig) -> None:
    """Refuse a job dir pattern (hydra.sweep.subdir, as written) that does not give each job a folder of its own
    inside the sweep dir (``rundir.check_subdir``)."""

    try:
        raw = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir")
    except Exception:  # noqa: BLE001 - no hydra.sweep: Hydra reports it
        return
    try:
        rundir.check_subdir(raw)
    except FusebenchError as err:
        raise RunDirRefused(str(err)) from None


def empty_sweeps(config: DictConfig) -> list[str]:
    """The sweep overrides (hydra.sweeper.params, then the command line's) that give no value at all (a glob
    that matches nothing, an empty range), each with what it could have matched; parsed with Hydra's grammar
    and config loader (an override Hydra cannot parse is left for Hydra to report)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    params = _value(config, "hydra.sweeper.params")
    lines = [f"{k}={v}" for k, v in (params.items() if params else [])]
    try:
        lines += list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
        overrides = OverridesParser.create(config_loader=loader).parse_overrides(lines)
    except Exception:  # noqa: BLE001
        return []
    empty = []
    for override in overrides:
        if not override.is_sweep_override():
            continue
        try:
            values = list(override.sweep_string_iterator() if override.is_discrete_sweep()
                          else override.sweep_iterator())
        except Exception:  # noqa: BLE001 - Hydra reports it
            continue
        if not values:
            group = override.key_or_group
            try:
                options = loader.get_group_options(group) if loader is not None else []
            except Exception:  # noqa: BLE001 - not a config group: nothing to list
                options = []
            line = override.input_line or f"{override.get_key_element()}={override.value()}"
            empty.append(f"{line} matches nothing" + (f" ({group}'s options: {', '.join(options)})" if options else ""))
    return empty


def _slice_sweep(config: DictConfig) -> bool:
    """True for a multirun of slice jobs (``gallery.slice=...`` among its overrides): no job writes metrics."""
    overrides = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
    return any(str(o).lstrip("+~").startswith("gallery.slice=") for o in overrides)


def _check_jobs(config: DictConfig) -> None:
    """Refuse a sweep without jobs (an override of it gives no value) before anything is created."""
    empty = empty_sweeps(config)
    if empty:
        raise RunDirRefused(f"the sweep has no jobs: {'; '.join(empty)}. Fix the pattern, or give the values "
                            "(a,b or choice(a,b)).")


def job_started(out_dir: str, sweep_dir: str, job: int, output_subdir: str | None) -> None:
    """A sweep job starts in ``out_dir`` (Hydra has created it and written its .hydra files): refused when the
    dir does not lie inside the sweep dir, or when a job of this sweep in this process already wrote it (its
    .hydra files, which Hydra has just overwritten, are put back); its dir's lock is taken for the job's life, and
    another live run holding it is refused (``runtime.run_lock``). A backstop: the sweep's job dir pattern is
    checked when it starts, and every job's dir before any job runs (fusebench's sweeper)."""

    path, base = os.path.normpath(os.path.abspath(out_dir)), os.path.normpath(os.path.abspath(sweep_dir))
    earlier = SweepReport.job_dirs.get(path)
    if earlier is not None:
        num, kept = earlier
        if output_subdir and kept is not None:
            try:
                rundir.put_back_hydra_files(Path(path, output_subdir), kept)
            except OSError:
                pass
        raise RunDirRefused(f"hydra.sweep.subdir gives job {job} the dir {path}, which job {num} of this sweep "
                            "already wrote: the jobs would overwrite each other's results, so the sweep stops here; "
                            "make it differ per job, e.g. hydra.sweep.subdir='${hydra.job.num}' (the default).")
    if path == base or not Path(path).is_relative_to(base):
        raise RunDirRefused(f"hydra.sweep.subdir gives job {job} the dir {path}, not a folder inside the sweep dir "
                            f"{base}; use a relative path that differs per job, e.g. "
                            "hydra.sweep.subdir='${hydra.job.num}' (the default).")

    if run_lock.task_share()[0] > 0:  # a later task of a multi-task job: its task 0 holds the job dir for all
        return
    try:  # held for the job's life (job_ended releases it): another live run in it (started by hand) stops the sweep
        run_lock.hold(path, "hydra.sweep.dir", what=f"job dir (job {job})")
    except FusebenchError as err:
        raise RunDirRefused(str(err)) from None


def job_ended(out_dir: str, job: int, output_subdir: str | None) -> None:
    """A sweep job in ``out_dir`` ended (finished or failed): no later job of this sweep may write there; its dir's
    lock is released."""

    path = os.path.normpath(os.path.abspath(out_dir))
    run_lock.release(path)
    try:
        kept = rundir.read_hydra_files(Path(path, output_subdir)) if output_subdir else None
    except OSError:
        kept = None
    SweepReport.job_dirs[path] = (job, kept)


def _without_failed_jobs(folder: Path, failed: list[str]):
    """The sweep dir's runs, less the job dirs whose job failed in this process (their dirs may still hold an
    earlier run's results, which are not this sweep's: listed as failed, whatever multirun_jobs.json says)."""
    from fusebench.report.runs import Scan, scan_runs  # lazy: heavy (numpy); Hydra imports the callback at start

    scan = scan_runs(folder)
    gone = {(folder / d).resolve(): d for d in failed}
    held = [r for r in scan.runs if r.path.resolve() in gone]
    reasons = {**scan.failed, **{gone[r.path.resolve()]: "the sweep's job failed; its dir still holds an earlier "
                                 "run's results, not reported" for r in held}}
    return Scan([r for r in scan.runs if r not in held], reasons, damaged=[d for d in scan.damaged if d not in failed])


def _check_report_files(folder: Path) -> None:
    """Refuse a sweep (before any job runs) whose report would replace a file in its sweep dir that fusebench did
    not write (``report_files.check``: a user's summary.md, gains.csv, plots/...)."""

    try:
        check(folder)
    except ReportBlocked as err:
        raise RunDirRefused(f"the sweep dir {folder} holds what the sweep's report would replace: {err}; move it "
                            "away, or choose another hydra.sweep.dir=...") from None


def views_module():
    from fusebench.app import views  # lazy: heavy (the record, the plots' registry); Hydra imports the callback

    return views


def _views_deferred(config: DictConfig) -> bool:
    """Whether the sweep report's plots go to the views process (``views.sweep_deferred``: a terminal's command
    that will not wait for it)."""
    try:
        mode = views_choice(_value(config, "views"))  # $FUSEBENCH_VIEWS set but empty: unset, as for the jobs
    except Exception:  # noqa: BLE001 - a bad value: each job refused it already
        return False
    return views_module().sweep_deferred(mode)


class SweepReport(Callback):
    failed: list[str] | None = None  # set at the end of each multirun in this process
    jobs_failed: list[str] = []  # job dirs (relative to the sweep dir) whose job raised, this multirun
    job_dirs: dict[str, tuple[int, dict | None]] = {}  # job dir -> (its job, its .hydra files), this multirun
    kind: str = "run"  # what the command's jobs are: "run" (fusebench: metrics) | "embed" (fusebench-embed: shards)
    sweep_dir: Path | None = None  # the sweep dir of the multirun this process started last

    def __init__(self, draws: int = 2000, seed: int = 0, level: float = 0.95):
        self.draws, self.seed, self.level = draws, seed, level
        self.bad_draws = None  # a report with unbounded draws would never end: refused when the sweep ends
        try:
            check_draws(draws, "eval.bootstrap.draws")
        except Exception as err:  # noqa: BLE001 - each job refuses the same value on its own, in one line
            self.bad_draws = str(err)

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        _check_roots(config)
        given = _value(config, "hydra.run.dir")
        if isinstance(given, str) and given.strip():
            rundir.note_if_fresh(given)  # before its check creates it: a refused config then leaves no run dir
        folder = _check_dir(config, "hydra.run.dir")
        if folder is not None:
            rundir.keep_earlier_config(folder, config.hydra.output_subdir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        SweepReport.jobs_failed = []
        SweepReport.job_dirs = {}
        _check_roots(config)
        if self.bad_draws and SweepReport.kind == "run":  # before any job: its report could not end
            raise RunDirRefused(self.bad_draws)
        _check_subdir(config)
        _check_jobs(config)
        given = _value(config, "hydra.sweep.dir")
        if isinstance(given, str) and given.strip():
            rundir.note_if_fresh(given)  # before its check creates it (a sweep refused at once leaves none)
        folder = SweepReport.sweep_dir = _check_dir(config, "hydra.sweep.dir")
        if folder is not None:
            if SweepReport.kind == "run":
                try:
                    _check_report_files(folder)
                except RunDirRefused:  # refused before any job: the dir as it was, without the lock file made here
                    if rundir.lock_made_here(folder):
                        rundir.drop_lock(folder)
                    raise
            for metrics in folder.rglob("metrics.json"):  # the job dirs of an earlier sweep into this dir
                rundir.keep_earlier_config(metrics.parent, config.hydra.output_subdir)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from fusebench.report.runs import scan_runs  # lazy: heavy (numpy); Hydra imports the callback at start
        folder = Path(config.hydra.sweep.dir)
        if SweepReport.kind == "embed":  # shards in the cache, not metrics: the jobs' shard.json files
            from fusebench.app.embed_cli import sweep_summary  # lazy: heavy (numpy); Hydra imports the callback at start

            SweepReport.failed = sorted({*sweep_summary(folder), *SweepReport.jobs_failed})
            return
        if _slice_sweep(config):  # slices in the slice store, not metrics: the jobs' slice.json files
            from fusebench.app.slice_job import slice_summary  # lazy: heavy (torch); Hydra imports the callback at start

            SweepReport.failed = sorted({*slice_summary(folder), *SweepReport.jobs_failed})
            return

        try:
            from fusebench.report.sweep import write_report, write_report_plots  # lazy: heavy (scipy)

            deferred = _views_deferred(config)
            try:
                report = write_report(folder, draws=self.draws, seed=self.seed, level=self.level,
                                      scan=_without_failed_jobs(folder, SweepReport.jobs_failed), plots=not deferred)
            except ReportBlocked as err:  # a file put there while the jobs ran: they are finished, kept
                SweepReport.failed = sorted({*scan_runs(folder).failed, *SweepReport.jobs_failed})
                failed = f"; {len(SweepReport.failed)} job(s) failed: {', '.join(SweepReport.failed)}" \
                    if SweepReport.failed else ""
                message = (f"the sweep's jobs ended (their results are kept in {folder}{failed}), but its report was "
                           f"not written: {err}. Write it into another folder with fusebench-report {folder} --out "
                           f"FOLDER, or move the file away and run fusebench-report {folder}")
                raise RunDirRefused(message) from None  # cli.main: exit 2, this one line
            SweepReport.failed = sorted({*report.not_reported, *SweepReport.jobs_failed})
            log.info("sweep report: %s (%d runs, %d failed%s)", folder / "summary.md", len(report.runs),
                     len(report.failed), f", {len(report.damaged)} damaged" if report.damaged else "")
            if report.failed:
                log.error("failed jobs (see error.txt in each): %s", ", ".join(report.failed))
            if report.damaged:
                log.error("damaged runs (their files changed since they finished; summary.md says which): %s",
                          ", ".join(report.damaged))

            logger = logger_config(OmegaConf.to_container(config.logger, resolve=True)) if "logger" in config else None
            if deferred and views_module().dispatch_sweep(report, logger):
                log.info("the sweep's plots%s are being made by the views process (what fails is written to %s)",
                         " and W&B summary" if logger and views_module().logs(logger) else "",
                         views_module().errors_file())
                return
            if deferred:  # no views process could take them: drawn here
                write_report_plots(report)
            log_sweep(logger, folder, report)
        except Exception as err:  # noqa: BLE001 - a report failure must never fail the sweep
            SweepReport.failed = sorted({*(scan_runs(folder).failed if folder.is_dir() else []),
                                         *SweepReport.jobs_failed})
            log.error("could not write the sweep report for %s: %s (run fusebench-report %s)", folder, err, folder)
