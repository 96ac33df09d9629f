"""Hydra's basic sweeper, composing each job's config once instead of twice (``hydra/sweeper: fusebench``,
fusebench's default). Hydra takes plugins only from the ``hydra_plugins`` package, hence this module's place.

Hydra's ``BasicSweeper`` composes every job of a batch up front, to refuse a bad override before any job runs,
and then the launcher composes each job again when it starts it. A composition of fusebench's configs
(defaults tree, schemas, merges) takes ~0.13 s on a 2-core CPU (Hydra's own debug log: 10 jobs validated in
1.27 s), so a 30-job sweep spent ~4 s composing configs it already had. With the basic launcher (jobs in this
process, one after the other) this sweeper keeps the configs it validated and hands each to the launcher when
that job starts; everything else (validation first, batches, job numbers, the launcher's own steps) is Hydra's.
Other launchers (joblib, submitit) compose in their own processes, so they get Hydra's sweeper unchanged. The
configs kept belong to the sweeper (Hydra makes one per multirun), for the batch being run; measured, this saves
~6% of a 30-job sweep's time (scripts/bench_sweep.py).

While validating a batch it also works out each job's dir (hydra.sweep.dir / hydra.sweep.subdir, as the launcher
will) and refuses the sweep before any job of the batch runs when one lies outside the sweep dir, when two jobs
of the sweep share one (they would overwrite each other's results), or when one holds another Hydra app's
.hydra folder (``fusebench.app.rundir.check_job_dir``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write


class ComposedConfigs:
    """A Hydra config loader that hands out, once each, the job configs composed while validating a batch
    (in the order they were composed for equal overrides); it composes anything else as Hydra's does."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.kept: dict[tuple[str, ...], list[DictConfig]] = {}

    def __getattr__(self, name: str) -> Any:  # every other method of Hydra's loader
        return getattr(self.loader, name)

    def compose_and_keep(self, master_config: DictConfig, overrides: Sequence[str]) -> DictConfig:
        config = self.loader.load_sweep_config(master_config, list(overrides))
        self.kept.setdefault(tuple(overrides), []).append(config)
        return config

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        kept = self.kept.get(tuple(sweep_overrides))
        if kept:
            return kept.pop(0)
        return self.loader.load_sweep_config(master_config, sweep_overrides)


def check_job_dirs(configs: Sequence[DictConfig], first_job: int, taken: dict[str, int]) -> dict[int, tuple]:
    """Each job's dir, as Hydra's ``run_job`` will make it (job number ``first_job`` + i, set as the launcher sets
    it), checked by ``rundir.check_job_dir`` (``taken``: the job dirs of the sweep so far, updated). Raises
    ``RunDirRefused`` (the ``fusebench`` command's exit 2) before any job of the batch runs. Returns job number
    -> (sweep dir, job dir) of each job checked."""
    from fusebench import FusebenchError
    from fusebench.app import rundir
    from fusebench.app.callback import RunDirRefused

    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    dirs = {}
    try:
        for i, config in enumerate(configs):
            job = first_job + i
            if not isinstance(config, DictConfig) or "hydra" not in config:  # not a Hydra job's config
                continue
            readonly = config.hydra._get_node_flag("readonly")
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.job.id = job
                config.hydra.job.num = job
            try:
                hydra_config.set_config(config)  # for ${hydra:...} in the dir, as run_job resolves it
                sweep_dir = OmegaConf.select(config, "hydra.sweep.dir")
                subdir = OmegaConf.select(config, "hydra.sweep.subdir")
                output_subdir = OmegaConf.select(config, "hydra.output_subdir")
            finally:
                OmegaConf.set_readonly(config.hydra, readonly)  # as composed: the launcher sets the job's number
            dirs[job] = (sweep_dir, rundir.check_job_dir(sweep_dir, subdir, job, taken, output_subdir))
    except FusebenchError as err:
        raise RunDirRefused(str(err)) from None
    finally:
        hydra_config.cfg = before
    return dirs


