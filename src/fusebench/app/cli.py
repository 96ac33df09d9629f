"""The ``fusebench`` command: a Hydra app over the package's ``conf/`` (``fusebench --help`` lists the groups,
``fusebench-models`` the model registry; ``--config-dir DIR`` adds a folder of your own configs).

How it ends: 0 when every job finished; 2 with one ``fusebench: error: ...`` line for a user's mistake
(bad input, bad config, a file that cannot be read, a run dir or cache that cannot be written or holds files
fusebench did not write; a failed run leaves an earlier run in its dir as it was); 1 when a sweep finished
but some of its jobs failed (they are named, and each has error.txt); 130 on Ctrl-C. Tracebacks are kept
for real bugs, and shown for everything with ``HYDRA_FULL_ERROR=1``.
"""

from __future__ import annotations

import atexit
import errno
import gc
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, MissingMandatoryValue, UnsupportedInterpolationType

from fusebench import FusebenchError
from fusebench.app import interrupts, rundir
from fusebench.app.callback import RunDirRefused, SweepReport, job_ended, job_started
from fusebench.app.run_config import run_config
from fusebench.config import CONFIG_DIR, schema, specs
from fusebench.fusion.config import check_moved_overrides
from fusebench.runtime import layout, run_lock, state


def share_config_store() -> None:
    """Make a deep copy of Hydra's ``ConfigStore`` (a process-wide singleton) the store itself. Hydra deep-copies
    its config repository, and with it the whole store, once per composition and once per config group it lists:
    ``fusebench --help`` lists about 100, and copying took 1.4 s of its 2 s on a 2-core CPU. The store's nodes are
    only read through ``ConfigStore.load``, which copies the node it returns, so sharing the store changes no
    config and no output (tests/test_startup.py checks --help)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.__deepcopy__ = lambda store, memo: store


schema.register()  # the groups' schemas (types and defaults) that the YAML options start from
share_config_store()
CLUSTER_LAUNCHERS = ("joblib", "submitit_local", "submitit_slurm")  # Hydra plugins of the cluster extra
# an OSError with one of these is the machine's state (permissions, a full disk), not a bug
ENVIRONMENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.ENOTDIR,
                      errno.EISDIR}
WRITE_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # only ever from writing
# a value a user gave that OmegaConf cannot resolve (${oc.env:UNSET}, ${no.such.key}, ${bad, ???)
CONFIG_ERRORS = (InterpolationResolutionError, UnsupportedInterpolationType, GrammarParseError, MissingMandatoryValue)
PLACES: dict[str, str] = {}  # config key -> a folder the job running now writes into (os_error_message)
SHOW_TRACEBACKS = {"on": False}  # HYDRA_FULL_ERROR=1 as the user set it (main sets it for Hydra itself)


def user_config_dirs(argv: list[str]) -> list[Path]:
    """Folders given with Hydra's ``--config-dir DIR`` / ``-cd DIR`` (their models/ extend the registry)."""
    dirs = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]).expanduser())
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]).expanduser())
    return dirs


def registry(extra_dirs: list[Path] | None = None) -> list[str]:
    """The model configs by name: the package's conf/models/, plus models/ of any --config-dir."""
    return specs.registry([Path(CONFIG_DIR), *(extra_dirs or [])])


def list_models(argv: list[str] | None = None) -> int:
    """``fusebench-models``: the model registry, one line per model: name, kind and what it loads."""
    import yaml

    argv = sys.argv[1:] if argv is None else argv
    folders = [Path(CONFIG_DIR), *user_config_dirs(argv)]
    try:
        for name in registry(folders[1:]):
            path = next(f / "models" / f"{name}.yaml" for f in reversed(folders)
                        if (f / "models" / f"{name}.yaml").is_file())
            spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            what = spec.get("checkpoint") or " ".join(str(spec[k]) for k in ("model", "pretrained") if spec.get(k)) or "-"
            print(f"{name:<28} {spec.get('kind', '?'):<10} {what}")
    except BrokenPipeError:  # `fusebench-models | head`: the reader has what it wanted
        sys.stderr.close()
    return 0


def _names(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _names(v)]
    return [str(value)] if value is not None and str(value).strip() else []


