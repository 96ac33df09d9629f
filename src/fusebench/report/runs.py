"""Run dirs on disk, as reports read them: every finished, intact run, and the others with the reason.

A run dir is a folder with ``.hydra/config.yaml``, ``metrics.json`` or ``error.txt``. It is reported when its
metrics.json is a readable object with the fields reports use and its rank files are readable, of one length per
direction, and match the sha256 that metrics.json recorded for them (``files``); otherwise it is listed as
failed (no metrics.json: the job failed or was stopped) or damaged (``Scan.damaged``: which file, and how). A dir
holding the
error.txt fusebench writes for a failed sweep job is failed, even beside a metrics.json: that is an earlier
run's, kept when the latest job in the dir failed (a finished run moves error.txt out with the earlier outputs),
so it is not reported as this sweep's result.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fusebench import DIRECTIONS
from fusebench.evaluation.record import RecordError, RecordVersionError, RunRecord
from fusebench.runtime.layout import is_error_file
from fusebench.stores.files import atomic_write_text, remembered_checksum


@dataclass
class Run:
    path: Path
    name: str
    record: RunRecord
    overrides: list[str] = field(default_factory=list)
    _loaded: dict = field(default_factory=dict, repr=False, compare=False)  # arrays read once per Run

    def __getstate__(self) -> dict:
        """Pickled without its arrays (a cache, read again where asked): a report sent to the views process is its
        rows, not every run's ranks (~0.3 MB for a 30-job sweep, against ~22 MB)."""
        return {**self.__dict__, "_loaded": {}}

    @property
    def n_test(self) -> int:
        """The test split's images (the gallery less its distractors)."""
        gallery = self.record.gallery
        return int(self.record.dataset.n_images - (gallery.distractors if gallery is not None else 0))

    @property
    def corpus_key(self) -> tuple:
        """What makes two runs' queries and test images the same: the test split's content digest
        (:meth:`DatasetSummary.identity`), never its name and size alone."""
        return self.record.dataset.identity(self.n_test)

    @property
    def dataset_key(self) -> tuple:
        """What makes two runs' galleries the same for a report: the same test split (:attr:`corpus_key`), the
        same number of images, and the distractors' source with the digest of the distractors taken (runs of one
        size from two sources, seeds or settings are kept apart)."""
        gallery = self.record.gallery
        return (self.corpus_key, self.record.dataset.n_images, None if gallery is None else gallery.identity,
                None if gallery is None else json.dumps(gallery.source, sort_keys=True, default=str))

    def same_queries(self, other: Run) -> bool:
        """Whether the saved query files of both runs name the same images query by query (the check under
        every pairing across runs; a run without ranks/queries.npz passes on its corpus key alone)."""
        if other is self:
            return True
        files = [r.path / "ranks" / "queries.npz" for r in (self, other)]
        if not all(f.is_file() for f in files):
            return True
        return all(np.array_equal(self.clusters(d), other.clusters(d)) for d in DIRECTIONS)

    def ranks(self, retriever: str, direction: str) -> np.ndarray:
        key = ("ranks", retriever, direction)
        if key not in self._loaded:
            self._loaded[key] = np.load(self.path / "ranks" / f"{retriever}.{direction}.npy")
        return self._loaded[key]

    def topk(self, retriever: str, direction: str) -> tuple[np.ndarray, np.ndarray]:
        """The retriever's saved lists (``ids``, ``scores``) in ``direction`` (topk/NAME.DIRECTION.npz)."""
        key = ("topk", retriever, direction)
        if key not in self._loaded:
            with np.load(self.path / "topk" / f"{retriever}.{direction}.npz") as data:
                self._loaded[key] = (data["ids"], data["scores"])
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


JOBS_FILE = "multirun_jobs.json"  # beside Hydra's multirun.yaml: each job of the sweep, its dir and overrides
JOBS_FORMAT = "fusebench sweep jobs"


