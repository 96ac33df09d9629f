"""Run and sweep dirs: which are refused before Hydra creates or writes into them, which files in a run dir
fusebench wrote, and an earlier run's Hydra config, kept so that a rerun that fails leaves the earlier run whole.

A rerun into a run dir keeps the earlier run's metrics.json, ranks/, topk/ and plots/ until the new run writes
its own (``report.outputs.write_run_outputs`` swaps them). Hydra rewrites ``.hydra/`` before fusebench's code
runs, so the Hydra callback (``app.callback``) reads the earlier ``.hydra`` files first, in memory, and the
``fusebench`` command puts them back when the rerun fails before writing. fusebench removes only files it can
tell it wrote (``foreign``); a dir holding anything else under a run output's name is refused instead.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

from fusebench import FusebenchError
from fusebench.evaluation.record_versions import RecordVersionError, migrate
from fusebench.report import report_files
from fusebench.report.report_files import report_names
from fusebench.runtime import run_lock
from fusebench.runtime.layout import (
    OUTPUTS,
    PLOTS_FORMAT,
    PLOTS_MANIFEST,
    begins_as,
    is_error_file,
    read_plots_manifest,
    run_plot_names,
)
from fusebench.stores.files import atomic_save, file_identity, file_sha256

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into hydra.output_subdir
FUSEBENCH_GROUPS = frozenset({"models", "fusion", "eval"})  # keys every fusebench job's .hydra/config.yaml has
# what a folder is called in messages, by its config key
WHAT = {"hydra.run.dir": "run dir", "hydra.sweep.dir": "sweep dir", "embed.cache.dir": "embedding cache"}
# an interpolation of what tells a sweep's jobs apart (hydra.sweep.subdir must hold one)
PER_JOB = re.compile(r"hydra\s*[.:]\s*job\s*\.\s*(num|id|override_dirname)\b")
# resolved run dir -> (its metrics.json's identity, its .hydra folder, the earlier .hydra files: None = absent)
_EARLIER: dict[Path, tuple[tuple, Path, dict[str, bytes | None]]] = {}
_EARLIER_LOG: dict[Path, int | None] = {}  # run dir -> its fusebench.log's size before the rerun
# how every metrics.json fusebench writes begins (report.outputs: json.dumps(record, indent=2)), the version's
# digits between the two parts
RECORD_OPENING = (b'{\n  "version": ', b',\n  "dataset": {\n')
# the names of what fusebench writes into ranks/ and topk/ (report.outputs.write_run_outputs)
RUN_FILE_NAMES = {"ranks": re.compile(r"(.+\.(t2i|i2t)\.npy|queries\.npz)"),
                  "topk": re.compile(r"(.+\.(t2i|i2t)\.npz|engine_differences\.jsonl)")}
log = logging.getLogger(__name__)


def run_record(path: Path) -> dict | None:
    """The content of ``path`` (a metrics.json) when it is a run record fusebench wrote, with the sha256 of
    the run's files, read as today's record version (``record_versions.migrate``); else None (not JSON, not a
    record, damaged, unreadable; a version 1 record, which holds no ``version`` and may hold no checksums, is not
    known to be fusebench's). A record a newer fusebench wrote is refused (:class:`RecordTooNew`, naming it)."""

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and {"version", "dataset", "retrievers", "run"} <= data.keys() \
            and isinstance(data.get("files"), dict):
        try:
            return migrate(data)
        except RecordVersionError as err:
            raise RecordTooNew(f"{path}: {err}; or choose another run dir") from None
    return None


class RecordTooNew(FusebenchError):
    """A run dir's metrics.json that a newer fusebench wrote: this one neither reads nor replaces it."""


def _begins_like_a_record(data: bytes) -> bool:
    """Whether ``data`` begins as every run record fusebench writes does, or is a beginning of that (cut short
    within it, down to nothing)."""
    head, tail = RECORD_OPENING
    if len(data) <= len(head):
        return head.startswith(data)
    match = re.match(rb"\d+", data[len(head):]) if data.startswith(head) else None
    rest = data[len(head) + match.end():] if match else None
    return rest is not None and (rest.startswith(tail) or tail.startswith(rest))


def damaged_record(out_dir: str | Path) -> bool:
    """Whether ``out_dir``'s metrics.json is a run record fusebench wrote that was damaged since (cut short, a
    flipped byte): not JSON, beginning as every record fusebench writes does (``RECORD_OPENING``; an empty file
    too, which holds nothing to lose), in a dir that is a fusebench run's: its ``.hydra/config.yaml`` a fusebench
    config, or ranks/ holding only what fusebench writes there. A rerun replaces it (it is no finished result:
    no report can read it). A readable JSON file that is not a record is someone else's, never replaced."""
    out_dir = Path(out_dir)
    path = out_dir / "metrics.json"
    try:
        if not path.is_file():
            return False
        data = path.read_bytes()
    except OSError:
        return False
    try:
        json.loads(data)
        return False  # readable: a run record (run_record) or someone else's JSON
    except ValueError:
        pass
    if not _begins_like_a_record(data):
        return False
    if is_fusebench_config(out_dir / ".hydra" / "config.yaml"):
        return True
    try:
        held = [p for p in (out_dir / "ranks").iterdir()] if (out_dir / "ranks").is_dir() else []
    except OSError:
        return False
    return bool(held) and all(p.is_file() and RUN_FILE_NAMES["ranks"].fullmatch(p.name) for p in held)


def is_fusebench_config(path: Path) -> bool:
    """Whether ``path`` (a job's .hydra/config.yaml) is a fusebench job's config: a mapping with its groups."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and FUSEBENCH_GROUPS <= data.keys()


def foreign_hydra(run_dir: str | Path, subdir: str | None = ".hydra") -> str | None:
    """What in ``run_dir``'s Hydra folder (``subdir``, hydra.output_subdir) says another app wrote it, which
    Hydra would overwrite: a file where the folder belongs, or a folder holding files whose config.yaml is not
    a fusebench config (another Hydra app's run); None when there is none, it is empty or it is fusebench's."""
    if subdir is None or not str(subdir).strip():
        return None
    folder = Path(run_dir) / str(subdir)
    if not os.path.lexists(folder):
        return None
    if not folder.is_dir():
        return f"{subdir} (a file, where Hydra writes a folder)"
    config = folder / "config.yaml"
    if os.path.lexists(config):
        return None if config.is_file() and is_fusebench_config(config) else \
            f"{subdir}/config.yaml, which is not a fusebench config (another Hydra app's run?)"
    try:
        held = sorted(p.name for p in folder.iterdir())
    except OSError:
        return None  # unreadable: creating files in it fails, and names the run dir
    return f"{subdir}/ holding {', '.join(held[:3])} without a fusebench config.yaml" if held else None


def check_hydra_files(run_dir: str | Path, key: str, subdir: str | None = ".hydra", what: str | None = None) -> None:
    """Refuse ``run_dir`` (naming ``key``) when its Hydra folder is another app's (``foreign_hydra``), which Hydra
    would overwrite; ``what``: what the dir is, for the message (by default, by ``key``: run dir, ...)."""
    theirs = foreign_hydra(run_dir, subdir)
    if theirs:
        raise FusebenchError(f"the {what or WHAT.get(key, 'run dir')} {run_dir} holds {theirs}; Hydra would "
                             "overwrite it, and fusebench removes none of that: move it away, or choose another "
                             f"{key}=...")


def check_subdir(raw, key: str = "hydra.sweep.subdir") -> None:
    """Refuse a sweep's job dir pattern (``raw``: hydra.sweep.subdir as written, interpolations unresolved) that
    does not give each job a folder of its own inside the sweep dir: empty, absolute, climbing out with '..', or
    the same for every job (it must interpolate hydra.job.num, hydra.job.id or hydra.job.override_dirname)."""
    example = f"e.g. {key}='${{hydra.job.num}}' (the default)"
    text = "" if raw is None else str(raw)
    if not text.strip():
        raise FusebenchError(f"{key} is empty: every job of the sweep would write into the sweep dir itself, over "
                             f"the others' results; give each job a folder of its own, {example}.")
    if os.path.isabs(text) or text.startswith("~"):
        raise FusebenchError(f"{key}={text} is an absolute path: a job dir must lie inside the sweep dir "
                             f"(hydra.sweep.dir); use a relative path that differs per job, {example}.")
    if ".." in Path(text).parts:
        raise FusebenchError(f"{key}={text} climbs out of the sweep dir ('..'): a job dir must lie inside the sweep "
                             f"dir (hydra.sweep.dir); use a relative path that differs per job, {example}.")
    if not isinstance(raw, str) or not PER_JOB.search(text):
        raise FusebenchError(f"{key}={text} is the same for every job, so the jobs would overwrite each other's "
                             "results; make it differ per job with ${hydra.job.num}, ${hydra.job.id} or "
                             f"${{hydra.job.override_dirname}}, {example}.")


def check_log(run_dir: Path, key: str) -> None:
    """Refuse a run dir whose fusebench.log (where Hydra's log handler writes) is anything but a file: Hydra
    would fail with a traceback opening it."""
    log_path = Path(run_dir) / "fusebench.log"
    if os.path.lexists(log_path) and not log_path.is_file():
        raise FusebenchError(f"{log_path} is not a file (the run logs there; fusebench never removes what it did not "
                             f"write): move it away, or choose another {key}=...")


def check_job_dir(sweep_dir: str | Path, subdir, job: int, taken: dict[str, int],
                  output_subdir: str | None = ".hydra", key: str = "hydra.sweep.subdir") -> str:
    """The job dir of sweep job ``job`` (``subdir``: hydra.sweep.subdir resolved for it), refused when it does not
    lie inside the sweep dir, when another job of this sweep (``taken``: job dir -> job number, updated) has it,
    when it holds another app's Hydra folder, or when another live run holds it (its lock). Returns the job dir
    (absolute)."""
    text = "" if subdir is None else str(subdir)
    base = os.path.normpath(os.path.abspath(str(sweep_dir)))
    path = os.path.normpath(os.path.join(base, text))
    if not text.strip() or os.path.isabs(text) or ".." in Path(text).parts or path == base \
            or not Path(path).is_relative_to(base):
        raise FusebenchError(f"{key} gives job {job} the dir {text!r}, not a folder inside the sweep dir {base}; "
                             "use a relative path that differs per job, e.g. "
                             f"{key}='${{hydra.job.num}}' (the default).")
    if path in taken:
        raise FusebenchError(f"{key} gives job {job} the dir {path}, which job {taken[path]} of this sweep writes "
                             "too: the jobs would overwrite each other's results; make it differ per job, e.g. "
                             f"{key}='${{hydra.job.num}}' (the default).")
    blocked = next((p for p in [Path(path), *Path(path).parents] if Path(p).is_relative_to(base) and p != Path(base)
                    and os.path.lexists(p) and not Path(p).is_dir()), None)
    if blocked is not None:  # Hydra's mkdir would fail with a traceback after the jobs before it ran
        raise FusebenchError(f"job {job}'s dir {path} cannot be made: {blocked} is a file (fusebench never removes "
                             "it): move it away, or choose another hydra.sweep.dir=...")
    check_log(Path(path), "hydra.sweep.dir")
    check_hydra_files(path, "hydra.sweep.dir", output_subdir, what=f"job dir (job {job})")
    run_lock.check_free(path, "hydra.sweep.dir", what=f"job dir (job {job})")  # a run in it now (each job takes it)
    taken[path] = job
    return path


def foreign(out_dir: str | Path) -> list[str]:
    """What in ``out_dir`` has a run output's name but is not known to be a run's: a metrics.json that is
    neither a run record nor a damaged one (``damaged_record``); a file in ranks/ or topk/ that the record does
    not list (someone else's: a listed file whose bytes changed is fusebench's, damaged, and the rerun replaces
    it; beside a damaged record, whose list cannot be read, a file named as fusebench names them); a file in
    plots/ that is not one of a run's plots, or that a report drew there (``report.sha256`` records it: the
    report of the runs below ``out_dir``, ``report_files``); an error.txt fusebench did not write
    (``is_error_file``); a folder where fusebench writes a file, or the reverse. fusebench never removes these."""

    out_dir = Path(out_dir)
    record = run_record(out_dir / "metrics.json")
    damaged = record is None and damaged_record(out_dir)
    checksums = record["files"] if record else {}
    reported = report_files.read_manifest(out_dir) or {}
    drawn = read_plots_manifest(out_dir / "plots")
    damaged_manifest = drawn is None and begins_as(out_dir / "plots" / PLOTS_MANIFEST, PLOTS_FORMAT)
    found = []
    for name in OUTPUTS:
        path = out_dir / name
        if not os.path.lexists(path):
            continue
        if name == "metrics.json" or name == "error.txt":
            mine = path.is_file() and (record is not None or damaged if name == "metrics.json" else is_error_file(path))
            found += [] if mine else [name]
        elif not path.is_dir():
            found.append(name)
        else:
            for file in sorted(path.iterdir()):
                relative = f"{name}/{file.name}"
                if name == "plots":
                    mine = (file.name == PLOTS_MANIFEST or file.name in run_plot_names() if damaged_manifest  # by names, rebuilt
                            else _own_plot(file, drawn)) and not report_files.written(out_dir, relative, reported)
                else:
                    mine = relative in checksums or damaged and bool(RUN_FILE_NAMES[name].fullmatch(file.name))
                found += [] if mine and file.is_file() else [relative]
    return found


CUT_SHORT = re.compile(r"\.(.+)\.[A-Za-z0-9_]+\.tmp")  # stores.files.atomic_save's temp file for NAME: .NAME.XXXXXXXX.tmp


def _own_plot(file: Path, drawn: dict[str, str | None] | None) -> bool:
    """Whether ``file`` in plots/ is a plot the run drew: named in the run's plots manifest with its sha256 (or
    as being drawn, when the run stopped there, and then also the temp file its write left when killed), or the
    manifest itself; a plots/ folder without a manifest (written before manifests were kept) by its name alone."""
    if file.name == PLOTS_MANIFEST:
        return drawn is not None
    cut_short = CUT_SHORT.fullmatch(file.name)  # atomic_save's temp file of a plot whose drawing was killed
    if cut_short:
        name = cut_short.group(1)
        return file.is_file() and (name == PLOTS_MANIFEST or (name in run_plot_names() if drawn is None
                                                               else name in drawn and drawn[name] is None))
    if drawn is None:
        return file.name in run_plot_names()
    if file.name not in drawn or not file.is_file():
        return False
    return drawn[file.name] is None or file_sha256(file) == drawn[file.name]


def check_outputs(out_dir: str | Path, key: str = "hydra.run.dir") -> None:
    """Refuse a run dir that holds something under a run output's name that fusebench did not write, or a
    report's plots (``report_files``), which a run's plots/ would replace."""

    theirs = foreign(out_dir)
    reported = report_files.read_manifest(out_dir) or {}
    report = [f for f in theirs if report_files.written(out_dir, f, reported)]
    theirs = [f for f in theirs if f not in report]
    if report:
        raise FusebenchError(f"the run dir {out_dir} holds {_shown(report)}, which fusebench-report drew for the runs "
                             f"below it ({report_files.MANIFEST} records them); a run's plots/ would replace them: "
                             f"choose another {key}=..., or move them away")
    if theirs:
        raise FusebenchError(f"the run dir {out_dir} holds {_shown(theirs)}, which fusebench did not write (or which "
                             f"changed since its run); fusebench removes none of that: move it away, or choose another "
                             f"{key}=...")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def check_writable(out_dir: str | Path, key: str = "hydra.run.dir") -> None:
    """Create ``out_dir`` and write a probe file into it; a folder that cannot be is refused, naming ``key``
    (hydra.run.dir, hydra.sweep.dir, embed.cache.dir, or any other key of a folder fusebench writes into)."""
    out_dir = Path(out_dir)
    what = WHAT.get(key, "folder")
    hint = " (or paths.output_dir=...)" if key in ("hydra.run.dir", "hydra.sweep.dir") else ""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = "it is a file, not a folder" if out_dir.exists() and not out_dir.is_dir() else err.strerror
        if err.filename and os.fspath(err.filename) != os.fspath(out_dir) and not out_dir.exists():
            reason += f": {err.filename}"
        raise FusebenchError(f"the {what} {out_dir} cannot be written ({reason}); choose another with {key}=..."
                             f"{hint}, or fix its permissions.") from None


def start_fresh(out_dir: str | Path, key: str = "hydra.run.dir") -> bool:
    """Check a run dir before the work: it can be written, no other live run holds it (its lock, taken here for
    this run when the ``fusebench`` command has not taken it already: ``runtime.run_lock``), and nothing in it
    under a run output's name was written by anyone but fusebench (fusebench never removes that: refused, naming
    ``key``). An earlier run's outputs stay until this run writes its own (``write_run_outputs`` swaps them in),
    so a rerun that fails leaves them as they were. Returns whether the lock was taken here (the caller releases
    it when its run ends)."""
    check_writable(out_dir, key)
    taken = run_lock.hold(out_dir, key)
    try:
        check_outputs(out_dir, key)
    except BaseException:
        if taken:
            run_lock.release(out_dir)
        raise
    if run_record(Path(out_dir) / "metrics.json") is None and damaged_record(out_dir):
        log.warning("%s is damaged (cut short or changed since fusebench wrote it: not a readable run record, so no "
                    "finished result); this run replaces it, with the ranks/, topk/ and plots/ beside it",
                    Path(out_dir) / "metrics.json")
    return taken


def check_dir(value, key: str, own: tuple[str, ...] = (), subdir: str | None = ".hydra", hold: bool = False) -> Path:
    """The folder ``value`` of ``key`` (hydra.run.dir or hydra.sweep.dir), checked before Hydra creates it:
    refused (FusebenchError naming ``key``) when empty (an unset shell variable), when it is the current
    folder and that holds files fusebench did not write (besides run outputs, ``own``: the folders of
    paths.output_dir and embed.cache.dir there), when a run dir holds a run output fusebench did not
    write or another app's Hydra folder (``subdir``: hydra.output_subdir, which Hydra would overwrite; a
    sweep's job dirs are checked by the sweeper before any job runs, and as each job starts), or when it
    cannot be created and written. ``hold``: take the dir's lock for this run (``runtime.run_lock``; another
    live run's is ``RunDirInUse``, naming it), before anything in the dir is read as an earlier run's."""
    if value is None or not str(value).strip():
        raise FusebenchError(f"{key} is empty (an unset shell variable?); give the outputs a folder of their own, "
                             f"e.g. {key}=outputs/run1.")
    path = Path(str(value))
    taken = hold and path.is_dir() and os.path.lexists(path / run_lock.LOCK_NAME) and run_lock.hold(path, key)
    try:
        if path.is_dir() and path.resolve() == Path.cwd().resolve():
            ours = {*OUTPUTS, ".hydra", "fusebench.log", run_lock.LOCK_NAME, *own, *report_names(path)}
            theirs = sorted(p.name for p in path.iterdir() if p.name not in ours)  # and a report fusebench wrote
            if theirs:
                raise FusebenchError(f"{key}={value} is the current folder, which holds files fusebench did not "
                                     f"write ({', '.join(theirs[:4])}{', ...' if len(theirs) > 4 else ''}); give "
                                     f"the outputs a folder of their own, e.g. {key}=outputs/run1.")
        if path.is_dir() and key != "hydra.sweep.dir":
            check_log(path, key)
            check_outputs(path, key)
            check_hydra_files(path, key, subdir)
        check_writable(path, key)
        taken = (run_lock.hold(path, key) if hold else False) or taken
    except BaseException:
        if taken:
            run_lock.release(path)
        raise
    return path


def keep_earlier_config(run_dir: str | Path, subdir: str | None = ".hydra") -> None:
    """Read the Hydra files of the finished run in ``run_dir`` (if it holds one), before Hydra rewrites them."""
    run_dir = Path(run_dir).resolve()
    try:
        if subdir is None or run_record(run_dir / "metrics.json") is None:
            return
    except RecordTooNew:  # refused when the dir is checked (check_outputs)
        return
    folder = run_dir / subdir
    try:
        _EARLIER[run_dir] = (file_identity(run_dir / "metrics.json"), folder, read_hydra_files(folder))
        log_file = run_dir / "fusebench.log"
        _EARLIER_LOG[run_dir] = log_file.stat().st_size if log_file.is_file() else None
    except OSError:  # unreadable: nothing kept, the rerun goes on as before
        pass


def read_hydra_files(folder: str | Path) -> dict[str, bytes | None]:
    """The Hydra files in ``folder`` (a job's hydra.output_subdir), name -> bytes (None: absent)."""
    folder = Path(folder)
    return {name: (folder / name).read_bytes() if (folder / name).is_file() else None for name in HYDRA_FILES}


def put_back_hydra_files(folder: str | Path, kept: dict[str, bytes | None]) -> None:
    """Write ``kept`` (``read_hydra_files``) back into ``folder``, removing the files that were absent."""
    folder = Path(folder)
    for name, data in kept.items():
        if data is None:
            (folder / name).unlink(missing_ok=True)
        else:
            atomic_save(folder / name, lambda tmp, data=data: tmp.write_bytes(data))


def restore_earlier_config(run_dir: str | Path) -> bool:
    """Put the earlier run's Hydra files back when its metrics.json is still the one in ``run_dir`` (the rerun
    failed before writing its own outputs), so that its config describes its results. Returns whether it did."""
    entry = _EARLIER.pop(Path(run_dir).resolve(), None)
    if entry is None:
        return False
    identity, folder, kept = entry
    size = _EARLIER_LOG.pop(Path(run_dir).resolve(), None)
    try:
        if file_identity(Path(run_dir) / "metrics.json") != identity:
            return False
        put_back_hydra_files(folder, kept)
        log_file = Path(run_dir) / "fusebench.log"
        if size is not None and log_file.is_file() and log_file.stat().st_size > size:
            os.truncate(log_file, size)  # the earlier run's log as it was (the failure was printed)
    except OSError:
        return False
    return True


def forget(run_dir: str | Path) -> None:
    """The run in ``run_dir`` wrote its outputs: its earlier run's Hydra files are not needed."""
    _EARLIER.pop(Path(run_dir).resolve(), None)


_FRESH: dict[Path, set[str] | None] = {}  # run dir -> what it held when this process's run started (None: absent)
_CREATED_FROM: dict[Path, Path] = {}  # run dir -> the highest of it and its parents that did not exist then


def note_if_fresh(run_dir: str | Path) -> None:
    """Remember what ``run_dir`` holds before Hydra writes into it (nothing: it does not exist yet)."""
    path = Path(run_dir).resolve()
    try:
        _FRESH[path] = {p.name for p in path.iterdir()} if path.is_dir() else None if not os.path.lexists(path) else set()
    except OSError:
        _FRESH.pop(path, None)
        return
    top = path
    while not os.path.lexists(top.parent) and top.parent != top:  # the folders above it this run creates too
        top = top.parent
    _CREATED_FROM[path] = top


def created_here(folder: str | Path) -> bool:
    """Whether ``folder`` did not exist when this process's run or sweep started (``note_if_fresh``)."""
    path = Path(folder).resolve()
    return path in _FRESH and _FRESH[path] is None


def remove_if_fresh(run_dir: str | Path, subdir: str | None = ".hydra") -> bool:
    """After a refused config: remove what this run put into ``run_dir`` when it is only what Hydra writes there
    (its config folder and fusebench.log, neither there before) and the run's lock file (released first), and
    the dir itself when the run created it, so that a mistake leaves nothing behind. Returns whether it removed
    anything."""
    path = Path(run_dir).resolve()
    if path not in _FRESH or not path.is_dir():
        return False
    before = _FRESH.pop(path)
    new = {p.name for p in path.iterdir()} - (before or set())
    ours = {name for name in ("fusebench.log", subdir, run_lock.LOCK_NAME) if name}
    if not new or not new <= ours:
        return False
    hydra = path / subdir if subdir else None
    if hydra is not None and subdir in new:
        if not hydra.is_dir() or {p.name for p in hydra.iterdir()} - set(HYDRA_FILES) or \
                any(p.is_dir() for p in hydra.iterdir()):
            return False
        for name in HYDRA_FILES:
            (hydra / name).unlink(missing_ok=True)
        hydra.rmdir()
    if "fusebench.log" in new and (path / "fusebench.log").is_file():
        (path / "fusebench.log").unlink()
    if run_lock.LOCK_NAME in new:
        drop_lock(path)
    if before is None and not any(path.iterdir()):
        path.rmdir()
        remove_created_parents(path)
    return True


def lock_made_here(folder: str | Path) -> bool:
    """Whether ``folder``'s lock file was not there when this process's run or sweep started (``note_if_fresh``)."""
    path = Path(folder).resolve()
    return path in _FRESH and (_FRESH[path] is None or run_lock.LOCK_NAME not in _FRESH[path])


def drop_lock(folder: str | Path) -> None:
    """A dir's lock file that this run made, in a dir it leaves as it found it (refused before any work): the lock
    released and its file removed (held here, so no other run is in the dir)."""
    if run_lock.held_here(folder):
        run_lock.release(folder)
        (Path(folder) / run_lock.LOCK_NAME).unlink(missing_ok=True)


def remove_created_parents(folder: str | Path) -> None:
    """After ``folder`` (a run or sweep dir this process created) was removed: the empty folders above it that
    this process created too (``note_if_fresh``)."""
    path = Path(folder).resolve()
    top = _CREATED_FROM.pop(path, path)
    parent = path.parent
    while top != path and parent.is_relative_to(top) and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        if parent == top:
            break
        parent = parent.parent