def unknown_models(argv: list[str], extra_dirs: list[Path] | None = None) -> list[str]:
    """Names in ``models=...`` overrides (lists, ``a,b`` and ``choice(...)`` sweeps too) that have no
    conf/models/NAME.yaml. Parsed with Hydra's own override grammar; ``glob(...)`` only matches configs that
    exist, and an override Hydra cannot parse is left for Hydra to report."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    parser, names = OverridesParser.create(), []
    for arg in argv:
        if not arg.lstrip("+~").startswith("models="):
            continue
        try:
            override = parser.parse_overrides([arg])[0]
            if isinstance(override.value(), Glob):
                continue
            names += _names(list(override.sweep_iterator()) if override.is_sweep_override() else override.value())
        except Exception:  # noqa: BLE001 - Hydra reports its own syntax errors
            continue
    known = set(registry(extra_dirs))
    return list(dict.fromkeys(n for n in names if n not in known))


def unknown_models_message(missing: list[str], extra_dirs: list[Path] | None = None) -> str:
    return (f"unknown model(s) {', '.join(missing)}. The registry (fusebench-models) has: "
            f"{', '.join(registry(extra_dirs))}. Add a YAML file to models/ of a folder you pass with --config-dir, "
            "or describe a model inline with +models.NAME.kind=... overrides.")


def override_syntax_message(err: OverrideParseException) -> str:
    """One line for an override Hydra cannot parse: the override, what is wrong, and where the grammar is."""
    lines = [line for line in err.message.splitlines() if line.strip() and not line.startswith("See https://")]
    prefix = "LexerNoViableAltException: "
    if lines and lines[0].startswith(prefix):  # the override, then a caret under the character it stopped at
        column = len(lines[1]) - len(prefix) if len(lines) > 1 else 0
        lines = [f"unexpected character {err.override[column - 1:column]!r} at position {column}"]
    elif lines and lines[0].startswith("Error parsing override"):
        lines = lines[1:]
    return (f"cannot parse the override {err.override!r}: {'; '.join(lines)}. Write KEY=VALUE (a list as [a,b], "
            "quotes around odd characters; https://hydra.cc/docs/advanced/override_grammar/basic).")


def hydra_error_message(err: CompactHydraException) -> str:
    """Hydra's own message for a config mistake, on one line: without the search-path dump, an unknown config
    option with the group's options, an unparsable override named; unknown models name the registry."""
    missing = getattr(err, "missing_cfg_file", None) or ""
    if isinstance(err, MissingConfigException) and missing.startswith("models/"):
        return unknown_models_message([missing.split("/", 1)[1]], user_config_dirs(sys.argv[1:]))
    if isinstance(err, OverrideParseException):
        return override_syntax_message(err)
    if isinstance(err, MissingConfigException) and err.options and "/" in missing:
        group, name = missing.rsplit("/", 1)
        extra = (" The cluster launchers are the cluster extra: pip install 'fusebench[cluster]'."
                 if group == "hydra/launcher" and name in CLUSTER_LAUNCHERS else "")
        return (f"Could not find '{missing}': {group}={name} is not an option of {group}; valid: "
                f"{', '.join(sorted(err.options))}.{extra}")
    text = str(err).split("\nConfig search path:")[0].strip()
    if err.__cause__ is not None:
        text += f"\n{str(err.__cause__).strip()}"
    internal = ("reference_type=", "object_type=")  # OmegaConf's class names say nothing to a user
    lines = [line for line in text.splitlines()
             if not line.strip().startswith(internal)]
    return "; ".join(line.strip() for line in lines if line.strip())


def _place(err: OSError) -> tuple[str, str] | None:
    """(config key, folder) of the folder in ``PLACES`` that ``err``'s file lies in (the deepest), or None."""
    name = os.fspath(err.filename) if getattr(err, "filename", None) is not None else ""
    if not name:
        return None
    target = Path(os.path.abspath(name))
    for key, folder in sorted(PLACES.items(), key=lambda item: -len(Path(os.path.abspath(item[1])).parts)):
        if target.is_relative_to(os.path.abspath(folder)):
            return key, folder
    return None


