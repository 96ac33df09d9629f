"""Write a run's outputs: ranks/, topk/ and metrics.json, all or nothing.

Everything is first written into a hidden staging folder inside the run dir and moved into place only
once complete. An earlier run's outputs in the dir are kept until then and swapped out at that moment:
its metrics.json is moved away first and the new one moved in last (atomic renames), so the dir never
reads as finished with one run's record and another's files, and a run that fails before writing leaves
the earlier run as it was. metrics.json records the sha256 of every file in ranks/ and topk/ (``files``), so that
reports can tell a damaged or replaced rank file from the run's own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from fusebench.evaluation.record import RunRecord
from fusebench.report import report_files
from fusebench.runtime import state
from fusebench.runtime.layout import OUTPUTS
from fusebench.stores.files import atomic_write_text, remembered_checksum


def _clean(value):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _swap_in(out_dir: Path, staging: Path) -> None:
    """Move the earlier run's outputs out of ``out_dir`` into ``staging``/earlier (removed with it), metrics.json
    first, and the files a report drew of it there (``fusebench-report RUN_DIR``: ``report_files.set_aside``),
    then the staged ranks/, topk/ and metrics.json in, metrics.json last; on an error the earlier outputs and
    report are put back."""

    earlier, moved, placed, reported = staging / "earlier", [], [], []
    earlier.mkdir()
    try:
        for name in OUTPUTS:
            if os.path.lexists(out_dir / name):
                os.replace(out_dir / name, earlier / name)
                moved.append(name)
        report_files.set_aside(out_dir, staging / "earlier_report", reported)
        for name in ("ranks", "topk", "metrics.json"):
            os.replace(staging / name, out_dir / name)
            placed.append(name)
    except BaseException:
        for name in reversed(placed):
            os.replace(out_dir / name, staging / name)
        report_files.put_back(out_dir, staging / "earlier_report", reported)
        for name in reversed(moved):
            os.replace(earlier / name, out_dir / name)
        raise


def write_run_outputs(out_dir: str | Path, lists: dict, record: RunRecord, save_topk: int | None,
                      queries: dict | None = None, extra: dict[str, str] | None = None) -> None:
    """``lists``: {retriever: {direction: RankedLists}}; ``save_topk`` caps the saved list length (None = all).

    ``queries`` ({"t2i": caption -> image index, "i2t": query image indices}) is saved as ranks/queries.npz so
    that runs can be compared query by query (and image-clustered) after the fact. ``extra``: more text files by
    path under the run dir (``topk/engine_differences.jsonl``), written, checksummed and swapped in with the rest.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))
    try:
        for sub in ("ranks", "topk"):
            (staging / sub).mkdir()
        if queries is not None:
            np.savez(staging / "ranks" / "queries.npz", t2i_image=np.asarray(queries["t2i"], dtype=np.int64),
                     i2t_image=np.asarray(queries["i2t"], dtype=np.int64))
        for name, by_direction in lists.items():
            for direction, ranked in by_direction.items():
                np.save(staging / "ranks" / f"{name}.{direction}.npy", np.asarray(ranked.ranks, dtype=np.int64))
                cut = slice(None) if save_topk is None else slice(0, save_topk)
                arrays = {"ids": ranked.ids[:, cut].numpy().astype(np.int32),
                          "scores": ranked.scores[:, cut].numpy().astype(np.float32)}
                if ranked.contributors is not None:
                    arrays["contributors"] = ranked.contributors[:, cut].numpy().astype(np.int32)
                np.savez(staging / "topk" / f"{name}.{direction}.npz", **arrays)
        for relative, text in (extra or {}).items():
            (staging / relative).write_text(text, encoding="utf-8")
        files = {f"{sub}/{f.name}": remembered_checksum(f) for sub in ("ranks", "topk") for f in sorted((staging / sub).iterdir())}
        record.files = files  # checksums: a report never trusts a rank file changed after the run
        atomic_write_text(staging / "metrics.json", json.dumps(_clean(record.to_json()), indent=2) + "\n")
        _swap_in(out_dir, staging)
        state.current().written.append(str(out_dir))  # what a Ctrl-C after this point must not call unwritten
    finally:
        shutil.rmtree(staging, ignore_errors=True)
