"""The files a report (``fusebench-report``, and a sweep's own report step) writes, and how fusebench knows it wrote
them: ``report.sha256`` beside them records the sha256 of each (the ``sha256sum`` format, under one header line).

A report replaces only files it can tell it wrote: absent ones, and those ``report.sha256`` records with the bytes
they hold now. Anything else under a report file's name (a user's ``summary.md``, a file edited since, a folder) is
refused before any work (``check``: ``ReportBlocked`` naming the file). The files are drawn into a hidden staging
folder first and then moved into place, the manifest first recording both the earlier and the new checksums, then
the new ones alone, so that whatever stops a report midway leaves every report file recorded (a rerun replaces it,
never a dead end). A manifest cut short still vouches for each line that is whole.

The report's plots go in the folder's ``plots/``, except when the folder is itself a run dir, whose ``plots/`` is
the run's (``fusebench-report RUN_DIR``): then in ``report_plots/`` (``plots_dir``). No report file has a run
output's name, so a rerun into a run dir never meets one; when the rerun writes its outputs, it moves the earlier
report's files away with the earlier run's (``set_aside``: a report is never left beside a metrics.json it does not
describe; ``fusebench-report RUN_DIR`` draws it again).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from fusebench import FusebenchError
from fusebench.runtime.layout import plot_names as plot_names_in
from fusebench.stores.files import atomic_write_text, remembered_checksum

log = logging.getLogger(__name__)
MANIFEST = "report.sha256"
HEADER = f"# fusebench report: the sha256 of each file it wrote here (check: sha256sum -c {MANIFEST})"
# every table a report may write (report.sweep.write_report; scaling_*: report.sweep.SCALING_TABLES)
TABLES = ("summary.md", "summary.csv", "gains.csv", "cost.csv", "positives.csv", "scaling_recall.csv",
          "scaling_gains.csv", "scaling_changes.csv", "scaling_extrapolation.csv", "index_effects.csv")
RETIRED_PLOTS = ("index_gain_kept.png",)  # drawn by earlier releases (no plot module draws it): an earlier
# report's is removed, never drawn
PLOT_DIRS = ("plots", "report_plots")  # a report folder's, and a run dir's (whose plots/ is the run's)
STAGING = ".report-staging-"
_LINE = re.compile(r"([0-9a-f]{64})  (\S.*)")


def plot_names() -> tuple[str, ...]:
    """Every plot a report may draw (``report.plots.sweep_plots``; the plots' registry, read on first use), in
    plots_dir()."""
    return plot_names_in("sweep")


def known() -> frozenset[str]:
    """All a manifest may name: the tables, and every plot a report draws or drew, in either plots dir."""
    return frozenset({*TABLES, *(f"{sub}/{name}" for sub in PLOT_DIRS for name in (*plot_names(), *RETIRED_PLOTS))})


class ReportBlocked(FusebenchError):
    """A file under a report file's name that fusebench did not write: the report refuses to replace it."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


def is_run_dir(folder: str | Path) -> bool:
    """Whether ``folder`` is itself a run dir (its ``plots/`` is a run's): it holds a run's output (metrics.json,
    ranks/, topk/, error.txt) or a job's ``.hydra/config.yaml``."""
    folder = Path(folder)
    return any(os.path.lexists(folder / name) for name in ("metrics.json", "ranks", "topk", "error.txt")) \
        or (folder / ".hydra" / "config.yaml").is_file()


def plots_dir(folder: str | Path) -> str:
    """Where a report into ``folder`` draws its plots: ``plots`` (a sweep dir, a folder of run dirs), or
    ``report_plots`` when ``folder`` is itself a run dir."""
    return PLOT_DIRS[1] if is_run_dir(folder) else PLOT_DIRS[0]


def candidates(folder: str | Path) -> list[str]:
    """Every file (relative to ``folder``) a report into ``folder`` may write, the manifest last."""
    plots = plots_dir(folder)
    return [*TABLES, *(f"{plots}/{name}" for name in plot_names()), MANIFEST]


def read_manifest(folder: str | Path) -> dict[str, set[str]] | None:
    """What ``folder``'s report.sha256 records (relative path -> the sha256 values it may hold); {} when there is
    none; None when a file of that name is not fusebench's (or cannot be read). A manifest cut short, even within
    its header line, is fusebench's: its whole lines still count."""
    path = Path(folder) / MANIFEST
    if not os.path.lexists(path):
        return {}
    try:
        data = path.read_bytes() if path.is_file() else None
    except OSError:
        return None
    head = (HEADER + "\n").encode()
    if data is None or not (data.startswith(head) or head.startswith(data)):
        return None
    entries: dict[str, set[str]] = {}
    names = known()
    for line in data[len(head):].decode("utf-8", errors="replace").split("\n"):
        match = _LINE.fullmatch(line)
        if match and match[2] in names:  # never a path of anything else's, whatever the file says
            entries.setdefault(match[2], set()).add(match[1])
    return entries


def written(folder: str | Path, relative: str, manifest: dict[str, set[str]] | None = None) -> bool:
    """Whether the file ``relative`` (to ``folder``) is one a report wrote: ``report.sha256`` records its bytes."""
    manifest = read_manifest(folder) if manifest is None else manifest
    path = Path(folder) / relative
    try:
        return bool(manifest) and path.is_file() and remembered_checksum(path) in manifest.get(relative, ())
    except OSError:
        return False


def report_names(folder: str | Path) -> set[str]:
    """The names directly in ``folder`` that are a report's (files it recorded with their bytes, the manifest, a
    plots folder holding only such files): what a run into ``folder`` (the current folder) may find there."""
    folder, manifest = Path(folder), read_manifest(folder)
    if not manifest:
        return set()
    names = {MANIFEST} | {rel for rel in manifest if "/" not in rel and written(folder, rel, manifest)}
    for sub in PLOT_DIRS:
        try:
            held = [p.name for p in (folder / sub).iterdir()] if (folder / sub).is_dir() else []
        except OSError:
            held = []
        if held and all(written(folder, f"{sub}/{name}", manifest) for name in held):
            names.add(sub)
    return names


def blocker(folder: str | Path, names: list[str] | None = None) -> tuple[Path, str] | None:
    """The first file under a report file's name (``names``, by default every one, ``candidates``) in ``folder``
    that fusebench did not write, with why; None when the report may write them all."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return folder / MANIFEST, "is not the list of files a fusebench report wrote (another program's file?)"
    names = candidates(folder) if names is None else names
    for sub in {rel.split("/")[0] for rel in names if "/" in rel}:
        if os.path.lexists(folder / sub) and not (folder / sub).is_dir():
            return folder / sub, "is not a folder (the report draws its plots in a folder of that name)"
    for rel in names:
        path = folder / rel
        if rel == MANIFEST or not os.path.lexists(path):
            continue
        if not path.is_file():
            return path, "is not a file (a folder, or a link to nowhere, where the report writes a file)"
        if not written(folder, rel, manifest):
            why = "changed since fusebench wrote it" if rel in manifest else f"{MANIFEST} does not record it"
            return path, f"was not written by fusebench ({why}: another program's file, or edited since?)"
    return None


def check(folder: str | Path, names: list[str] | None = None) -> None:
    """Refuse (``ReportBlocked`` naming the file) a report into ``folder`` that would replace a file fusebench did
    not write."""
    found = blocker(folder, names)
    if found is not None:
        path, why = found
        raise ReportBlocked(f"{path} {why}; a report replaces only the files it wrote", path)


def staging(folder: str | Path) -> Path:
    """A hidden folder in ``folder`` (created) to draw a report's files in before ``commit`` moves them."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=STAGING, dir=folder))


def _write_manifest(folder: Path, entries: dict[str, set[str]]) -> None:
    lines = [f"{sha}  {rel}" for rel in sorted(entries) for sha in sorted(entries[rel])]
    atomic_write_text(folder / MANIFEST, "\n".join([HEADER, *lines]) + "\n")


def commit(folder: str | Path, staged: dict[str, Path], add: bool = False) -> list[Path]:
    """Move ``staged`` (relative path in ``folder`` -> the file drawn in ``staging``) into place, refused first
    (``check``) when any would replace a file fusebench did not write; remove the files an earlier report
    recorded that this one does not write (a table or plot it no longer has); record them all in report.sha256.
    ``add``: ``staged`` completes the report already in place (its plots, drawn after its tables): the files
    report.sha256 records are kept, and recorded still. Returns the paths written."""
    folder = Path(folder)
    check(folder, [*staged, MANIFEST])
    earlier = read_manifest(folder) or {}
    new = {rel: {remembered_checksum(src)} for rel, src in staged.items()}
    _write_manifest(folder, {rel: earlier.get(rel, set()) | new.get(rel, set()) for rel in {*earlier, *new}})
    placed = []
    for rel, src in staged.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, folder / rel)
        placed.append(folder / rel)
    if add:
        new = {**{rel: shas for rel, shas in earlier.items() if rel not in new}, **new}
    for rel in earlier.keys() - new.keys():  # an earlier report's file this one does not write
        if written(folder, rel, earlier):
            (folder / rel).unlink()
            if "/" in rel:
                try:
                    (folder / rel).parent.rmdir()  # only when nothing else is left in it
                except OSError:
                    pass
    _write_manifest(folder, new)
    return placed


