#!/usr/bin/env python
"""Benchmark exact search over a gallery with distractors at COCO query size against the bare streamed matmuls.

Builds, per model, 25,010 caption and 5,000 test-image vectors (d = 256 by default, from a shared latent so the
models are correlated like real ones) and N distractors (default 1,000,000) generated tile by tile from a seed,
never held whole (tests/helpers/seeded_rows.py). Reports, in one run, per model:
  * bare fp32 matmuls: the same vectors streamed through the same tiles (items outer, caption chunks inner), the
    distractor reads included (their time also shown alone), nothing else;
  * gallery_lists: both directions' lists and exact ranks (fusebench.search.gallery_search), and its ratio to the
    bare matmuls (target <= 1.3x);
  * peak resident memory: per phase (a sampler thread) and of the whole process (getrusage; target <= 4 GB);
  * a sampled exactness check: for --sample captions, their full rows recomputed in fp32 (the lists and ranks must
    be equal bit for bit) and in fp64 (the rank must equal the fp64 rank wherever no other item lies within the
    fp32 error bound 2 gamma_d of the target's score: then fp32 cannot order any item differently); and the i2t
    lists against compute_model_lists over the test images alone.
``bench_search`` runs all of it for any models and DistractorRows (the pipeline's sim distractors included);
--pipeline runs a fusebench command (for example "dataset=sim gallery=sim gallery.size=1000000") and reports its
wall time and peak memory.
Usage: python scripts/bench_scale.py [--distractors 1000000] [--dim 256] [--models 2] [--repeats 1]
       [--chunk-size 4096] [--item-chunk-size 16384] [--precision fp32|bf16|tf32] [--pipeline "OVERRIDES"]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from bench_common import cpu_model, run_fusebench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/helpers: the seeded distractors
from helpers.seeded_rows import SeededRows  # noqa: E402

from fusebench.encoders.devices import resolve_device  # noqa: E402
from fusebench.encoders.distractors import normalised  # noqa: E402
from fusebench.search.exact import float_rows, merge_topk, similarity, topk_stable  # noqa: E402
from fusebench.search.gallery_search import GalleryTiles, gallery_lists  # noqa: E402
from fusebench.search.margin import U32, gamma  # noqa: E402
from fusebench.search.model_lists import compute_model_lists, count_ahead, read_target_scores, tiles  # noqa: E402

GB = 1024**3


class PeakRss:
    """Peak resident memory (bytes) while the block runs, sampled every ``interval`` seconds from /proc."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


@dataclass
class Model:
    name: str
    text: np.ndarray  # (captions, d) normalised
    image: np.ndarray  # (test images, d) normalised
    distractors: object  # DistractorRows


def synthetic_models(n_models: int, n_captions: int, n_images: int, n_distractors: int, dim: int,
                     seed: int = 0, latent: int = 48) -> tuple[list[Model], np.ndarray]:
    """Models seeing one latent world through their own projection and noise: captions near their image's
    latent, distractors fresh latents (generated per tile from a seed)."""
    rng = np.random.default_rng(seed)
    caption_image = np.concatenate([np.arange(n_images), rng.integers(0, n_images, n_captions - n_images)])
    z = rng.standard_normal((n_images, latent), dtype=np.float32)
    z_text = z[caption_image] + 0.8 * rng.standard_normal((n_captions, latent), dtype=np.float32)
    models = []
    for m in range(n_models):
        mix = rng.standard_normal((latent, dim), dtype=np.float32) / np.float32(math.sqrt(latent))
        image = normalised(z @ mix + 0.7 * rng.standard_normal((n_images, dim), dtype=np.float32))
        text = normalised(z_text @ mix + 0.7 * rng.standard_normal((n_captions, dim), dtype=np.float32))
        models.append(Model(f"m{m}", text, image, SeededRows(n_distractors, dim, seed * 1000 + m, mix, 0.7)))
    return models, caption_image


