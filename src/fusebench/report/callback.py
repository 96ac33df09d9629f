"""Hydra callback of every fusebench run: before Hydra creates the run or sweep dir, check it (``rundir``) and
read an earlier run's ``.hydra`` files, which Hydra is about to rewrite; at the end of a multirun, write the
sweep report (and log it to W&B when enabled).

``SweepReport.failed`` holds the job dirs that did not finish (or whose outputs are damaged), and the jobs
that failed in this process (``jobs_failed``: a failed job may keep an earlier run's outputs), so that the
``fusebench`` command can exit non-zero and name them."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class RunDirRefused(BaseException):
    """A run or sweep dir refused before Hydra touched it. A BaseException, not an Exception: Hydra's callback
    runner turns an Exception into a warning and carries on; this one reaches ``cli.main`` (exit 2)."""


def _check_dir(config: DictConfig, key: str) -> Path | None:
    """The run or sweep dir (``key``), refused with ``RunDirRefused`` when ``rundir.check_dir`` refuses it;
    None when only Hydra can resolve it now (Hydra then reports what is wrong)."""
    from omegaconf import OmegaConf

    from fusebench import FusebenchError, rundir

    try:
        value = OmegaConf.select(config, key)
        folders = [OmegaConf.select(config, k, default=None) for k in ("paths.output_dir", "embed.cache.dir")]
    except Exception:  # noqa: BLE001 - e.g. an interpolation of hydra:runtime, set later by Hydra
        return None
    cwd = Path.cwd().resolve()
    inside = [Path(f).resolve() for f in folders if isinstance(f, str) and f.strip()]
    own = tuple(f.relative_to(cwd).parts[0] for f in inside if f != cwd and f.is_relative_to(cwd))
    try:
        return rundir.check_dir(value, key, own)
    except FusebenchError as err:
        raise RunDirRefused(str(err)) from None


class SweepReport(Callback):
    failed: list[str] | None = None  # set at the end of each multirun in this process
    jobs_failed: list[str] = []  # job dirs (relative to the sweep dir) whose job raised, this multirun

    def __init__(self, draws: int = 2000, seed: int = 0, level: float = 0.95):
        self.draws, self.seed, self.level = draws, seed, level

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from fusebench import rundir

        folder = _check_dir(config, "hydra.run.dir")
        if folder is not None:
            rundir.keep_earlier_config(folder, config.hydra.output_subdir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from fusebench import rundir

        SweepReport.jobs_failed = []
        folder = _check_dir(config, "hydra.sweep.dir")
        if folder is not None:
            for metrics in folder.rglob("metrics.json"):  # the job dirs of an earlier sweep into this dir
                rundir.keep_earlier_config(metrics.parent, config.hydra.output_subdir)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        folder = Path(config.hydra.sweep.dir)
        from fusebench.report import background

        background.finish()  # the last jobs' plots, drawn while the sweep went on
        try:
            from fusebench.report.sweep import write_report

            report = write_report(folder, draws=self.draws, seed=self.seed, level=self.level)
            SweepReport.failed = sorted({*report["failed"], *SweepReport.jobs_failed})
            log.info("sweep report: %s (%d runs, %d failed)", folder / "summary.md", len(report["runs"]),
                     len(report["failed"]))
            if report["failed"]:
                log.error("failed jobs (see error.txt in each): %s", ", ".join(report["failed"]))
            from omegaconf import OmegaConf

            from fusebench.tracking import log_sweep

            log_sweep(OmegaConf.to_container(config.logger, resolve=True) if "logger" in config else None, folder, report)
        except Exception as err:  # noqa: BLE001 - a report failure must never fail the sweep
            from fusebench.report.runs import scan_runs

            SweepReport.failed = sorted({*(scan_runs(folder).failed if folder.is_dir() else []),
                                         *SweepReport.jobs_failed})
            log.error("could not write the sweep report for %s: %s (run fusebench-report %s)", folder, err, folder)
