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

``--index PRESET`` (e.g. ``faiss_ivf_flat``) then times a rerun over a stored index (issue 41, item 5): the dump
path with ``search=PRESET`` (and ``--index-overrides``, e.g. ``search.nprobe=4``) run twice on one cache, the first
building the index and storing the exact lists, the second reading both; the rerun's wall time and peak, its index
search seconds (``query_ms`` x captions, per model, from its metrics.json) and the rest (reading, fusing,
evaluating, writing), all against the bare fp32 matmuls of the same vectors (every model's captions against its
whole gallery in the search's tiles, reads excluded: ``bench_scale.streamed_matmul``), timed in this process.
Usage: nice -n 5 python scripts/bench_manifest_gallery.py [--images 200000] [--dim 256] [--models 2] [--repeats 1]
       [--before /path/to/old/src] [--index faiss_ivf_flat [--index-overrides "search.nprobe=4"]] [--skip-exact]
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
from fusebench.encoders.distractors import normalised
from fusebench.encoders.vectors import ManifestRows

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


def bare_matmuls(folder: Path, n_images: int, n_test: int, n_models: int) -> float:
    """Seconds of the bare fp32 similarity blocks of every model's captions against its whole gallery (the
    manifest's rows: test images, then the caption-less lines), in the search's tiles, reads excluded."""
    import torch
    from bench_scale import streamed_matmul

    captioned = np.linspace(0, n_images - 1, n_test).round().astype(np.int64)
    without = np.setdiff1d(np.arange(n_images), captioned)
    seconds = 0.0
    for m in range(n_models):
        image = folder / f"m{m}_img.npy"
        test = normalised(ManifestRows(image, captioned).raw(0, n_test))
        text = normalised(np.load(folder / f"m{m}_txt.npy"))
        total, reading = streamed_matmul(text, test, ManifestRows(image, without), 4096, 16384, torch.device("cpu"))
        seconds += total - reading
    return seconds


def index_rerun(folder: Path, argv: list[str], preset: str, extra: list[str], n_captions: int) -> dict:
    """The dump path with ``search=preset`` twice on one cache: (build wall, rerun wall, rerun peak GB, rerun's
    index search seconds, whether the rerun read the index and the exact lists, each model's setting and neighbour
    recall)."""
    argv = [*argv, f"search={preset}", *extra, f"embed.cache.dir={folder / 'index_cache'}"]
    build, _ = run_fusebench([*argv, f"hydra.run.dir={folder / 'index_build'}"], folder / "outputs")
    wall, peak = run_fusebench([*argv, f"hydra.run.dir={folder / 'index_rerun'}"], folder / "outputs")
    record = json.loads((folder / "index_rerun" / "metrics.json").read_text())
    costs = [models["t2i"] for models in record["search"]["models"].values()]
    lists = record["run"]["lists"].values()
    return {"build": build, "wall": wall, "peak": peak,
            "search": sum(c["query_ms"] for c in costs) * n_captions / 1000,
            "read": all(c["hit"] for c in costs) and all(entry["hit"] for entry in lists),
            "settings": "; ".join(f"{name}: {record['search']['params']['t2i'].get(name, record['search']['params']['t2i'])}"
                                  f", neighbour recall {m['t2i']['neighbour_recall']:.3f}"
                                  for name, m in record["search"]["models"].items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200_000, help="manifest lines (test images + distractors)")
    parser.add_argument("--test-images", type=int, default=5_000)
    parser.add_argument("--captions", type=int, default=25_010)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--before", help="a src folder to run the manifest path from as well (PYTHONPATH)")
    parser.add_argument("--index", help="a search preset (faiss_ivf_flat): time a rerun over its stored index")
    parser.add_argument("--index-overrides", default="", help="overrides for the index runs (search.nprobe=4)")
    parser.add_argument("--skip-exact", action="store_true", help="only the index rerun (with --index)")
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
        rerun = None
        if args.index:
            rerun = index_rerun(folder, paths["dump"], args.index, args.index_overrides.split(), args.captions)
            rerun["matmuls"] = bare_matmuls(folder, args.images, args.test_images, args.models)
        if args.skip_exact:
            paths = {}
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
        same = all(m == results["dump"][0][2] for runs in results.values() for _, _, m in runs) if results else True
    print(f"CPU: {cpu_model()}; {args.images:,} images ({args.test_images:,} with {args.captions:,} captions), "
          f"d = {args.dim}, {args.models} models, fusion=dbsf")
    if rerun is not None:
        print(f"bare fp32 matmuls of the same vectors: {rerun['matmuls']:.1f} s")
        print(f"search={args.index} {args.index_overrides}: build run {rerun['build']:.1f} s; rerun {rerun['wall']:.1f} s "
              f"({rerun['wall'] / rerun['matmuls']:.3f}x the matmuls), peak RSS {rerun['peak']:.2f} GB, index and "
              f"lists read: {rerun['read']}; its index search {rerun['search']:.1f} s "
              f"({rerun['search'] / rerun['matmuls']:.3f}x), the rest {rerun['wall'] - rerun['search']:.1f} s "
              f"({(rerun['wall'] - rerun['search']) / rerun['matmuls']:.3f}x); {rerun['settings']}")
    best = {name: min(runs, key=lambda x: x[0]) for name, runs in results.items()}
    for name, (seconds, peak, _) in best.items():
        print(f"{name:9s} path: {seconds:8.1f} s  peak RSS {peak:5.2f} GB  (best of {args.repeats})")
    if "manifest" in best:
        print(f"manifest / dump time: {best['manifest'][0] / best['dump'][0]:.3f}; metrics equal: {same}")
    if not same:
        sys.exit("the two paths gave different metrics")


if __name__ == "__main__":
    main()