def is_environment(err: BaseException) -> bool:
    """Whether ``err`` is the machine's state, not a bug: an OSError with one of ``ENVIRONMENT_ERRNOS``, or a
    path that does not exist (ENOENT) in a folder fusebench writes (``PLACES``: e.g. embed.cache.dir=/proc/x)."""
    if not isinstance(err, OSError):
        return False
    return err.errno in ENVIRONMENT_ERRNOS or (err.errno == errno.ENOENT and _place(err) is not None)


def config_error(err: BaseException | None) -> Exception | None:
    """The OmegaConf error of a value that cannot be resolved (``CONFIG_ERRORS``) that ``err`` is or was raised
    from (Hydra wraps some), or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, CONFIG_ERRORS):
            return err
        err = err.__cause__ or err.__context__
    return None


def config_error_message(err: Exception, argv: list[str] | None = None) -> str:
    """One line for a config value OmegaConf cannot resolve: the key (OmegaConf's ``full_key``; when it has none,
    as when Hydra resolves a whole node at once, the override in ``argv`` that holds what it names) and why."""
    key = getattr(err, "full_key", None) or ""
    why = (getattr(err, "msg", None) or str(err)).strip().splitlines()
    why = why[0] if why else type(err).__name__
    if not key:
        named = re.findall(r"'([^']+)'", why)
        for arg in sys.argv[1:] if argv is None else argv:
            name, _, value = arg.partition("=")
            if "${" in value and any(n in value for n in named):
                key = name.lstrip("+~")
                break
    return (f"cannot resolve {key or 'a config value'}: {why}. Fix that value (an environment variable that is "
            "not set, a key that does not exist, a missing '}'), then rerun.")


def user_error_message(err: BaseException) -> str | None:
    """The one line for ``err`` when it is a user's mistake or the machine's state (a FusebenchError, a config
    value that cannot be resolved, Hydra's own config errors, an OSError of ``is_environment``); None for a
    bug (its traceback is shown), and for everything but a FusebenchError with ``HYDRA_FULL_ERROR=1``."""
    if isinstance(err, FusebenchError):
        return str(err)
    if SHOW_TRACEBACKS["on"] or not isinstance(err, Exception):
        return None
    found = config_error(err)
    if found is not None:
        return config_error_message(found)
    if isinstance(err, CompactHydraException):
        return hydra_error_message(err)
    if is_environment(err):
        return os_error_message(err)
    return None


def os_error_message(err: OSError) -> str:
    """One line for an OSError that is the machine's state (``ENVIRONMENT_ERRNOS``): when the file lies in a
    folder fusebench writes (``PLACES``: the embedding cache, the run or sweep dir), that folder's config
    key; otherwise, unless only a write gives that error, the file that cannot be read."""
    name = os.fspath(err.filename) if err.filename is not None else ""
    if name:
        place = _place(err)
        if place is not None:
            key, folder = place
            what = "the embedding cache" if key == "embed.cache.dir" else "the outputs"
            if err.errno == errno.ENOENT:
                return (f"cannot use {what}: {name}: {err.strerror} (a folder that cannot be created there, or "
                        f"one removed while the run went on). Choose another folder with {key}=..., then rerun.")
            return (f"cannot use {what}: {name}: {err.strerror}. Free space or fix the permissions of "
                    f"{key}={folder}, or choose another folder with {key}=..., then rerun.")
        if err.errno not in WRITE_ERRNOS:
            return (f"cannot read {name}: {err.strerror}. Make the file readable (its permissions), or point its "
                    "config key at another file.")
    return (f"cannot write {name or 'the outputs'}: {err.strerror}. Free space or fix permissions, or choose "
            "another folder (hydra.run.dir=..., paths.output_dir=..., embed.cache.dir=...), then rerun.")


def _fail(message: str, code: int = 2) -> None:
    print(f"fusebench: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main() -> None:
    """Console entry: check model names against the registry, run the Hydra app, turn mistakes into exit 2."""
    atexit.unregister(freeze_at_exit)  # once, however often main runs in one process
    atexit.register(freeze_at_exit)  # runs before the handlers registered at import (logging's), after later ones
    run_command(app)


def console_main() -> None:
    """The ``fusebench`` console script (and ``python -m fusebench.app.cli``): :func:`main`, then :func:`quick_exit`."""
    try:
        main()
    except SystemExit as err:
        quick_exit(err.code)
    quick_exit(0)


def quick_exit(code) -> None:
    """End the process with ``code`` (SystemExit's rules: None is 0, a message is printed and is 1) once every
    atexit handler but :func:`freeze_at_exit` has run (logging's flush, tempfile's clean-ups), skipping only the
    interpreter's own teardown of its modules (~0.3 s after a job that imported torch: docs/speed.md). The same
    contract as ``freeze_at_exit``'s: every output is written and closed before the command returns. When no job
    ran (torch not imported: ``--help``, a config mistake), a profiler or tracer is on (``python -m cProfile``,
    coverage: they write their files at exit) or a thread other than daemons still runs, the usual exit is
    taken instead."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if ("torch" not in sys.modules or sys.getprofile() is not None or sys.gettrace() is not None
            or any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread())):
        raise SystemExit(code)  # no job ran (a light exit), a profiler or coverage to save, or a thread to wait for
    atexit.unregister(freeze_at_exit)  # its collection and freeze only shorten the teardown skipped here
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers Python's own exit would run, in its order
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (fusebench ... | head): nothing more to say there
            pass
    os._exit(code or 0)


