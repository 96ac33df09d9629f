"""Hydra's basic sweeper, composing each job's config once instead of twice (``hydra/sweeper: fusebench``,
fusebench's default). Hydra takes plugins only from the ``hydra_plugins`` package, hence this module's place.
It is written on Hydra's public plugin API alone (``hydra.plugins.sweeper.Sweeper``, ``hydra.core``: the override
parser, the plugin loader, the config store; the ``ConfigLoader`` a ``HydraContext`` carries), so that a Hydra
release that reshapes its own internals (``BasicSweeper``, ``BasicLauncher``) cannot change it.

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

With the basic launcher, each job's start prints one line to stderr (``fusebench.runtime.progress.sweep_line``):
job i/n, the overrides that vary across the sweep, the time elapsed and an estimate of the sweep's time left from
the jobs finished so far; ``TQDM_DISABLE`` turns it off with the bars.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fusebench import FusebenchError
from fusebench.app import rundir
from fusebench.app.callback import RunDirRefused
from fusebench.runtime import progress, state


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


def _fuses_whole_rankings(config: Any) -> bool:
    """A job config that fuses whole rankings (``fusebench.app.pipeline.fuses_whole_rankings``, read untyped)."""
    return (isinstance(config, DictConfig) and OmegaConf.select(config, "fusion.top_k", default=0) is None
            and OmegaConf.select(config, "fusion.method", default="none") != "none")


def check_job_dirs(configs: Sequence[DictConfig], first_job: int, taken: dict[str, int]) -> dict[int, tuple]:
    """Each job's dir, as Hydra's ``run_job`` will make it (job number ``first_job`` + i, set as the launcher sets
    it), checked by ``rundir.check_job_dir`` (``taken``: the job dirs of the sweep so far, updated). Raises
    ``RunDirRefused`` (the ``fusebench`` command's exit 2) before any job of the batch runs. Returns job number
    -> (sweep dir, job dir) of each job checked."""

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
    import os

    from fusebench.report.runs import JOBS_FILE, read_jobs, write_jobs  # lazy: heavy (numpy); Hydra imports every plugin at start


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


def job_batches(overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
    """The jobs of a sweep, as Hydra's basic sweeper makes them: the cartesian product of each key's values (a
    key given twice keeps its last values, in its first place), in batches of ``max_batch_size`` jobs (None:
    one batch). A list of values or a range sweeps; anything else (an interval) is refused, as is a batch size
    below 1, by a FusebenchError naming the key (exit 2; Hydra's sweeper raised an error with a traceback)."""

    values: dict[str, list[str]] = {}
    for override in overrides:
        key = override.get_key_element()
        if not override.is_sweep_override():
            values[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            try:
                values[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
            except ValueError as err:  # range(0, 30, 0): Python's range refuses the step
                raise FusebenchError(f"{key}: {override.input_line!r} gives no values ({err}); a range's step is a "
                                     "number other than 0") from None
        else:
            raise FusebenchError(f"{key}: the sweeper takes a list of values (a,b,c) or a range(...), not "
                                 f"{override.value_type.name.lower().replace('_', ' ')} {override.input_line!r}")
    jobs = [list(job) for job in itertools.product(*values.values())]
    if max_batch_size is None:
        return [jobs]
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise FusebenchError(f"hydra.sweeper.max_batch_size is {max_batch_size!r}: give a whole number of jobs "
                             "(1 or more), or null for one batch")
    return [jobs[i:i + max_batch_size] for i in range(0, len(jobs), max_batch_size)]


def varying_keys(batches: list[list[list[str]]]) -> set[str]:
    """The keys whose value differs between the jobs of a sweep (what a job's progress line names)."""
    values: dict[str, set[str]] = {}
    for batch in batches:
        for job in batch:
            for override in job:
                key, _, value = override.partition("=")
                values.setdefault(key, set()).add(value)
    return {key for key, seen in values.items() if len(seen) > 1}


def runs_in_this_process(config: DictConfig) -> bool:
    """Whether the sweep's launcher is Hydra's basic one (``hydra/launcher: basic``: its jobs composed and run in
    this process, one after the other), named as Hydra's config store names it, not by importing its class."""
    basic = ConfigStore.instance().load("hydra/launcher/basic.yaml").node
    return OmegaConf.select(config, "hydra.launcher._target_") == OmegaConf.select(basic, "_target_")


class ComposeOnceSweeper(Sweeper):
    """Hydra's basic sweeper (``max_batch_size``, ``params``: its settings, in hydra/sweeper/fusebench.yaml),
    with the basic launcher handed the configs this sweeper composed to validate each batch."""

    composed: ComposedConfigs | None = None
    next_job: int = 0  # the number of the first job of the next batch
    job_dirs: dict[str, int] | None = None  # job dir -> job number, every batch of the sweep so far
    jobs: list[dict] | None = None  # every job of the sweep so far: number, dir, overrides (multirun_jobs.json)
    total: int = 0  # jobs in the whole sweep (every batch)
    varying: frozenset = frozenset()  # the keys whose value differs between the sweep's jobs
    started: float = 0.0  # the sweep's start (perf_counter)
    starts: list[float]  # each job's start so far (perf_counter), in order

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None):
        super().__init__()
        self.max_batch_size = max_batch_size
        self.params = params or {}
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher = None
        self.starts = []

    def setup(self, *, hydra_context: HydraContext, task_function: Any, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        launcher_context = hydra_context
        if runs_in_this_process(config):  # another launcher composes in its own processes
            self.composed = ComposedConfigs(hydra_context.config_loader)
            launcher_context = HydraContext(config_loader=self.composed, callbacks=hydra_context.callbacks)
            task_function = self.announced(task_function)
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=launcher_context,
                                                                task_function=task_function, config=config)

    def announced(self, task_function: Any) -> Any:
        """``task_function`` printing the job's progress line first (jobs run here, one after the other)."""

        @functools.wraps(task_function)
        def run(config: DictConfig) -> Any:
            self.job_started(HydraConfig.get().job.num, list(HydraConfig.get().overrides.task))
            return task_function(config)

        return run

    def job_started(self, number: int, overrides: list[str]) -> None:
        """Record job ``number``'s start (0-based, Hydra's) and print its line to stderr (stdout holds the jobs'
        tables): the jobs finished so far are those started before it, each timed to the next one's start."""
        now = time.perf_counter()
        self.starts.append(now)
        if progress.enabled():
            finished = [b - a for a, b in zip(self.starts, self.starts[1:])]
            shown = [o for o in overrides if o.partition("=")[0] in self.varying]
            print(progress.sweep_line(number + 1, self.total, shown, now - self.started, finished), file=sys.stderr,
                  flush=True)

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's basic sweep (hydra.sweeper.params, then the command line's overrides; multirun.yaml in the
        sweep dir; each batch validated, then launched); when it is refused before its first job starts (a
        job's config, its dir), the sweep dir is left as it was: multirun.yaml, written first, is put back (an
        earlier sweep's record) or removed, and a sweep dir this sweep created is removed when it is left empty."""

        folder = Path(str(self.config.hydra.sweep.dir))
        existed, record = folder.exists() and not rundir.created_here(folder), folder / "multirun.yaml"
        earlier = record.read_bytes() if record.is_file() else None
        try:
            return self._sweep(arguments)
        except BaseException:
            state.current().whole_rankings_ahead = False
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

    def _sweep(self, arguments: list[str]) -> list:
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*(f"{k}={v}" for k, v in self.params.items()), *arguments])
        batches = job_batches(overrides, self.max_batch_size)
        self.total, self.varying = sum(len(b) for b in batches), frozenset(varying_keys(batches))
        self.started, self.starts = time.perf_counter(), []
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns = []
        for batch in batches:
            started, first_job = time.perf_counter(), self.next_job
            self.validate_batch_is_legal(batch)  # every job composed before any runs: a bad override stops it
            logging.getLogger(__name__).debug("validated the configs of %d jobs in %.2f s", len(batch),
                                              time.perf_counter() - started)
            results = self.launcher.launch(batch, initial_job_idx=first_job)
            for result in results:
                _ = result.return_value  # raises a failed job's error, as Hydra's sweeper does
            returns.append(results)
        state.current().whole_rankings_ahead = False  # a later run of this process (the Python API) asks again
        return returns

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
        # the batch's jobs run in this process: with a whole-ranking job among them, its list passes store the rows
        state.current().whole_rankings_ahead = self.composed is not None and any(map(_fuses_whole_rankings, configs))
        record_jobs(self.jobs, batch, self.next_job, dirs)
        self.next_job += len(batch)
