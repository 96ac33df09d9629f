#!/usr/bin/env python
"""Benchmark the core evaluator at COCO 5k size against the bare similarity matmuls and a per-query Python fusion.

Builds 25,010 caption x 5,000 image vectors for two models (d = 1,152 and 1,024, correlated like real
models so ranks and fusion behave realistically) and reports, in one run:
  * bare fp32 matmuls: text @ image.T for both models, in the evaluator's block size, nothing else;
  * the whole evaluation: both directions, singles + fusion (default DBSF by source object), ranks,
    recall, and every paired comparison with a 2,000-draw bootstrap (query and image-clustered);
  * fusion alone (vectorised) vs the same fusion written per query in plain Python (timed on a sample of
    queries and scaled to all of them);
  * the same evaluation warm: every model's lists read from the list store (no similarity computed);
  * one 2,000-draw paired bootstrap on 25,010 queries;
  * peak resident memory of the process;
  * --cli: the documented vectors command through the fusebench CLI on the same two models (process
    start, loading vectors, search, outputs, plots; empty caches) against the bare matmuls, and the floor
    under it: a fresh interpreter importing the pipeline, plus the same matmuls in bf16;
  * --distractors: fusebench on dataset=sim with 100,000 images (90,000 without captions) and 10,000
    captions, two models, empty caches: wall time and peak memory (target under 3 GB);
  * --lists N: each model's lists alone (``compute_model_lists``: matmuls, both directions' heaps, exact ranks)
    against its bare matmuls, in N interleaved pairs per model: the median ratio of wall time and of CPU time
    (``time.process_time``, which a busy neighbour on a shared machine disturbs less), with the quartiles;
  * --row-orders: the row orders the score store keeps for RRF over whole rankings (``row_kernels.row_order``, a
    radix sort) of the first model's 25,010 x 5,000 score matrix and of its transpose, against numpy's sort of the
    same int64 keys (score's order-preserving bits, column index), the sort it replaced, 1 MB of keys at a time as
    it was done (the keys built here with torch, somewhat slower than the numba kernel that built them), median of 3.
Usage: python scripts/bench_eval.py [--device auto|cpu|cuda] [--method dbsf] [--cli] [--distractors] [--lists N]
       [--row-orders]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import cpu_model, default_job_models, run_fusebench

from fusebench import FUSED
from fusebench.backends.retrieval import SearchSettings, retrieve
from fusebench.encoders.devices import resolve_device
from fusebench.evaluation.comparisons import paired_comparisons, retriever_result
from fusebench.evaluation.metrics import hits_at_k
from fusebench.evaluation.stats import paired_bootstrap
from fusebench.fusion.combine import fuse_in_blocks
from fusebench.fusion.config import FusionConfig
from fusebench.search.exact import descending_keys, float_rows
from fusebench.search.model_lists import compute_model_lists


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_matmuls(models, chunk: int, device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    images = [float_rows(m.image, device).to(dtype) for m in models]
    texts = [float_rows(m.text, device).to(dtype) for m in models]
    sync(device)
    start = time.perf_counter()
    for text, image in zip(texts, images):
        for r in range(0, text.shape[0], chunk):
            scores = text[r:r + chunk] @ image.T
            del scores
    sync(device)
    return time.perf_counter() - start


def lists_over_matmuls(models, corpus, chunk: int, device: torch.device, pairs: int) -> dict:
    """Each model's lists alone against its bare matmuls, interleaved ``pairs`` times per model: the median and
    quartiles of the wall-time and CPU-time ratios."""
    wall, cpu = [], []
    for _ in range(pairs):
        for m in models:
            start, start_cpu = time.perf_counter(), time.process_time()
            bare_matmuls([m], chunk, device)
            matmul, matmul_cpu = time.perf_counter() - start, time.process_time() - start_cpu
            start, start_cpu = time.perf_counter(), time.process_time()
            compute_model_lists(m.text, m.image, corpus.caption_image, 100, device, chunk)
            sync(device)
            wall.append((time.perf_counter() - start) / matmul)
            cpu.append((time.process_time() - start_cpu) / matmul_cpu)
    return {kind: [round(float(v), 3) for v in np.percentile(ratios, [50, 25, 75])]
            for kind, ratios in (("wall", wall), ("cpu", cpu))}


def row_order_seconds(scores: np.ndarray, repeats: int = 3) -> tuple[float, float]:
    """Median seconds of ``row_order`` (uint16) and of numpy's sort of the same int64 keys, on two threads alike."""
    from fusebench.search.row_kernels import _on_threads, row_order

    def numpy_keys(block: np.ndarray) -> np.ndarray:
        out = np.empty(block.shape, dtype=np.uint16)

        def rows(r0: int, r1: int) -> None:  # as row_order did: 1 MB of keys at a time, in the core's cache
            group = max(1, (1 << 17) // block.shape[1])
            for g0 in range(r0, r1, group):
                g1 = min(r1, g0 + group)
                keys = descending_keys(torch.from_numpy(block[g0:g1]),
                                       torch.arange(block.shape[1]).expand(g1 - g0, -1)).numpy()
                keys.sort(axis=1)
                out[g0:g1] = keys & 0xFFFFFFFF
        _on_threads(rows, len(block), block.size)
        return out

    times = {f: [] for f in ("radix", "numpy")}
    for _ in range(repeats):
        for name, order in (("radix", lambda b: row_order(b, np.uint16)), ("numpy", numpy_keys)):
            start = time.perf_counter()
            got = order(scores)
            times[name].append(time.perf_counter() - start)
        assert np.array_equal(got, row_order(scores, np.uint16))
    return float(np.median(times["radix"])), float(np.median(times["numpy"]))


def import_seconds(repeats: int = 3) -> float:
    """Median wall time of a fresh interpreter that imports what every fusebench run imports (the pipeline:
    torch, numba, Hydra, ...) and exits: the part of a CLI run no faster search can remove."""
    code = "import fusebench.app.cli, fusebench.app.pipeline"
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def python_fusion(lists, method: str, rows: np.ndarray, final_k: int) -> float:
    """The obvious per-query fusion: Python lists and a dict per query (DBSF/zscore via statistics)."""
    start = time.perf_counter()
    for row in rows:
        table: dict[int, float] = {}
        for ids, scores in lists:
            hit_ids = ids[row].tolist()
            hit_scores = scores[row].tolist()
            if method == "rrf":
                evidence = [1.0 / (60 + r + 1) for r in range(len(hit_scores))]
            else:
                mean = sum(hit_scores) / len(hit_scores)
                sd = (sum((s - mean) ** 2 for s in hit_scores) / len(hit_scores)) ** 0.5
                evidence = [(s - (mean - 3 * sd)) / (6 * sd) if sd > 0 else 0.5 for s in hit_scores]
            for item, value in zip(hit_ids, evidence):
                table[item] = table.get(item, 0.0) + value
        sorted(table.items(), key=lambda kv: -kv[1])[:final_k]
    return time.perf_counter() - start


def evaluate(models, corpus, fusion, settings: SearchSettings, device) -> tuple[float, dict]:
    """The whole evaluation (lists, fusion, ranks, recall, 12 comparisons x 2 bootstraps); seconds and ranks."""
    sync(device)
    start = time.perf_counter()
    lists = retrieve(models, corpus.caption_image, fusion, keep_k=25, settings=settings)
    ranks = {name: {d: lists[name][d].ranks for d in ("t2i", "i2t")} for name in lists}
    for name in lists:
        retriever_result(name, ranks[name], [1, 5, 10], {})
    clusters = {"t2i": corpus.caption_image, "i2t": corpus.i2t_query_images}
    comparisons = paired_comparisons(ranks, [FUSED], [m.name for m in models], clusters, [1, 5, 10], 2000, 0.95, 0)
    sync(device)
    return time.perf_counter() - start, ranks, comparisons


def vectors_command(models, corpus, folder: Path, method: str) -> list[str]:
    """Write the manifest and .npy files of ``models`` over ``corpus``; return the documented command's overrides."""
    counts = corpus.captions_per_image
    start = np.concatenate([[0], np.cumsum(counts)])
    with open(folder / "M.jsonl", "w", encoding="utf-8") as fh:
        for i, image_id in enumerate(corpus.image_ids):
            fh.write(json.dumps({"image_id": image_id, "captions": corpus.captions[start[i]:start[i + 1]]}) + "\n")
    args = ["dataset=manifest", f"dataset.manifest={folder / 'M.jsonl'}", "models=[]"]
    for m in models:
        np.save(folder / f"{m.name}_img.npy", m.image)
        np.save(folder / f"{m.name}_txt.npy", m.text)
        args += [f"+models.{m.name}.kind=vectors", f"+models.{m.name}.image_embeddings={folder / (m.name + '_img.npy')}",
                 f"+models.{m.name}.text_embeddings={folder / (m.name + '_txt.npy')}"]
    return args + [f"fusion={method}", "fusion.fuse_on=source_object", "fusion.top_k=100",
                   "eval.bootstrap.draws=2000", "logger=none", f"hydra.run.dir={folder / 'run'}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--method", default="dbsf", choices=("dbsf", "rrf"))
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--python-sample", type=int, default=3000)
    parser.add_argument("--cli", action="store_true", help="also time the vectors command through the CLI")
    parser.add_argument("--distractors", action="store_true", help="also run 100,000 images x 10,000 captions")
    parser.add_argument("--lists", type=int, default=0, metavar="N",
                        help="also time each model's lists alone against its matmuls, N interleaved pairs per model")
    parser.add_argument("--row-orders", action="store_true", help="also time the score store's row orders")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    device = resolve_device(args.device)
    torch.set_float32_matmul_precision("highest")

    corpus, models = default_job_models()
    fusion = FusionConfig(method=args.method, fuse_on="source_object", top_k=100)

    bare_matmuls(models, args.chunk_size, device)  # warm-up (thread pools, allocator)
    t_matmul = bare_matmuls(models, args.chunk_size, device)

    settings = SearchSettings(device=device, chunk_size=args.chunk_size)
    evaluate(models, corpus, fusion, settings, device)  # warm-up (kernel compile or load, allocator)
    t_eval, ranks, comparisons = evaluate(models, corpus, fusion, settings, device)
    with tempfile.TemporaryDirectory() as store:
        stored = SearchSettings(device=device, chunk_size=args.chunk_size, store_dir=store)
        evaluate(models, corpus, fusion, stored, device)  # fills the store
        t_warm, warm_ranks, _ = evaluate(models, corpus, fusion, stored, device)
    assert all(np.array_equal(ranks[n][d], warm_ranks[n][d]) for n in ranks for d in ("t2i", "i2t"))

    # the per-model top-100 lists both fusions consume (the evaluation above kept only 25 per list)
    full = retrieve(models, corpus.caption_image, FusionConfig(method="none", top_k=100), keep_k=100,
                    settings=settings)
    t_fuse_vec = t_fuse_py_all = 0.0
    rng = np.random.default_rng(0)
    for direction in ("t2i", "i2t"):
        single = [(full[m.name][direction].ids, full[m.name][direction].scores) for m in models]
        start = time.perf_counter()
        fuse_in_blocks([ids for ids, _ in single], [scores for _, scores in single], fusion, 100)
        t_fuse_vec += time.perf_counter() - start
        queries = single[0][0].shape[0]
        sample = rng.choice(queries, size=min(args.python_sample, queries), replace=False)
        t_sample = python_fusion([(i.numpy(), s.numpy()) for i, s in single], args.method, sample, 100)
        t_fuse_py_all += t_sample * queries / len(sample)

    cand = hits_at_k(ranks[FUSED]["t2i"], 1)
    base = hits_at_k(ranks[models[0].name]["t2i"], 1)
    start = time.perf_counter()
    repeats = 50
    for seed in range(repeats):
        paired_bootstrap(cand, base, draws=2000, seed=seed)
    t_boot = (time.perf_counter() - start) / repeats

    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    result = {
        "cpu": cpu_model(), "device": str(device), "threads": torch.get_num_threads(), "method": args.method,
        "bare_matmul_s": round(t_matmul, 3), "evaluation_s": round(t_eval, 3),
        "evaluation_over_matmul": round(t_eval / t_matmul, 2), "evaluation_warm_s": round(t_warm, 3),
        "warm_over_cold": round(t_warm / t_eval, 3),
        "fusion_vectorised_s": round(t_fuse_vec, 3), "fusion_python_s_scaled": round(t_fuse_py_all, 2),
        "fusion_speedup": round(t_fuse_py_all / t_fuse_vec, 1),
        "bootstrap_2000_draws_ms": round(1000 * t_boot, 3), "peak_rss_gb": round(peak_gb, 2),
        "comparisons": len(comparisons),
        "t2i_R@1": {n: round(float((ranks[n]["t2i"] == 1).mean() * 100), 2) for n in ranks},
    }
    if args.cli:
        with tempfile.TemporaryDirectory() as folder:
            command = vectors_command(models, corpus, Path(folder), args.method)
            result["cli_cold_s"], result["cli_peak_gb"] = (round(v, 3) for v in run_fusebench(command, Path(folder) / "out"))
            result["cli_over_matmul"] = round(result["cli_cold_s"] / t_matmul, 2)
        # the CLI's floor: what no search can remove (process start and imports) plus the cheapest candidate
        # scoring on offer (the same matmuls in bf16; exact rescoring, loading, Hydra, outputs, plots come on top)
        bare_matmuls(models, args.chunk_size, device, torch.bfloat16)  # warm-up
        result["bf16_matmul_s"] = round(bare_matmuls(models, args.chunk_size, device, torch.bfloat16), 3)
        result["imports_s"] = round(import_seconds(), 3)
        result["cli_floor_over_matmul"] = round((result["imports_s"] + result["bf16_matmul_s"]) / t_matmul, 2)
    if args.lists:
        result["lists_over_matmul"] = lists_over_matmuls(models, corpus, args.chunk_size, device, args.lists)
    if args.row_orders:
        t2i = (torch.from_numpy(models[0].text) @ torch.from_numpy(models[0].image).T).numpy()
        for name, block in (("t2i", t2i), ("i2t", np.ascontiguousarray(t2i.T))):
            result[f"row_order_{name}_s"] = [round(v, 3) for v in row_order_seconds(block)]
        del t2i
    if args.distractors:
        with tempfile.TemporaryDirectory() as folder:
            wall, peak = run_fusebench(["dataset=sim", "dataset.n_images=100000", "dataset.n_captions=10000", "logger=none",
                                  "plots=false", f"hydra.run.dir={folder}/run"], Path(folder) / "out")
            result["distractors_100k_s"], result["distractors_100k_peak_gb"] = round(wall, 2), round(peak, 2)
    print(f"CPU {result['cpu']}; device {result['device']} ({result['threads']} threads), fusion {args.method} "
          "by source object, top_k 100")
    print(f"  bare fp32 matmuls (2 models)        {t_matmul:8.3f} s")
    print(f"  whole evaluation (both directions)  {t_eval:8.3f} s   = {t_eval / t_matmul:.2f}x the matmuls   (target <= 1.5x)")
    print(f"  the same, lists from the store      {t_warm:8.3f} s   = {t_warm / t_eval:.2f}x the cold evaluation (target <= 0.25x)")
    if args.cli:
        print(f"  CLI, vectors command, cold          {result['cli_cold_s']:8.3f} s   = {result['cli_over_matmul']:.2f}x the "
              f"matmuls (target <= 1.5x); peak {result['cli_peak_gb']:.2f} GB")
        print(f"    its floor: process start + imports {result['imports_s']:.3f} s + the matmuls in bf16 "
              f"{result['bf16_matmul_s']:.3f} s = {result['cli_floor_over_matmul']:.2f}x the fp32 matmuls, before "
              "loading, Hydra, rescoring, bootstraps, outputs and plots")
    if args.lists:
        for kind, (median, low, high) in result["lists_over_matmul"].items():
            print(f"  lists alone, {kind:4} time             {median:8.3f}x the matmuls (quartiles {low:.3f}-{high:.3f}; "
                  "target <= 1.2x)")
    if args.row_orders:
        for name in ("t2i", "i2t"):
            radix, keys = result[f"row_order_{name}_s"]
            print(f"  row orders, {name} matrix             {radix:8.3f} s   (numpy's sort of torch-built int64 keys: {keys:.3f} s, "
                  f"{keys / radix:.1f}x)")
    if args.distractors:
        print(f"  100,000 images x 10,000 captions    {result['distractors_100k_s']:8.2f} s   peak "
              f"{result['distractors_100k_peak_gb']:.2f} GB (target < 3 GB)")
    print(f"  fusion, vectorised (both dirs)      {t_fuse_vec:8.3f} s")
    print(f"  fusion, per-query Python (both)     {t_fuse_py_all:8.3f} s   (timed on a sample per direction, scaled)"
          f"   -> {t_fuse_py_all / t_fuse_vec:.0f}x   (target >= 20x)")
    print(f"  paired bootstrap, 2,000 draws       {1000 * t_boot:8.3f} ms per comparison   (target < 10 ms)")
    print(f"  peak resident memory                {peak_gb:8.2f} GB   (target < 3 GB)")
    print(f"  t2i R@1: {result['t2i_R@1']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