def freeze_at_exit() -> None:
    """At the interpreter's exit: collect what is garbage now (every cycle's finalisers run, open files are
    flushed), then move what is left, all still reachable, into the GC's permanent generation, so that the
    shutdown does not walk once more everything torch and numba built (a COCO-size job's exit took 0.8-1.0 s,
    about 0.6 s less with this: scripts/bench_cli.py). The contract it needs: every output is closed before the
    command returns (the run's files are written atomically and checksummed before; W&B's run is finished by
    ``app.tracking``; ``logging.shutdown``, which runs after this, flushes every handler itself). A reference
    cycle that becomes garbage only later (in a handler that runs after this one, or while modules are torn
    down) is never finalised: nothing fusebench writes may rely on that (``tests/test_run_dir.py`` checks a
    finished run's files and log after the process has exited). A process that calls ``main`` and goes on (a
    test) is frozen only when it ends."""
    gc.collect()
    gc.freeze()


def run_command(hydra_app: Callable[[], None], kind: str = "run",
                interrupted: str = "no outputs were written for the unfinished run",
                failed_note: str = "each has error.txt; the sweep report lists them") -> None:
    """What every fusebench command over the config tree does around its Hydra app (``app``; fusebench-embed's
    ``embed_app``, whose jobs are of ``kind`` embed: ``SweepReport.kind``): model names checked against the
    registry, Ctrl-C watched, and how it ends (module doc)."""
    SHOW_TRACEBACKS["on"] = os.environ.get("HYDRA_FULL_ERROR") == "1"
    extra = user_config_dirs(sys.argv[1:])
    missing = unknown_models(sys.argv[1:], extra)
    if missing:
        _fail(unknown_models_message(missing, extra))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # exceptions reach the handlers below instead of Hydra's printer

    os.environ["FUSEBENCH_COMMAND_PID"] = str(os.getpid())  # app.views: a job in another process is a worker's
    SweepReport.failed, SweepReport.kind, SweepReport.sweep_dir = None, kind, None
    PLACES.clear()
    interrupts.watch()
    interrupts.guard_stdout()  # `fusebench ... | head -1`: the runs finish, what is printed after goes nowhere
    try:
        hydra_app()
        interrupts.check()  # a Ctrl-C whose exception Python dropped (see fusebench.app.interrupts)
    except KeyboardInterrupt:
        written = state.current().written
        if written and kind == "run":  # after a run's results were swapped in: say so, never "nothing written"
            interrupted = (f"the results of {len(written)} run(s) were written before it ({written[-1]}: "
                           "metrics.json, ranks/, topk/), whose plots may be incomplete (a rerun draws them); "
                           "an unfinished run wrote nothing")
        print(f"\nfusebench: interrupted; {interrupted}", file=sys.stderr)
        raise SystemExit(130) from None
    except RunDirRefused as err:  # raised in Hydra's callback (or sweeper), before Hydra creates the dirs
        _fail(str(err))
    except Exception as err:  # a user's mistake (FusebenchError, a config value, ...): one line; a bug: raised
        message = user_error_message(err)
        if message is None:
            raise
        _fail(message)
    finally:
        run_lock.release_all()  # the run and sweep dirs this command held (a process that ends releases them too)
        views = sys.modules.get("fusebench.app.views")  # imported by a job that ran: none, nothing to end
        if views is not None:
            views.finish()  # the views process gets no more runs (waited for with views=wait or inside SLURM)
    if SweepReport.failed:
        print(f"fusebench: {len(SweepReport.failed)} job(s) of the sweep failed: {', '.join(SweepReport.failed)} "
              f"({failed_note})", file=sys.stderr)
        raise SystemExit(1)


