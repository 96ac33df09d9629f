"""Run dirs on disk, as reports read them: every finished, intact run, and the others with the reason.

A run dir is a folder with ``.hydra/config.yaml``, ``metrics.json`` or ``error.txt``. It is reported when its
metrics.json is a readable object with the fields reports use and its rank files are readable, of one length per
direction, and match the sha256 that metrics.json recorded for them (``files``); otherwise it is listed as
failed (no metrics.json: the job failed or was stopped) or damaged (which file, and how). A dir holding the
error.txt fusebench writes for a failed sweep job is failed, even beside a metrics.json: that is an earlier
run's, kept when the latest job in the dir failed (a finished run moves error.txt out with the earlier outputs),
so it is not reported as this sweep's result.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fusebench import DIRECTIONS
from fusebench.app.rundir import is_error_file
from fusebench.evaluation.record import RecordError, RunRecord
from fusebench.stores.files import remembered_checksum


@dataclass
class Run:
    path: Path
    name: str
    record: RunRecord
    overrides: list[str] = field(default_factory=list)
    _loaded: dict = field(default_factory=dict, repr=False, compare=False)  # arrays read once per Run

    @property
    def dataset_key(self) -> tuple:
        """What makes two runs' galleries the same for a report: the dataset's name and counts, and the
        distractors' source (runs of one size from two sources, seeds or settings are kept apart)."""
        gallery = self.record.gallery
        return (*self.record.dataset.key, None if gallery is None else gallery.identity)

    def ranks(self, retriever: str, direction: str) -> np.ndarray:
        key = ("ranks", retriever, direction)
        if key not in self._loaded:
            self._loaded[key] = np.load(self.path / "ranks" / f"{retriever}.{direction}.npy")
        return self._loaded[key]

    def clusters(self, direction: str) -> np.ndarray:
        key = ("clusters", direction)
        if key not in self._loaded:
            queries = self.path / "ranks" / "queries.npz"
            if queries.is_file():
                with np.load(queries) as data:
                    self._loaded[key] = data[f"{direction}_image"]
            else:
                self._loaded[key] = np.arange(len(self.ranks(next(iter(self.record.retrievers)), direction)))
        return self._loaded[key]


@dataclass
class Scan:
    runs: list[Run]
    failed: dict[str, str]  # run dir (relative) -> why it is not reported: unfinished, or which file is damaged


def _run_problem(path: Path, record: RunRecord) -> str | None:
    """Why a finished run's files cannot be reported (rank files missing, changed since the run, unreadable or
    of the wrong shape), or None."""
    for relative, digest in record.files.items():
        file = path / relative
        if not file.is_file():
            return f"{relative} is missing"
        if remembered_checksum(file) != digest:
            return f"{relative} does not match the checksum metrics.json recorded (damaged or replaced after the run)"
    counts = {}
    for direction in DIRECTIONS:
        lengths = set()
        for name in record.retrievers:
            file = path / "ranks" / f"{name}.{direction}.npy"
            try:
                ranks = np.load(file, allow_pickle=False)
            except Exception as err:  # noqa: BLE001 - any reader failure means a damaged file
                return f"{file.relative_to(path)} is unreadable ({type(err).__name__}: {err})"
            if ranks.ndim != 1 or ranks.dtype.kind not in "iu":
                return f"{file.relative_to(path)} is not a 1-D integer array (shape {ranks.shape}, {ranks.dtype})"
            lengths.add(len(ranks))
        if len(lengths) > 1:
            return f"ranks/*.{direction}.npy have different lengths {sorted(lengths)}"
        counts[direction] = lengths.pop()
    queries = path / "ranks" / "queries.npz"
    if queries.exists():
        try:
            with np.load(queries, allow_pickle=False) as data:
                sizes = {d: len(data[f"{d}_image"]) for d in DIRECTIONS}
        except Exception as err:  # noqa: BLE001
            return f"ranks/queries.npz is unreadable ({type(err).__name__}: {err})"
        for direction, size in sizes.items():
            if size != counts[direction]:
                return f"ranks/queries.npz has {size} {direction} queries, the rank files {counts[direction]}"
    return None


def _failed_job(path: Path) -> bool:
    """Whether ``path`` holds the error.txt of a sweep job that failed (and no run finished there since)."""
    try:
        return (path / "error.txt").is_file() and is_error_file(path / "error.txt")
    except OSError:
        return False


def scan_runs(folder: str | Path) -> Scan:
    """Every run dir below ``folder`` (itself included), sorted by path: the finished, readable runs, and the
    others with the reason (no metrics.json: failed or killed; error.txt: the latest job there failed, its
    earlier run's metrics.json not reported; or which file is damaged and how)."""
    folder = Path(folder)
    runs, failed = [], {}
    candidates = sorted({p.parent.parent for p in folder.rglob(".hydra/config.yaml")}
                        | {p.parent for p in folder.rglob("metrics.json")}
                        | {p.parent for p in folder.rglob("error.txt") if _failed_job(p.parent)})
    for path in candidates:
        label = str(path.relative_to(folder)) or "."
        metrics_path = path / "metrics.json"
        if _failed_job(path) and os.path.lexists(metrics_path):
            failed[label] = ("the job failed (see error.txt); its dir still holds an earlier run's results, "
                             "not reported")
            continue
        if not metrics_path.is_file():
            failed[label] = "no metrics.json (the job failed or was stopped" + (
                "; see error.txt)" if (path / "error.txt").is_file() else ")")
            continue
        try:
            record = RunRecord.from_json(json.loads(metrics_path.read_text(encoding="utf-8")))
        except RecordError as err:
            failed[label] = str(err)
            continue
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:
            failed[label] = f"metrics.json is damaged ({type(err).__name__}: {err})"
            continue
        problem = _run_problem(path, record)
        if problem:
            failed[label] = problem
            continue
        overrides_path = path / ".hydra" / "overrides.yaml"
        overrides = []
        if overrides_path.is_file():
            text = overrides_path.read_text(encoding="utf-8", errors="replace")
            overrides = [line[2:].strip() for line in text.splitlines() if line.startswith("- ")]
        name = " ".join(overrides) if overrides else (str(path.relative_to(folder)) or path.name)
        runs.append(Run(path, name, record, overrides))
    return Scan(runs, failed)


def load_runs(folder: str | Path) -> tuple[list[Run], list[str]]:
    """(finished runs, run dirs that are not: failed, stopped or damaged) below ``folder``, sorted by path."""
    scan = scan_runs(folder)
    return scan.runs, list(scan.failed)