def record_jobs(jobs: list[dict], batch: Sequence[Sequence[str]], first_job: int, dirs: dict[int, tuple]) -> None:
    """Add a batch's jobs to ``jobs`` and write the sweep's multirun_jobs.json (``report.runs.write_jobs``), so
    that a report names a job whose dir is gone; a file of that name that is not fusebench's is left alone."""
    import logging
    import os

    from fusebench.report.runs import JOBS_FILE, write_jobs

    sweep_dir = None
    for i, overrides in enumerate(batch):
        if first_job + i not in dirs:
            continue
        sweep_dir, path = dirs[first_job + i]
        base = os.path.normpath(os.path.abspath(str(sweep_dir)))
        jobs.append({"job": first_job + i, "dir": os.path.relpath(path, base), "overrides": list(overrides)})
    if sweep_dir is None:
        return
    if first_job > 0:  # the jobs of earlier batches that failed (report.runs.mark_failed) stay marked
        from fusebench.report.runs import read_jobs

        failed = {j["dir"] for j in read_jobs(Path(str(sweep_dir)) / JOBS_FILE) or [] if j.get("failed") is True}
        for job in jobs:
            if job["dir"] in failed:
                job["failed"] = True
    try:
        if not write_jobs(sweep_dir, jobs):
            logging.getLogger(__name__).warning("%s in the sweep dir is not fusebench's: left as it is (a report "
                                                "cannot then name a job whose dir is gone)", JOBS_FILE)
    except OSError as err:  # the sweep dir's own writes fail the same way, and say so
        logging.getLogger(__name__).warning("could not write %s: %s", JOBS_FILE, err)


class ComposeOnceSweeper(BasicSweeper):
    composed: ComposedConfigs | None = None
    next_job: int = 0  # the number of the first job of the next batch
    job_dirs: dict[str, int] | None = None  # job dir -> job number, every batch of the sweep so far
    jobs: list[dict] | None = None  # every job of the sweep so far: number, dir, overrides (multirun_jobs.json)

    def setup(self, *, hydra_context: HydraContext, task_function: Any, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        if type(self.launcher) is BasicLauncher:  # a subclass or another launcher may compose elsewhere
            self.composed = ComposedConfigs(hydra_context.config_loader)
            self.launcher.hydra_context = HydraContext(config_loader=self.composed,
                                                       callbacks=hydra_context.callbacks)

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's sweep; when it is refused before its first job starts (a job's config, its dir), the sweep
        dir is left as it was: Hydra's multirun.yaml, written first, is put back (an earlier sweep's record) or
        removed, and a sweep dir this sweep created is removed when it is left empty."""
        from fusebench.app import rundir

        folder = Path(str(self.config.hydra.sweep.dir))
        existed, record = folder.exists() and not rundir.created_here(folder), folder / "multirun.yaml"
        earlier = record.read_bytes() if record.is_file() else None
        try:
            return super().sweep(arguments)
        except BaseException:
            if self.next_job == 0:  # no job ran: nothing of this sweep stays
                try:
                    if earlier is not None:
                        record.write_bytes(earlier)
                    else:
                        record.unlink(missing_ok=True)
                    if rundir.lock_made_here(folder):
                        rundir.drop_lock(folder)  # the sweep dir's lock, taken when the sweep started
                    if not existed and folder.is_dir() and not any(folder.iterdir()):
                        folder.rmdir()
                        rundir.remove_created_parents(folder)
                except OSError:
                    pass
            raise

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if self.job_dirs is None:
            self.job_dirs, self.jobs = {}, []
        if self.composed is None:  # composed again in the launcher's processes: these are only checked
            loader = self.hydra_context.config_loader
            configs = [loader.load_sweep_config(self.config, list(overrides)) for overrides in batch]
        else:
            self.composed.kept.clear()  # a batch's configs are used by that batch only
            configs = [self.composed.compose_and_keep(self.config, overrides) for overrides in batch]
        dirs = check_job_dirs(configs, self.next_job, self.job_dirs)
        record_jobs(self.jobs, batch, self.next_job, dirs)
        self.next_job += len(batch)