def read_jobs(path: Path) -> list[dict] | None:
    """The jobs a sweep launched (``path``: its multirun_jobs.json), or None when the file is not fusebench's."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != JOBS_FORMAT or not isinstance(data.get("jobs"), list):
        return None
    jobs = [j for j in data["jobs"] if isinstance(j, dict) and isinstance(j.get("dir"), str)]
    return jobs if len(jobs) == len(data["jobs"]) else None


def _damaged_jobs_file(path: Path) -> bool:
    """A multirun_jobs.json fusebench wrote that was cut short or changed since (it begins as every one does):
    rewritten, never a dead end; any other file of that name is someone else's."""
    from fusebench.runtime.layout import begins_as  # lazy: cycle (runtime.layout imports this one)

    return Path(path).is_file() and begins_as(path, JOBS_FORMAT)


def write_jobs(sweep_dir: str | Path, jobs: list[dict]) -> bool:
    """Record the sweep's jobs (``{"job", "dir" (relative to the sweep dir), "overrides"}`` each) so that a
    report can name a job whose dir is gone; False (nothing written) when a file of that name is not
    fusebench's."""

    path = Path(sweep_dir) / JOBS_FILE
    if os.path.lexists(path) and read_jobs(path) is None and not _damaged_jobs_file(path):
        return False
    atomic_write_text(path, json.dumps({"format": JOBS_FORMAT, "jobs": jobs}, indent=1) + "\n")
    return True


def mark_failed(sweep_dir: str | Path, job_dir: str | Path) -> None:
    """Record in the sweep's multirun_jobs.json that the job of ``job_dir`` failed in this sweep, so that any
    report (the sweep's own, a later fusebench-report) lists it as failed, even when its dir still holds an
    earlier run's results and no error.txt of fusebench's (a user's file of that name is never overwritten)."""
    path = Path(sweep_dir) / JOBS_FILE
    jobs = read_jobs(path)
    if not jobs:
        return
    target = Path(job_dir).resolve()
    changed = False
    for job in jobs:
        if (Path(sweep_dir) / job["dir"]).resolve() == target and not job.get("failed"):
            job["failed"], changed = True, True
    if changed:
        write_jobs(sweep_dir, jobs)


def failed_jobs(folder: Path) -> dict[Path, dict]:
    """The job dirs (resolved) that the sweeps below ``folder`` recorded as failed, with their job entries."""
    out = {}
    for jobs_file in sorted(folder.rglob(JOBS_FILE)):
        for job in read_jobs(jobs_file) or []:
            if job.get("failed") is True:
                out[(jobs_file.parent / job["dir"]).resolve()] = job
    return out


def missing_jobs(folder: Path, found: set[Path]) -> dict[str, str]:
    """Jobs that the sweeps below ``folder`` launched (their multirun_jobs.json) whose dir is not among ``found``
    (the run dirs scanned): deleted, moved, or not started yet; label -> why."""
    out = {}
    for jobs_file in sorted(folder.rglob(JOBS_FILE)):
        jobs = read_jobs(jobs_file) or []
        shared = set.intersection(*[set(map(str, j.get("overrides") or [])) for j in jobs]) if len(jobs) > 1 else set()
        for job in jobs:
            path = (jobs_file.parent / job["dir"]).resolve()
            if path in found or not path.is_relative_to(folder.resolve()):
                continue
            overrides = " ".join(o for o in map(str, job.get("overrides") or []) if o not in shared) or "no overrides"
            label = str(path.relative_to(folder.resolve())) or "."
            out[label] = (f"the job dir is missing (job {job.get('job')}: {overrides}): deleted or moved, or the job "
                          "never started")
    return out


@dataclass
class Scan:
    runs: list[Run]
    failed: dict[str, str]  # run dir (relative) -> why it is not reported: unfinished, or which file is damaged
    newer: list[str] = field(default_factory=list)  # metrics.json files a newer fusebench wrote (fusebench-report refuses)
    # the run dirs of ``failed`` whose run finished but whose files are damaged (docs/guarantees.md: listed as damaged,
    # not as failed): metrics.json unreadable or changed, a rank or topk file missing, changed or unreadable
    damaged: list[str] = field(default_factory=list)


def _finite(value):
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value


