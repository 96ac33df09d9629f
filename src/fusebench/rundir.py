"""Run and sweep dirs: which are refused before Hydra creates or writes into them, which files in a run dir
fusebench wrote, and an earlier run's Hydra config, kept so that a rerun that fails leaves the earlier run whole.

A rerun into a run dir keeps the earlier run's metrics.json, ranks/, topk/ and plots/ until the new run writes
its own (``report.outputs.write_run_outputs`` swaps them). Hydra rewrites ``.hydra/`` before fusebench's code
runs, so the Hydra callback (``report.callback``) reads the earlier ``.hydra`` files first, in memory, and the
``fusebench`` command puts them back when the rerun fails before writing. fusebench removes only files it can
tell it wrote (``foreign``); a dir holding anything else under a run output's name is refused instead.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from fusebench import FusebenchError
from fusebench.files import atomic_save, file_identity

OUTPUTS = ("metrics.json", "ranks", "topk", "plots", "error.txt")  # what a run writes into its dir
# the PNGs a run's plots/ holds (fusebench.report.plots.run_plots)
PLOTS = frozenset({"recall_bars.png", "recall_at_k.png", "wins_losses.png", "paired_gains.png",
                   "score_distributions.png", "corrected_metrics.png", "tune_curve.png"})
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into hydra.output_subdir
# resolved run dir -> (its metrics.json's identity, its .hydra folder, the earlier .hydra files: None = absent)
_EARLIER: dict[Path, tuple[tuple, Path, dict[str, bytes | None]]] = {}


def run_record(path: Path) -> dict | None:
    """The content of ``path`` (a metrics.json) when it is a run record fusebench wrote, with the sha256 of
    the run's files; else None (not JSON, not a record, damaged, unreadable)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and {"version", "dataset", "retrievers", "run"} <= data.keys() \
            and isinstance(data.get("files"), dict):
        return data
    return None


def is_error_file(path: Path) -> bool:
    """Whether ``path`` is an error.txt fusebench wrote (a failed sweep job's traceback)."""
    start = b"Traceback (most recent call last):"
    with Path(path).open("rb") as fh:
        return fh.read(len(start)) == start


def foreign(out_dir: str | Path) -> list[str]:
    """What in ``out_dir`` has a run output's name but is not known to be fusebench's: a metrics.json that is
    not a run record; a file in ranks/ or topk/ that the record does not list (someone else's: a listed file
    whose bytes changed is fusebench's, damaged, and the rerun replaces it); a file in plots/ that is not one of
    fusebench's plots; an error.txt that is not a traceback; a folder where fusebench writes a file, or the
    reverse. fusebench never removes these."""
    out_dir = Path(out_dir)
    record = run_record(out_dir / "metrics.json")
    checksums = record["files"] if record else {}
    found = []
    for name in OUTPUTS:
        path = out_dir / name
        if not os.path.lexists(path):
            continue
        if name == "metrics.json" or name == "error.txt":
            mine = path.is_file() and (record is not None if name == "metrics.json" else is_error_file(path))
            found += [] if mine else [name]
        elif not path.is_dir():
            found.append(name)
        else:
            for file in sorted(path.iterdir()):
                mine = file.is_file() and (file.name in PLOTS if name == "plots"
                                           else f"{name}/{file.name}" in checksums)
                found += [] if mine else [f"{name}/{file.name}"]
    return found


def check_outputs(out_dir: str | Path, key: str = "hydra.run.dir") -> None:
    """Refuse a run dir that holds something under a run output's name that fusebench did not write."""
    theirs = foreign(out_dir)
    if theirs:
        shown = ", ".join(theirs[:4]) + (f" and {len(theirs) - 4} more" if len(theirs) > 4 else "")
        raise FusebenchError(f"the run dir {out_dir} holds {shown}, which fusebench did not write (or which changed "
                             f"since its run); fusebench removes none of that: move it away, or choose another "
                             f"{key}=...")


def check_writable(out_dir: str | Path, key: str = "hydra.run.dir") -> None:
    """Create ``out_dir`` and write a probe file into it; a folder that cannot be is refused, naming ``key``."""
    out_dir = Path(out_dir)
    what = "sweep dir" if key == "hydra.sweep.dir" else "run dir"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = "it is a file, not a folder" if out_dir.exists() and not out_dir.is_dir() else err.strerror
        if err.filename and os.fspath(err.filename) != os.fspath(out_dir) and not out_dir.exists():
            reason += f": {err.filename}"
        raise FusebenchError(f"the {what} {out_dir} cannot be written ({reason}); choose another with {key}=... "
                             "(or paths.output_dir=...), or fix its permissions.") from None


def check_dir(value, key: str, own: tuple[str, ...] = ()) -> Path:
    """The folder ``value`` of ``key`` (hydra.run.dir or hydra.sweep.dir), checked before Hydra creates it:
    refused (FusebenchError naming ``key``) when empty (an unset shell variable), when it is the current
    folder and that holds files fusebench did not write (besides run outputs, ``own``: the folders of
    paths.output_dir and embed.cache.dir there), when a run dir holds a run output fusebench did not
    write (a sweep's job dirs are checked as each job starts), or when it cannot be created and written."""
    if value is None or not str(value).strip():
        raise FusebenchError(f"{key} is empty (an unset shell variable?); give the outputs a folder of their own, "
                             f"e.g. {key}=outputs/run1.")
    path = Path(str(value))
    if path.is_dir() and path.resolve() == Path.cwd().resolve():
        theirs = sorted(p.name for p in path.iterdir() if p.name not in (*OUTPUTS, ".hydra", "fusebench.log", *own))
        if theirs:
            raise FusebenchError(f"{key}={value} is the current folder, which holds files fusebench did not write "
                                 f"({', '.join(theirs[:4])}{', ...' if len(theirs) > 4 else ''}); give the outputs "
                                 f"a folder of their own, e.g. {key}=outputs/run1.")
    if path.is_dir() and key != "hydra.sweep.dir":
        check_outputs(path, key)
    check_writable(path, key)
    return path


def keep_earlier_config(run_dir: str | Path, subdir: str | None = ".hydra") -> None:
    """Read the Hydra files of the finished run in ``run_dir`` (if it holds one), before Hydra rewrites them."""
    run_dir = Path(run_dir).resolve()
    if subdir is None or run_record(run_dir / "metrics.json") is None:
        return
    folder = run_dir / subdir
    try:
        kept = {name: (folder / name).read_bytes() if (folder / name).is_file() else None for name in HYDRA_FILES}
        _EARLIER[run_dir] = (file_identity(run_dir / "metrics.json"), folder, kept)
    except OSError:  # unreadable: nothing kept, the rerun goes on as before
        pass


def restore_earlier_config(run_dir: str | Path) -> bool:
    """Put the earlier run's Hydra files back when its metrics.json is still the one in ``run_dir`` (the rerun
    failed before writing its own outputs), so that its config describes its results. Returns whether it did."""
    entry = _EARLIER.pop(Path(run_dir).resolve(), None)
    if entry is None:
        return False
    identity, folder, kept = entry
    try:
        if file_identity(Path(run_dir) / "metrics.json") != identity:
            return False
        for name, data in kept.items():
            if data is None:
                (folder / name).unlink(missing_ok=True)
            else:
                atomic_save(folder / name, lambda tmp, data=data: tmp.write_bytes(data))
    except OSError:
        return False
    return True


def forget(run_dir: str | Path) -> None:
    """The run in ``run_dir`` wrote its outputs: its earlier run's Hydra files are not needed."""
    _EARLIER.pop(Path(run_dir).resolve(), None)