def set_aside(folder: str | Path, into: str | Path, moved: list[str]) -> None:
    """Move the files a report wrote into ``folder`` (those ``report.sha256`` records with the bytes they hold
    now; the manifest itself last) into ``into``, so that a new run's outputs (``report.outputs``) never stand
    beside a report of the run they replace: a report describes the run dir's metrics.json of when it was drawn.
    A file edited since, or a manifest that is not fusebench's, is left as it is (someone else's). ``moved``
    gets each path (relative) as it is moved, for ``put_back``."""
    folder, into = Path(folder), Path(into)
    manifest = read_manifest(folder)
    if not manifest:
        return
    for rel in sorted(manifest):
        if written(folder, rel, manifest):
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(folder / rel, into / rel)
            moved.append(rel)
        elif os.path.lexists(folder / rel):
            log.warning("%s is left as it is: a report drew it for the run this one replaces, and it was edited "
                        "since (someone else's now); it does not describe the new run", folder / rel)
    into.mkdir(parents=True, exist_ok=True)
    os.replace(folder / MANIFEST, into / MANIFEST)
    moved.append(MANIFEST)
    for sub in {rel.split("/")[0] for rel in moved if "/" in rel}:
        try:
            (folder / sub).rmdir()  # only when nothing else is left in it
        except OSError:
            pass


def put_back(folder: str | Path, into: str | Path, moved: list[str]) -> None:
    """Undo ``set_aside``: move ``moved`` from ``into`` back into ``folder`` (the manifest first)."""
    for rel in sorted(moved, key=lambda rel: rel != MANIFEST):
        (Path(folder) / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(Path(into) / rel, Path(folder) / rel)


def discard(folder: Path) -> None:
    """Remove a staging folder (``staging``) and what is left in it."""
    shutil.rmtree(folder, ignore_errors=True)