def _metrics_problem(record: RunRecord, name: str, direction: str, ranks: np.ndarray) -> str | None:
    """Why ``record``'s numbers for retriever ``name`` are not those of its (checksummed) ranks, or None: every
    recall the report prints is read from metrics.json, which no checksum covers, so each is computed again
    from the ranks and must be the same float (a bit flipped in metrics.json is caught here)."""
    from fusebench.evaluation.comparisons import (
        direction_metrics,  # lazy: heavy (numpy, scipy); here: scipy loads only when runs are checked
    )

    recorded, computed = record.retrievers[name].direction(direction), direction_metrics(ranks, record.ks)
    for k in record.ks:
        if _finite(recorded.at(k)) != _finite(computed.recall[k]):
            return (f"metrics.json gives {name} {direction} R@{k} = {recorded.at(k)}, but its ranks give "
                    f"{computed.recall[k]} (metrics.json changed after the run)")
    if _finite(recorded.median_rank) != _finite(computed.median_rank) or recorded.n_queries != computed.n_queries:
        return (f"metrics.json's {name} {direction} median rank or query count is not its ranks' (metrics.json "
                "changed after the run)")
    return None


def _run_problem(path: Path, record: RunRecord) -> str | None:
    """Why a finished run's files cannot be reported (rank files missing, changed since the run, unreadable or
    of the wrong shape; a record that names retrievers it does not hold), or None."""
    for name, result in record.retrievers.items():
        if result.is_fusion and not result.members:
            return f"metrics.json: fusion {name!r} names no models"
        if any(record.retrievers[m].is_fusion for m in result.members if m in record.retrievers):
            return f"metrics.json: fusion {name!r} names a fusion as one of its models"
        unknown = [m for m in result.members if m not in record.retrievers]
        if unknown:
            return f"metrics.json: fusion {name!r} names models it does not hold ({', '.join(unknown)})"
    for c in [*record.comparisons, *record.positive_comparisons]:
        if c.candidate not in record.retrievers or c.baseline not in record.retrievers:
            return f"metrics.json: a comparison names a retriever it does not hold ({c.candidate} vs {c.baseline})"
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
            problem = _metrics_problem(record, name, direction, ranks)
            if problem:
                return problem
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
    runs, failed, newer, damaged = [], {}, [], []
    candidates = sorted({p.parent.parent for p in folder.rglob(".hydra/config.yaml")}
                        | {p.parent for p in folder.rglob("metrics.json")}
                        | {p.parent for p in folder.rglob("error.txt") if _failed_job(p.parent)})
    failed_here = failed_jobs(folder)
    for path in candidates:
        label = str(path.relative_to(folder)) or "."
        metrics_path = path / "metrics.json"
        if path.resolve() in failed_here and not _failed_job(path):  # its error.txt is a user's (left as it is)
            failed[label] = (f"the sweep's job {failed_here[path.resolve()].get('job')} failed (its error.txt is not "
                             "fusebench's)" + ("; its dir still holds an earlier run's results, not reported"
                                               if os.path.lexists(metrics_path) else ""))
            continue
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
        except RecordVersionError as err:
            failed[label] = f"{metrics_path}: {err}"
            newer.append(failed[label])
            continue
        except RecordError as err:
            failed[label] = str(err)
            damaged.append(label)
            continue
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:
            failed[label] = f"metrics.json is damaged ({type(err).__name__}: {err})"
            damaged.append(label)
            continue
        problem = _run_problem(path, record)
        if problem:
            failed[label] = problem
            damaged.append(label)
            continue
        overrides_path = path / ".hydra" / "overrides.yaml"
        overrides = []
        if overrides_path.is_file():
            text = overrides_path.read_text(encoding="utf-8", errors="replace")
            overrides = [line[2:].strip() for line in text.splitlines() if line.startswith("- ")]
        name = " ".join(overrides) if overrides else (str(path.relative_to(folder)) or path.name)
        runs.append(Run(path, name, record, overrides))
    failed.update(missing_jobs(folder, {p.resolve() for p in candidates}))
    return Scan(runs, failed, newer, damaged)


def load_runs(folder: str | Path) -> tuple[list[Run], list[str]]:
    """(finished runs, run dirs that are not: failed, stopped or damaged) below ``folder``, sorted by path."""
    scan = scan_runs(folder)
    return scan.runs, list(scan.failed)
