"""The engine databases' folder in a run dir (``RUN_DIR/engine_db/DIRECTION``), and how fusebench knows it made it.

fusebench writes a marker file (``MARKER``) into ``engine_db/`` and into each direction's folder when it creates
them; the engine writes its database inside the direction folders. fusebench removes only folders that carry its
marker (a killed run's leftovers, a database kept by ``search.keep_db``), the marker last, so that a removal killed
midway leaves the folder marked, or empty (an empty folder holds nothing of anyone's and counts as fusebench's);
anything else under ``engine_db/`` (a
user's file or folder, a folder without the marker) is refused before any work, naming it, and never removed. A
folder is taken for a killed run's only when the run dir's lock is free or this process's (``runtime.run_lock``):
two runs into one dir at once never remove each other's live database. A
kept database is sealed when its engine finishes (``SEAL``: every path the engine left in the folder): a file or
folder put into it afterwards is someone else's, refused the same way (a folder a killed run left, unsealed, is
the engine's alone).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from fusebench import DIRECTIONS, FusebenchError
from fusebench.runtime import run_lock
from fusebench.runtime.layout import begins_as

ENGINE_DIR = "engine_db"  # under the run dir: the engine's database while the run uses it
MARKER = ".fusebench-engine-db"
MARKER_TEXT = "fusebench engine database folder: fusebench made it and removes it (search.keep_db keeps it)\n"
SEAL = ".fusebench-engine-files"  # in a kept direction folder: every path the engine left there, once it finished
SEAL_FORMAT = "fusebench engine files"
log = logging.getLogger(__name__)


def _empty_folder(folder: Path) -> bool:
    """A real, empty folder: what a removal killed between the marker and the folder itself leaves (nothing in it
    is anyone's, so it is taken as fusebench's)."""
    try:
        return folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())
    except OSError:
        return False


def _remove_marked(folder: Path) -> None:
    """Remove a marked folder with its marker LAST, so that a kill midway leaves it marked (or empty): a rerun
    still knows it as fusebench's and removes it."""
    for entry in folder.iterdir():
        if entry.name == MARKER:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    left = [entry.name for entry in folder.iterdir() if entry.name != MARKER]
    if left:  # the mark stays, so that the folder is still known as fusebench's (and never read as fresh)
        raise OSError(f"could not remove {', '.join(left[:3])} from {folder}")
    (folder / MARKER).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


def _marked(folder: Path) -> bool:
    """Whether ``folder`` is a real folder (not a link) holding fusebench's marker, as fusebench writes it, or an
    empty one (:func:`_empty_folder`)."""
    if _empty_folder(folder):
        return True
    marker = folder / MARKER
    try:
        return folder.is_dir() and not folder.is_symlink() and marker.is_file() and not marker.is_symlink() \
            and marker.read_text(encoding="utf-8") == MARKER_TEXT
    except (OSError, UnicodeDecodeError):
        return False


