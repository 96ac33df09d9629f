"""The ``fusebench`` command: a Hydra app over the package's ``conf/`` (``fusebench --help`` lists the groups,
``fusebench-models`` the model registry; ``--config-dir DIR`` adds a folder of your own configs).

How it ends: 0 when every job finished; 2 with one ``fusebench: error: ...`` line for a user's mistake
(bad input, bad config, an output folder that cannot be written); 1 when a sweep finished but some of its
jobs failed (they are named, and each has error.txt); 130 on Ctrl-C. Tracebacks are kept for real bugs,
and shown for everything with ``HYDRA_FULL_ERROR=1``.
"""

from __future__ import annotations

import atexit
import errno
import gc
import os
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig

from fusebench import FusebenchError, interrupts, schema

# the configs ship inside the package, so `pip install .` (a wheel) works from any folder
CONFIG_DIR = str(Path(__file__).resolve().parent / "conf")
schema.register()  # the groups' schemas (types and defaults) that the YAML options start from
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"  # a sweep's jobs in this process, in turn
# an OSError with one of these is the machine's state (permissions, a full disk), not a bug
ENVIRONMENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.ENOTDIR,
                      errno.EISDIR}


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
    folders = [Path(CONFIG_DIR), *(extra_dirs or [])]
    return sorted({p.stem for folder in folders for p in (folder / "models").glob("*.yaml")})


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


def hydra_error_message(err: CompactHydraException) -> str:
    """Hydra's own message for a config mistake, without the search-path dump; unknown models name the registry."""
    missing = getattr(err, "missing_cfg_file", None) or ""
    if isinstance(err, MissingConfigException) and missing.startswith("models/"):
        return unknown_models_message([missing.split("/", 1)[1]], user_config_dirs(sys.argv[1:]))
    text = str(err).split("\nConfig search path:")[0].strip()
    if err.__cause__ is not None:
        text += f"\n{str(err.__cause__).strip()}"
    internal = ("reference_type=", "object_type=")  # OmegaConf's class names say nothing to a user
    lines = [line for line in text.splitlines()
             if not line.strip().startswith(internal) and line.strip() not in schema.SCHEMA_OPTIONS]
    if any(line.strip().startswith("full_key:") for line in lines):  # OmegaConf's value error: one line
        return "; ".join(line.strip() for line in lines if line.strip())
    return "\n".join(lines)


def freeze_long_lived() -> None:
    """Move every object alive now (the imported torch, numba, Hydra: about a million) out of the garbage
    collector's reach, once per process (the first job), and everything again at exit. Otherwise every full
    collection of a run re-walks them, and the interpreter's last collections at exit took 0.7-0.9 s of a
    10 s run. Objects created later are collected as usual; the frozen ones are the process's modules and
    the first job's config, which live to its end."""
    if not getattr(freeze_long_lived, "done", False):
        gc.freeze()
        atexit.register(gc.freeze)
        freeze_long_lived.done = True


def prepare_process() -> None:
    """Import the pipeline (torch, numba, ...) and freeze what is alive then, once per process: before the first
    job, or before a sweep composes its jobs' configs (fusebench's sweeper calls this first: configs kept for
    later jobs must stay collectable once their job ends, not be frozen with the modules)."""
    import fusebench.pipeline  # noqa: F401 - what every job needs, imported once

    freeze_long_lived()


def _fail(message: str, code: int = 2) -> None:
    print(f"fusebench: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main() -> None:
    """Console entry: check model names against the registry, run the Hydra app, turn mistakes into exit 2."""
    verbose = os.environ.get("HYDRA_FULL_ERROR") == "1"
    extra = user_config_dirs(sys.argv[1:])
    missing = unknown_models(sys.argv[1:], extra)
    if missing:
        _fail(unknown_models_message(missing, extra))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # exceptions reach the handlers below instead of Hydra's printer
    from fusebench.report.callback import SweepReport

    SweepReport.failed = None
    interrupts.watch()
    try:
        app()
        interrupts.check()  # a Ctrl-C whose exception Python dropped (see fusebench.interrupts)
    except KeyboardInterrupt:
        from fusebench.report import background

        background.cancel()  # a sweep's queued plots: not drawn after Ctrl-C
        print("\nfusebench: interrupted; no outputs were written for the unfinished run", file=sys.stderr)
        raise SystemExit(130) from None
    except FusebenchError as err:
        _fail(str(err))
    except CompactHydraException as err:
        if verbose:
            raise
        _fail(hydra_error_message(err))
    except OSError as err:
        if verbose or err.errno not in ENVIRONMENT_ERRNOS:
            raise
        _fail(f"cannot write {err.filename or 'the outputs'}: {err.strerror}. Choose another folder "
              "(hydra.run.dir=..., paths.output_dir=...) or free space / fix permissions, then rerun.")
    if SweepReport.failed:
        print(f"fusebench: {len(SweepReport.failed)} job(s) of the sweep failed: {', '.join(SweepReport.failed)} "
              "(each has error.txt; the sweep report lists them)", file=sys.stderr)
        raise SystemExit(1)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    interrupts.check()  # Ctrl-C during the previous job: no further job starts
    prepare_process()  # imported here, not at the top, so --help and --cfg stay fast
    from fusebench.pipeline import run, start_fresh
    hydra_cfg = HydraConfig.get()
    out_dir = hydra_cfg.runtime.output_dir
    if hydra_cfg.mode == RunMode.MULTIRUN:  # one failed job must not stop the others
        try:
            start_fresh(out_dir)
            run(cfg, out_dir, next_job_follows=hydra_cfg.launcher.get("_target_") == BASIC_LAUNCHER)
        except Exception as err:  # noqa: BLE001 - recorded in the job dir and the sweep report
            Path(out_dir, "error.txt").write_text("".join(traceback.format_exception(err)), encoding="utf-8")
            print(f"fusebench: job {hydra_cfg.job.num} failed: {err} (see {out_dir}/error.txt)", file=sys.stderr)
        return
    try:
        start_fresh(out_dir)
        run(cfg, out_dir)
    except FusebenchError as err:  # handled here, so Hydra adds no "Error executing job" line of its own
        _fail(str(err))


if __name__ == "__main__":
    main()
