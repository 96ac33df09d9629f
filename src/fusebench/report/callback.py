"""Hydra callback: at the end of a multirun, write the sweep report (and log it to W&B when enabled).

``SweepReport.failed`` holds the job dirs that did not finish (or whose outputs are damaged), so that the
``fusebench`` command can exit non-zero and name them."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReport(Callback):
    failed: list[str] | None = None  # set at the end of each multirun in this process

    def __init__(self, draws: int = 2000, seed: int = 0, level: float = 0.95):
        self.draws, self.seed, self.level = draws, seed, level

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        folder = Path(config.hydra.sweep.dir)
        from fusebench.report import background

        background.finish()  # the last jobs' plots, drawn while the sweep went on
        try:
            from fusebench.report.sweep import write_report

            report = write_report(folder, draws=self.draws, seed=self.seed, level=self.level)
            SweepReport.failed = sorted(report["failed"])
            log.info("sweep report: %s (%d runs, %d failed)", folder / "summary.md", len(report["runs"]),
                     len(report["failed"]))
            if report["failed"]:
                log.error("failed jobs (see error.txt in each): %s", ", ".join(report["failed"]))
            from omegaconf import OmegaConf

            from fusebench.tracking import log_sweep

            log_sweep(OmegaConf.to_container(config.logger, resolve=True) if "logger" in config else None, folder, report)
        except Exception as err:  # noqa: BLE001 - a report failure must never fail the sweep
            from fusebench.report.runs import scan_runs

            SweepReport.failed = sorted(scan_runs(folder).failed) if folder.is_dir() else []
            log.error("could not write the sweep report for %s: %s (run fusebench-report %s)", folder, err, folder)
