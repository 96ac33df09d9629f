"""Write a run's outputs: ranks/, topk/ and metrics.json, all or nothing.

Everything is first written into a hidden staging folder inside the run dir and moved into place only
once complete; metrics.json is written last, via a temp file and an atomic rename, so its presence means
the run finished. metrics.json records the sha256 of every file in ranks/ and topk/ (``files``), so that
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

from fusebench.files import atomic_write_text, remembered_checksum
from fusebench.record import RunRecord


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


# what a run writes into its dir: (name, the file patterns a folder of that name may hold)
RUN_OUTPUTS = {"metrics.json": None, "error.txt": None, "ranks": ("*.npy", "*.npz"), "topk": ("*.npz",),
               "plots": ("*.png",)}


def clear_run_outputs(out_dir: str | Path) -> list[str]:
    """Remove the outputs of an earlier run from ``out_dir`` (metrics.json first, so the dir never reads as
    finished); a folder is removed only when it holds nothing but files of the kind fusebench writes there.
    Returns what was removed."""
    out_dir, removed = Path(out_dir), []
    for name, patterns in RUN_OUTPUTS.items():
        path = out_dir / name
        if patterns is None and path.is_file():
            path.unlink()
            removed.append(name)
        elif patterns is not None and path.is_dir():
            files = list(path.iterdir())
            if all(f.is_file() and any(f.match(p) for p in patterns) for f in files):
                shutil.rmtree(path)
                removed.append(name + "/")
    return removed


def write_run_outputs(out_dir: str | Path, lists: dict, record: RunRecord, save_topk: int | None,
                      queries: dict | None = None) -> None:
    """``lists``: {retriever: {direction: RankedLists}}; ``save_topk`` caps the saved list length (None = all).

    ``queries`` ({"t2i": caption -> image index, "i2t": query image indices}) is saved as ranks/queries.npz so
    that runs can be compared query by query (and image-clustered) after the fact.
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
        files = {f"{sub}/{f.name}": remembered_checksum(f) for sub in ("ranks", "topk") for f in sorted((staging / sub).iterdir())}
        for sub in ("ranks", "topk"):
            target = out_dir / sub
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging / sub, target)
        record.files = files  # checksums: a report never trusts a rank file changed after the run
        atomic_write_text(out_dir / "metrics.json", json.dumps(_clean(record.to_json()), indent=2) + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