def _listing(folder: Path) -> list[str]:
    """Every path under ``folder`` (relative, '/'-separated), fusebench's own marker and seal aside."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.name not in (MARKER, SEAL)
                  or p.parent != folder)


def seal(folder: Path) -> None:
    """Record what the engine left in its finished direction folder (``search.keep_db``)."""
    (folder / SEAL).write_text(json.dumps({"format": SEAL_FORMAT, "paths": _listing(folder)}) + "\n",
                               encoding="utf-8")


def _sealed(folder: Path) -> set[str] | None:
    """The paths the seal of ``folder`` records, or None when it has none (or one fusebench did not write)."""
    try:
        data = json.loads((folder / SEAL).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    paths = data.get("paths") if isinstance(data, dict) and data.get("format") == SEAL_FORMAT else None
    return set(paths) if isinstance(paths, list) and all(isinstance(p, str) for p in paths) else None


def _added(folder: Path) -> Path | None:
    """The first path in a sealed direction folder that its engine did not leave there (a seal that is not
    fusebench's counts as such a path), or None."""
    if not os.path.lexists(folder / SEAL):
        return None
    sealed = _sealed(folder)
    if sealed is None:  # a seal of fusebench's, damaged, leaves the folder the engine's (removed, rebuilt)
        return None if begins_as(folder / SEAL, SEAL_FORMAT) else folder / SEAL
    extra = [p for p in _listing(folder) if p not in sealed]
    return folder / extra[0] if extra else None


def foreign_entry(out_dir: str | Path) -> Path | None:
    """The first thing under ``out_dir/engine_db`` fusebench cannot tell it made (None when there is none): the
    folder itself without its marker (or a file where it belongs), or an entry other than the marker and the
    marked direction folders."""
    root = Path(out_dir) / ENGINE_DIR
    if not os.path.lexists(root):
        return None
    if not _marked(root):
        return root
    for entry in sorted(root.iterdir()):
        if entry.name == MARKER:
            continue
        if entry.name not in DIRECTIONS or not _marked(entry):
            return entry
        added = _added(entry)
        if added is not None:
            return added
    return None


def check_engine_dir(out_dir: str | Path) -> None:
    """Refuse (before any work) a run dir whose ``engine_db/`` holds anything fusebench did not make."""
    theirs = foreign_entry(out_dir)
    if theirs is not None:
        what = "a folder fusebench did not make" if theirs.is_dir() and not theirs.is_symlink() else \
            "something fusebench did not write"
        raise FusebenchError(f"{theirs} is {what} (fusebench keeps its engine databases in "
                             f"{Path(out_dir) / ENGINE_DIR}, marked by {MARKER}, and removes only those): move it "
                             "away, or choose another hydra.run.dir=...")


def _make_marked(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(MARKER_TEXT, encoding="utf-8")


def fresh_workdir(out_dir: str | Path, direction: str) -> Path:
    """An empty, marked folder for the engine's ``direction`` database: one left by a killed run (or kept by
    search.keep_db) is reported and removed, never read; anything fusebench did not make is refused. Only a run
    dir whose lock no other process holds can hold a killed run's leftovers (``runtime.run_lock``): a live run's
    dir is refused (``RunDirInUse``, naming that run), and nothing of its database is touched."""
    run_lock.check_free(out_dir)
    check_engine_dir(out_dir)
    root = Path(out_dir) / ENGINE_DIR
    if not os.path.lexists(root / MARKER):  # new, or left empty by a removal killed before its rmdir
        _make_marked(root)
    folder = root / direction
    if os.path.lexists(folder):
        log.warning("%s holds an engine database from an earlier run in this dir (left by a run that did not finish, "
                    "or kept by search.keep_db): removed, rebuilt; never read", folder)
        _remove_marked(folder)
    _make_marked(folder)
    return folder


def remove_workdir(folder: Path) -> None:
    """Remove a direction's database folder, when it carries fusebench's marker and nothing was put into it after
    its engine sealed it."""
    if _marked(folder) and _added(folder) is None:
        _remove_marked(folder)


def remove_bare_root(out_dir: str | Path) -> None:
    """After a run stopped in the engine stage: ``engine_db/`` when it holds only its marker (what this run made
    and removed); any other folder in it (a database an earlier run kept) is left as it is."""
    root = Path(out_dir) / ENGINE_DIR
    try:
        if _marked(root) and all(entry.name == MARKER for entry in root.iterdir()):
            (root / MARKER).unlink(missing_ok=True)
            root.rmdir()
    except OSError as err:
        log.warning("could not remove %s (%s)", root, err)


def remove_engine_dir(out_dir: str | Path) -> None:
    """Remove ``engine_db/`` after the run: its marked direction folders and its marker; a folder left with
    anything else in it (put there while the run ran) is kept, with a warning naming it."""
    root = Path(out_dir) / ENGINE_DIR
    if not _marked(root):
        return
    for direction in DIRECTIONS:
        remove_workdir(root / direction)
    left = sorted(p.name for p in root.iterdir() if p.name != MARKER)
    if left:
        log.warning("%s holds %s, which fusebench did not write: the folder is kept", root, ", ".join(left[:4]))
        return
    (root / MARKER).unlink(missing_ok=True)
    try:
        root.rmdir()
    except OSError:
        pass