def streamed_matmul(text, image, distractors, chunk: int, item_chunk: int, device) -> tuple[float, float]:
    """Seconds of the bare fp32 similarity blocks over the gallery in the search's tiles (reads included), and
    of the reads alone."""
    text = float_rows(text, device)
    gallery = GalleryTiles(np.asarray(image, dtype=np.float32), distractors, min(item_chunk, len(image) + distractors.n))
    chunk = min(chunk, text.shape[0])
    buffer = torch.empty(chunk * gallery.tiles[0][1], device=device)
    reading = 0.0
    start = time.perf_counter()
    for t in range(len(gallery.tiles)):
        began = time.perf_counter()
        items = float_rows(gallery.rows(t), device)
        reading += time.perf_counter() - began
        for r0, r1 in tiles(text.shape[0], chunk):
            similarity(text[r0:r1], items, out=buffer[: (r1 - r0) * len(items)].view(r1 - r0, len(items)))
        del items
        gallery.release(t)
    sync(device)
    return time.perf_counter() - start, reading


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def sampled_check(lists, text, image, caption_image, distractors, item_chunk: int, sample: int, seed: int = 1) -> dict:
    """Full rows of ``sample`` captions recomputed over the whole gallery, in fp32 (same item tiles) and fp64."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(text), min(sample, len(text)), replace=False))
    q32 = torch.from_numpy(np.ascontiguousarray(text[rows]))
    q64 = q32.double()
    target = torch.as_tensor(caption_image[rows], dtype=torch.int64)
    gallery = GalleryTiles(np.asarray(image, dtype=np.float32), distractors, min(item_chunk, len(image) + distractors.n))
    k = lists["t2i"].ids.numpy().shape[1]
    score32 = torch.full((len(rows),), math.nan)
    score64 = torch.full((len(rows),), math.nan, dtype=torch.float64)
    for t, (c0, _) in enumerate(gallery.tiles):  # the targets' scores first, from their own tiles' blocks
        if c0 < len(image):
            items = float_rows(gallery.rows(t))
            read_target_scores(similarity(q32, items), 0, c0, target, score32)
            read_target_scores(q64 @ items.double().T, 0, c0, target, score64)
    ahead32 = torch.zeros(len(rows), dtype=torch.int64)
    ahead64 = torch.zeros(len(rows), dtype=torch.int64)
    near = torch.zeros(len(rows), dtype=torch.int64)
    vals = torch.full((len(rows), k), -math.inf)
    ids = torch.full((len(rows), k), -1, dtype=torch.int64)
    for t, (c0, _) in enumerate(gallery.tiles):
        items = float_rows(gallery.rows(t))
        block = similarity(q32, items)
        ahead32 += count_ahead(block, c0, target, score32)
        top, at = topk_stable(block, min(k, block.shape[1]))
        vals, ids = merge_topk([(vals, ids), (top, at + c0)], k)
        exact = q64 @ items.double().T
        ahead64 += count_ahead(exact, c0, target, score64)
        window = 2 * gamma(q32.shape[1], U32) * q64.norm(dim=1) * items.double().norm(dim=1).max() + 1e-12
        near += ((exact - score64[:, None]).abs() <= window[:, None]).sum(dim=1)
        del items
        gallery.release(t)
    near -= 1  # the target itself
    ours = lists["t2i"].ranks[rows]
    certain = near.numpy() == 0
    query_images = np.unique(caption_image)
    alone = compute_model_lists(text, image, caption_image, lists.depth)
    return {
        "sampled": len(rows),
        "fp32_lists_equal": bool(np.array_equal(ids.numpy(), lists["t2i"].ids.numpy()[rows])
                                 and np.array_equal(vals.numpy(), lists["t2i"].scores.numpy()[rows])),
        "fp32_ranks_equal": bool(np.array_equal(ahead32.numpy() + 1, ours)),
        "fp64_checked": int(certain.sum()),
        "fp64_ranks_equal": int((ahead64.numpy()[certain] + 1 == ours[certain]).sum()),
        "fp64_equal_where_near_ties": int((ahead64.numpy()[~certain] + 1 == ours[~certain]).sum()),
        "i2t_equal_test_only": all(np.array_equal(alone.arrays()[f"i2t_{a}"], lists.arrays()[f"i2t_{a}"])
                                   for a in ("ids", "scores", "ranks")) and len(query_images) > 0,
        "t2i_r1": float((ours == 1).mean()),
    }


def bench_search(models: list[Model], caption_image: np.ndarray, depth: int = 100, device="cpu", chunk: int = 4096,
                 item_chunk: int = 16384, precision: str | None = None, sample: int = 200, repeats: int = 1,
                 log=print) -> dict:
    """Bare streamed matmuls, gallery_lists and the sampled check for each model (interleaved when repeated):
    seconds (the minimum over repeats), ratio, peak memory per phase and of the process, check results.
    ``models``: anything with ``name``, ``text``, ``image`` and ``distractors`` (a DistractorRows): this script's
    ``Model``, or the ``ModelEmbeddings`` of a run with a gallery (``gallery=sim gallery.size=...``)."""
    device = torch.device(device)
    out = {"models": {}, "gallery": len(models[0].image) + models[0].distractors.n, "captions": len(caption_image)}
    for model in models:
        out["models"][model.name] = {"bare_s": [], "read_s": [], "search_s": [], "bare_cpu_s": [], "search_cpu_s": [],
                                     "bare_rss_gb": 0.0, "search_rss_gb": 0.0}
    for _ in range(repeats):
        for model in models:
            record = out["models"][model.name]
            with PeakRss() as rss:
                cpu = time.process_time()
                seconds, reading = streamed_matmul(model.text, model.image, model.distractors, chunk, item_chunk, device)
                record["bare_cpu_s"].append(time.process_time() - cpu)
            record["bare_s"].append(seconds)
            record["read_s"].append(reading)
            log(f"    {model.name}: bare {seconds:.1f} s (reads {reading:.1f} s)", flush=True)
            record["bare_rss_gb"] = max(record["bare_rss_gb"], rss.peak / GB)
            stats: dict = {}
            with PeakRss() as rss:
                start, cpu = time.perf_counter(), time.process_time()
                lists = gallery_lists(model.text, model.image, caption_image, model.distractors, depth, device, chunk,
                                      item_chunk, precision=precision, stats=stats)
                sync(device)
                record["search_s"].append(time.perf_counter() - start)
                record["search_cpu_s"].append(time.process_time() - cpu)
            record["search_rss_gb"] = max(record["search_rss_gb"], rss.peak / GB)
            log(f"    {model.name}: gallery_lists {record['search_s'][-1]:.1f} s", flush=True)
            record["rescored"] = stats["rescored"]
            record["precision"] = stats["precision"]
            record["lists"] = lists
    for model in models:
        record = out["models"][model.name]
        record["ratio"] = min(record["search_s"]) / min(record["bare_s"])
        record["cpu_ratio"] = min(record["search_cpu_s"]) / min(record["bare_cpu_s"])  # steadier on a shared machine
        reads = min(record["read_s"])  # the same rows generated in both: the ratio of what is left
        record["ratio_without_reads"] = (min(record["search_s"]) - reads) / (min(record["bare_s"]) - reads)
        lists = record.pop("lists")
        if sample:
            record["check"] = sampled_check(lists, model.text, model.image, caption_image, model.distractors,
                                            item_chunk, sample)
    out["process_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    return out


def warm_kernels() -> None:
    """Compile (or load) the kernels once, outside every timing."""
    models, caption_image = synthetic_models(1, 300, 200, 500, 16)
    gallery_lists(models[0].text, models[0].image, caption_image, models[0].distractors, 10, "cpu", 128, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distractors", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--captions", type=int, default=25_010)
    parser.add_argument("--images", type=int, default=5_000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--item-chunk-size", type=int, default=16384)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default=None, choices=["fp32", "bf16", "tf32"])
    parser.add_argument("--sample", type=int, default=200, help="captions checked against full fp32 / fp64 rows")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats; the minimum time is reported")
    parser.add_argument("--pipeline", help="also time `fusebench OVERRIDES` (e.g. 'gallery=sim gallery.size=1000000')")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    device = resolve_device(args.device)
    print(f"CPU: {cpu_model()}  threads: {torch.get_num_threads()}  device: {device}")
    warm_kernels()
    models, caption_image = synthetic_models(args.models, args.captions, args.images, args.distractors, args.dim)
    print(f"{args.captions} captions x ({args.images} test + {args.distractors} distractor) images, d = {args.dim}, "
          f"{args.models} model(s), tiles {args.chunk_size} x {args.item_chunk_size}, depth {args.depth}")
    result = bench_search(models, caption_image, args.depth, device, args.chunk_size, args.item_chunk_size,
                          args.precision, args.sample, args.repeats)
    for name, record in result["models"].items():
        print(f"  {name}: bare fp32 matmuls {min(record['bare_s']):7.1f} s (reads {min(record['read_s']):.1f} s)  "
              f"gallery_lists {min(record['search_s']):7.1f} s ({record['precision']}, {record['rescored']} rescored)"
              f"  ratio {record['ratio']:.2f}x ({record['ratio_without_reads']:.2f}x without the reads)  "
              f"peak RSS bare {record['bare_rss_gb']:.2f} GB, "
              f"search {record['search_rss_gb']:.2f} GB")
        print(f"      runs: bare {[round(s, 1) for s in record['bare_s']]}  search "
              f"{[round(s, 1) for s in record['search_s']]}  CPU seconds: bare {[round(s) for s in record['bare_cpu_s']]}"
              f"  search {[round(s) for s in record['search_cpu_s']]}  CPU ratio {record['cpu_ratio']:.2f}x")
        if "check" in record:
            c = record["check"]
            print(f"      check: {c['sampled']} sampled captions: fp32 lists equal {c['fp32_lists_equal']}, "
                  f"fp32 ranks equal {c['fp32_ranks_equal']}; fp64 rank equal on {c['fp64_ranks_equal']} of "
                  f"{c['fp64_checked']} free of near ties (and on {c['fp64_equal_where_near_ties']} of the others); "
                  f"i2t equal to the test-only search {c['i2t_equal_test_only']}; t2i R@1 {c['t2i_r1']:.3f}")
    total_bare = sum(min(r["bare_s"]) for r in result["models"].values())
    total_search = sum(min(r["search_s"]) for r in result["models"].values())
    print(f"  all models: bare {total_bare:.1f} s, search {total_search:.1f} s, ratio {total_search / total_bare:.2f}x "
          f"(target <= 1.3x); process peak RSS {result['process_peak_rss_gb']:.2f} GB (target <= 4 GB)")
    if args.pipeline:
        with tempfile.TemporaryDirectory() as folder:
            seconds, peak = run_fusebench(args.pipeline.split(), Path(folder))
        result["pipeline"] = {"args": args.pipeline, "seconds": seconds, "peak_rss_gb": peak}
        print(f"  fusebench {args.pipeline}: {seconds:.1f} s, peak RSS {peak:.2f} GB")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
