"""A slice job (``gallery.slice=N`` with ``gallery.slices=S``): slice N of every model's exact search over the
gallery, stored in the slice store for the run that merges them (docs/galleries.md, "Searching one gallery in many
jobs"). Nothing is evaluated: the job dir gets ``slice.json`` (per model: the slice's items, its store key, read or
computed, seconds; the job's seconds and peak memory) and no metrics.json.

    fusebench -m dataset=sim gallery=sim gallery.size=1000000 gallery.slices=8 'gallery.slice=range(0,8)' \\
        hydra/launcher=joblib hydra.launcher.n_jobs=2          # or hydra/launcher=submitit_slurm
    fusebench dataset=sim gallery=sim gallery.size=1000000 gallery.slices=8     # the merge, fusion and evaluation
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from fusebench.backends.gallery_slices import Slicing, model_slice
from fusebench.backends.retrieval import ListSource, SearchSettings, list_depth
from fusebench.config.run import RunConfig
from fusebench.runtime.progress import bar as progress_bar
from fusebench.stores.files import atomic_write_text

log = logging.getLogger(__name__)
RECORD = "slice.json"


def search_slice(config: RunConfig, embeddings: list, caption_image, settings: SearchSettings, keep_k: int | None,
                 out_dir: str | None) -> dict:
    """Slice ``gallery.slice`` of every model (read from the slice store, or computed and stored); ``slice.json`` in
    ``out_dir``; one line printed. Returns what slice.json holds."""
    gallery = config.gallery
    index, slices = gallery.slice, gallery.slices
    depth = list_depth(config.fusion, keep_k, settings)  # the depth the merge run searches at
    source = ListSource()
    source.prepare(embeddings, caption_image, torch.device(settings.device).type)
    started = time.time()
    record = {"slice": index, "slices": slices, "depth": depth, "models": {}}
    for model in embeddings:
        slicing = Slicing.of(model, slices, settings.item_chunk_size)
        start, stop = slicing.bounds(index)
        with progress_bar(total=len(caption_image), desc=f"slice {index}/{slices} {model.name}", unit="caption",
                          leave=False) as bar:
            found = model_slice(model, caption_image, depth, settings, source.materials[model.name], slicing, index,
                                bar.update)
        record["models"][model.name] = {"start": start, "stop": stop, "items": stop - start, "key": found.key,
                                        "hit": found.hit, "seconds": round(found.seconds, 3)}
        log.info("slice %d of %d, model %s: items %d..%d %s (%.1f s)", index, slices, model.name, start, stop - 1,
                 "read from the slice store" if found.hit else "computed and stored", found.seconds)
    record["seconds"] = round(time.time() - started, 3)
    record["peak_rss_gb"] = peak_rss_gb()
    if out_dir is not None:
        atomic_write_text(Path(out_dir) / RECORD, json.dumps(record, indent=2))
    done = ", ".join(f"{name} items {m['start']:,}..{m['stop'] - 1:,} ({'stored already' if m['hit'] else 'computed'})"
                     for name, m in record["models"].items())
    print(f"fusebench: gallery slice {index} of {slices} in the slice store: {done}. Merge with the same command "
          f"without gallery.slice.")
    return record


def peak_rss_gb() -> float | None:
    """This process's peak resident memory so far (VmHWM), in GB; None where /proc does not say. A launcher that
    runs several jobs in one worker (joblib) gives the largest of them."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) * 1024 / 1e9, 3)
    except (OSError, ValueError):
        pass
    return None


def slice_summary(folder: Path) -> list[str]:
    """The end of a multirun of slice jobs: print and write (``slices.json`` in the sweep dir) the jobs done and
    those that failed or were killed (no slice.json: their slices are computed again by a rerun, or by the merge
    run itself). Returns the failed job dirs."""
    done, failed, lines = [], [], []
    for job in sorted((p for p in Path(folder).iterdir() if p.is_dir() and (p / ".hydra").is_dir()),
                      key=lambda p: (len(p.name), p.name)):
        record = job / RECORD
        if record.is_file() and not (job / "error.txt").is_file():
            done.append(json.loads(record.read_text(encoding="utf-8"))["slice"])
            continue
        failed.append(job.name)
        error = (job / "error.txt").read_text(encoding="utf-8").splitlines()[:1] if (job / "error.txt").is_file() else []
        lines.append(f"  job {job.name}: {error[0] if error else 'no slice.json (killed, or still running)'}")
    text = [f"fusebench: {len(done) + len(failed)} slice job(s) in {folder}: {len(done)} done (slices "
            f"{', '.join(map(str, sorted(done))) or 'none'}), {len(failed)} failed", *lines,
            "  merge them with the same command, without -m and gallery.slice (a slice not stored is computed by the "
            "merge run; a rerun of this sweep reads the finished slices and computes the others)"]
    print("\n".join(text))
    atomic_write_text(Path(folder) / "slices.json", json.dumps({"done": sorted(done), "failed": failed,
                                                                "problems": lines}, indent=2))
    return failed
