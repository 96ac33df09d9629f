#!/usr/bin/env python
"""Benchmark the two ways of giving fusebench the same distractor vectors: a manifest whose caption-less lines are
distractors (one image .npy per model, in manifest order) and the same rows as clip-retrieval dumps through
``gallery=vectors``. Both go through the streamed gallery search (docs/galleries.md); this measures that they cost
the same (issue 31's target: the manifest path's peak at most 2 GB at 1M images, its time within 10% of the dump
path's) and that they give the same metrics.

Writes, per model (d = --dim, float32), --images image rows in manifest order (--test-images of them with captions,
spread evenly through the manifest; 25,010 captions as COCO 5k has) and the caption rows; then the test split alone
(its own manifest and image .npy) and, per model, a dump holding the distractor rows in the order
``gallery.seed=0`` takes them (so both galleries hold the same rows in the same order). Each path runs as its own
``fusebench`` process (fusion=dbsf; the list store on, as by default, each run with an empty cache of its own, so
both compute and key their lists); wall time and peak RSS are that process's.
``--before SRC`` also runs the manifest path with ``PYTHONPATH=SRC`` (a checkout's ``src`` from before this path,
which searched caption-less lines in memory among the test images), labelled ``before``.
Usage: nice -n 5 python scripts/bench_manifest_gallery.py [--images 200000] [--dim 256] [--models 2] [--repeats 1]
       [--before /path/to/old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_common import cpu_model, run_fusebench

from fusebench.data.distractor_items import seeded_order

CHUNK = 50_000  # rows generated and written at a time
DUMP_SHARD = 100_000  # rows per dump shard (clip-retrieval writes shards of this order)


def captions_per_image(n_test: int, n_captions: int) -> np.ndarray:
    """COCO 5k's shape: 5 captions per image, a few with 6 (25,010 captions over 5,000 images)."""
    per = np.full(n_test, n_captions // n_test, dtype=np.int64)
    per[: n_captions - per.sum()] += 1
    return per


def write_inputs(folder: Path, n_images: int, n_test: int, n_captions: int, dim: int, n_models: int) -> dict:
    """The manifest, the test split and the dumps (see the module docstring), written chunk by chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    captioned = np.linspace(0, n_images - 1, n_test).round().astype(np.int64)
    per = captions_per_image(n_test, n_captions)
    caption_of = dict(zip(captioned.tolist(), per.tolist()))
    with (folder / "M.jsonl").open("w") as full, (folder / "T.jsonl").open("w") as test:
        for i in range(n_images):
            line = json.dumps({"image_id": f"im{i:08d}", "captions": [f"c{j} of {i}" for j in range(caption_of.get(i, 0))]})
            full.write(line + "\n")
            if i in caption_of:
                test.write(line + "\n")
    without = np.setdiff1d(np.arange(n_images), captioned)
    order = seeded_order(len(without), 0)  # dump row order[i] holds distractor i
    inverse = np.argsort(order)
    ids = np.array([f"im{i:08d}" for i in without], dtype=object)[inverse]
    caption_image = np.repeat(np.arange(n_test), per)
    models = {}
    for m in range(n_models):
        rng = np.random.default_rng(100 + m)
        image = np.lib.format.open_memmap(folder / f"m{m}_img.npy", mode="w+", dtype=np.float32, shape=(n_images, dim))
        for start in range(0, n_images, CHUNK):
            image[start:start + CHUNK] = rng.standard_normal((min(CHUNK, n_images - start), dim), dtype=np.float32)
        image.flush()
        text = image[captioned][caption_image] + 1.2 * rng.standard_normal((n_captions, dim), dtype=np.float32)
        np.save(folder / f"m{m}_txt.npy", text.astype(np.float32))
        np.save(folder / f"m{m}_test.npy", np.asarray(image[captioned]))
        dump = folder / f"dump{m}"
        (dump / "img_emb").mkdir(parents=True)
        (dump / "metadata").mkdir()
        for s, start in enumerate(range(0, len(without), DUMP_SHARD)):
            rows = without[inverse[start:start + DUMP_SHARD]]
            np.save(dump / "img_emb" / f"img_emb_{s:03d}.npy", np.asarray(image[rows]))
            pq.write_table(pa.table({"key": list(ids[start:start + DUMP_SHARD])}),
                           dump / "metadata" / f"metadata_{s:03d}.parquet")
        del image
        models[f"m{m}"] = dump
    return {"distractors": len(without), "dumps": models}


def overrides(folder: Path, manifest: str, image: str, n_models: int) -> list[str]:
    out = ["dataset=manifest", f"dataset.manifest={folder / manifest}", "models=[]", "fusion=dbsf", "plots=false",
           "eval.bootstrap.draws=200"]
    for m in range(n_models):
        out += [f"+models.m{m}.kind=vectors", f"+models.m{m}.image_embeddings={folder / f'm{m}_{image}.npy'}",
                f"+models.m{m}.text_embeddings={folder / f'm{m}_txt.npy'}"]
    return out


def metrics(run_dir: Path) -> dict:
    data = json.loads((run_dir / "metrics.json").read_text())
    return {name: {d: r[d] for d in ("t2i", "i2t")} for name, r in data["retrievers"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200_000, help="manifest lines (test images + distractors)")
    parser.add_argument("--test-images", type=int, default=5_000)
    parser.add_argument("--captions", type=int, default=25_010)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--before", help="a src folder to run the manifest path from as well (PYTHONPATH)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_manifest_") as tmp:
        folder = Path(tmp)
        made = write_inputs(folder, args.images, args.test_images, args.captions, args.dim, args.models)
        paths = {
            "manifest": overrides(folder, "M.jsonl", "img", args.models),
            "dump": overrides(folder, "T.jsonl", "test", args.models)
            + ["gallery=vectors", f"gallery.size={made['distractors']}", "gallery.near_duplicate=null"]
            + [f"+gallery.vectors.{name}={dump}" for name, dump in made["dumps"].items()],
        }
        if args.before:
            paths["before"] = paths["manifest"]
        results = {name: [] for name in paths}
        for r in range(args.repeats):
            for name, argv in (list(paths.items()) if r % 2 == 0 else list(reversed(paths.items()))):
                out = folder / f"run_{name}_{r}"
                saved = os.environ.get("PYTHONPATH")
                if name == "before":
                    os.environ["PYTHONPATH"] = args.before
                try:
                    seconds, peak = run_fusebench([*argv, f"hydra.run.dir={out}", f"embed.cache.dir={out}_cache"],
                                                  folder / "outputs")
                finally:
                    if saved is None:
                        os.environ.pop("PYTHONPATH", None)
                    else:
                        os.environ["PYTHONPATH"] = saved
                results[name].append((seconds, peak, metrics(out)))
        same = all(m == results["dump"][0][2] for runs in results.values() for _, _, m in runs)
    print(f"CPU: {cpu_model()}; {args.images:,} images ({args.test_images:,} with {args.captions:,} captions), "
          f"d = {args.dim}, {args.models} models, fusion=dbsf")
    best = {name: min(runs, key=lambda x: x[0]) for name, runs in results.items()}
    for name, (seconds, peak, _) in best.items():
        print(f"{name:9s} path: {seconds:8.1f} s  peak RSS {peak:5.2f} GB  (best of {args.repeats})")
    print(f"manifest / dump time: {best['manifest'][0] / best['dump'][0]:.3f}; metrics equal: {same}")
    if not same:
        sys.exit("the two paths gave different metrics")


if __name__ == "__main__":
    main()