def _places(cfg: DictConfig, key: str, folder: str) -> None:
    """Record the folders this job writes into, by config key, for ``os_error_message``."""
    from omegaconf import OmegaConf

    PLACES.clear()
    PLACES[key] = folder
    try:
        cache = OmegaConf.select(cfg, "embed.cache.dir")
    except Exception:  # noqa: BLE001 - a value the run's own checks report
        cache = None
    if isinstance(cache, str) and cache.strip():
        PLACES["embed.cache.dir"] = cache


def evaluate(config, out_dir: str, key: str) -> None:
    """The ``fusebench`` job: evaluate, writing the run's outputs into ``out_dir`` (the dir of ``key``)."""
    from fusebench.app.pipeline import (
        run,  # lazy: heavy (torch, numba, scipy); here, not at the top: --help, --cfg and a config mistake stay fast
    )

    rundir.start_fresh(out_dir, key)
    run(config, out_dir)
    rundir.forget(out_dir)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    run_job(cfg, evaluate)


def run_job(cfg: DictConfig, work: Callable[[object, str, str], None]) -> None:
    """One job: check its run dir, run ``work(config, out_dir, key)`` on the typed config; on a failure, the
    earlier run in the dir is left as it was (its outputs stay until a run writes its own; its Hydra files, which
    Hydra has just rewritten, are put back)."""
    interrupts.check()  # Ctrl-C during the previous job: no further job starts
    from fusebench.report.runs import mark_failed  # lazy: heavy (numpy)
    hydra_cfg = HydraConfig.get()
    out_dir = hydra_cfg.runtime.output_dir
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    _places(cfg, key, hydra_cfg.sweep.dir if multirun else out_dir)
    if multirun:  # a dir another job of this sweep wrote, or outside the sweep dir: the sweep stops (exit 2)
        job_started(out_dir, hydra_cfg.sweep.dir, hydra_cfg.job.num, hydra_cfg.output_subdir)
    try:
        check_moved_overrides(hydra_cfg.overrides.task)
        config = run_config(cfg)  # the typed config: a mistake in it is one line before anything heavy is imported
        work(config, out_dir, key)
    except BaseException as err:
        rundir.restore_earlier_config(out_dir)
        message = user_error_message(err)  # None: a bug (or HYDRA_FULL_ERROR=1), shown with its traceback
        if multirun and isinstance(err, Exception):  # one failed job must not stop the others
            SweepReport.jobs_failed.append(os.path.relpath(out_dir, os.path.abspath(hydra_cfg.sweep.dir)))
            mark_failed(hydra_cfg.sweep.dir, out_dir)  # every report of the sweep lists it as failed
            error_file = Path(out_dir, "error.txt")
            ours = not os.path.lexists(error_file) or layout.is_error_file(error_file)  # never someone else's
            if ours:
                error_file.write_text(layout.error_text(message, "".join(traceback.format_exception(err))),
                                      encoding="utf-8")
            shown = message or (os_error_message(err) if is_environment(err) else err)
            where = f"see {error_file}" if ours else f"{error_file} is not fusebench's, so it was left as it is"
            print(f"fusebench: job {hydra_cfg.job.num} failed: {shown} ({where})", file=sys.stderr)
            return
        if message is not None:  # handled here, so Hydra adds no "Error executing job" line of its own
            rundir.remove_if_fresh(out_dir, hydra_cfg.output_subdir)  # a mistake leaves nothing behind
            _fail(message)
        raise
    finally:
        if multirun:
            job_ended(out_dir, hydra_cfg.job.num, hydra_cfg.output_subdir)
        views = sys.modules.get("fusebench.app.views")
        if views is not None and views.in_worker():  # a launcher's worker: its job ends once its views are made
            views.finish()


if __name__ == "__main__":
    console_main()
