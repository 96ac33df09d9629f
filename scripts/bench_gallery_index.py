#!/usr/bin/env python
"""Benchmark FAISS indexes over a gallery (``search=faiss_* gallery=sim``) against the exact streamed search.

Runs the real ``fusebench`` command once per backend on one corpus and one shared cache: first ``search=exact``
(the exact streamed gallery search; its lists go to the list store, so every index run after it reads them for its
neighbour recall instead of searching again), then each index. The model is sim_siglip2_like at ``--dim`` (a sim
model's width is a config key), ``--n-images`` test images and ``--n-captions`` captions (the t2i queries), and
``--size`` simulated distractors (gallery=sim, near-duplicates kept: gallery.near_duplicate=null). Reports per
backend: build seconds, index bytes, t2i query seconds and that over the exact streamed search's t2i seconds (like
with like: the exact run's ``run.lists.MODEL.t2i_seconds``, the one pass's work less what only i2t needs; its
``i2t_seconds`` and both directions' ``run.search_seconds`` are printed beside it), neighbour recall@depth and top-1
agreement against the exact gallery lists, the parameters that ran (a target recall's choice included), the
command's wall time and its peak RSS (os.wait4, the command's own).

Usage: python scripts/bench_gallery_index.py [--size 200000] [--dim 256] [--n-images 1000] [--n-captions 5000]
       [--indexes flat ivf_flat ivf_pq hnsw] [--target-recall 0.95] [--pq-refine 4] [--dataset sim_clustered]
       [--extra "search.max_memory_gb=0.05"]
       [--json FILE]; ``--size 1000000`` for users with the time (hours on 2 cores for HNSW).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench_common import cpu_model, run_fusebench

PRESETS = {"flat": "faiss_flat", "ivf_flat": "faiss_ivf_flat", "ivf_pq": "faiss_ivf_pq", "hnsw": "faiss_hnsw"}
MODEL = "sim_siglip2_like"


def base_args(args, cache: Path) -> list[str]:
    return [f"dataset={args.dataset}", f"dataset.n_images={args.n_images}", f"dataset.n_captions={args.n_captions}",
            f"models=[{MODEL}]", f"models.{MODEL}.dim={args.dim}", "fusion=none", "gallery=sim",
            f"gallery.size={args.size}", "gallery.near_duplicate=null", f"fusion.top_k={args.depth}",
            f"eval.lists.depth={args.depth}", "eval.bootstrap.draws=200", "plots=false", "logger=none",
            f"embed.cache.dir={cache}"]


def index_args(kind: str, args) -> list[str]:
    out = [f"search={PRESETS[kind]}"]
    if kind == "hnsw":
        out += [f"search.hnsw_m={args.hnsw_m}", f"search.ef_construction={args.ef_construction}"]
    if kind.startswith("ivf"):  # FAISS's 4 sqrt(n) lists for the gallery's size
        out.append("search.nlist=null")
    if kind == "ivf_pq":
        out += [f"search.nprobe={args.pq_nprobe}"] if args.pq_nprobe else []
        out += [f"search.refine_factor={args.pq_refine}"] if args.pq_refine else []
    if kind != "flat" and args.target_recall and not (kind == "ivf_pq" and args.pq_nprobe):
        out.append(f"search.target_recall={args.target_recall}")
    return out + [a for a in args.extra.split() if kind != "flat" or "max_memory" not in a]


def record_of(out: Path) -> dict:
    runs = sorted(out.rglob("metrics.json"))
    return json.loads(runs[-1].read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=200_000, help="distractors")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--n-images", type=int, default=1000)
    parser.add_argument("--n-captions", type=int, default=5000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--indexes", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--target-recall", type=float, default=0.95, help="ivf_*, hnsw; 0 = the presets' settings")
    parser.add_argument("--pq-nprobe", type=int, default=0, help="IVF-PQ at this nprobe instead of the target")
    parser.add_argument("--pq-refine", type=int, default=0, help="IVF-PQ re-ranked (search.refine_factor); 0 = none")
    parser.add_argument("--dataset", default="sim", help="sim (isotropic) | sim_clustered (docs/simulated.md)")
    parser.add_argument("--hnsw-m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--extra", default="", help="more overrides for every index run")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; {args.n_images:,} test images + {args.size:,} distractors, {args.n_captions:,} "
          f"t2i queries, d = {args.dim}, depth {args.depth}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "runs"
        common = base_args(args, cache)
        wall, peak = run_fusebench(common, out / "exact")
        exact = record_of(out / "exact")
        timed = exact["run"]["lists"][MODEL]
        exact_s = timed["t2i_seconds"]  # what each index's t2i query time is set beside
        rows["exact"] = {"wall_s": wall, "peak_gb": peak, "search_s": exact["run"]["search_seconds"],
                         "t2i_s": exact_s, "i2t_s": timed["i2t_seconds"]}
        print(f"exact: t2i {exact_s:.2f} s, i2t's own work {timed['i2t_seconds']:.2f} s (search both directions "
              f"{rows['exact']['search_s']:.2f} s), wall {wall:.1f} s, peak {peak:.2f} GB")
        for kind in args.indexes:
            extra = index_args(kind, args)
            try:
                wall, peak = run_fusebench(common + extra, out / kind)
            except SystemExit as err:  # a target the index does not reach: its one line
                rows[kind] = {"error": str(err).splitlines()[-1]}
                print(f"{kind}: {rows[kind]['error']}")
                continue
            search = record_of(out / kind)["search"]
            q = search["models"][MODEL]["t2i"]
            query_s = q["query_ms"] * args.n_captions / 1000
            rows[kind] = {"wall_s": wall, "peak_gb": peak, "build_s": q["build_seconds"], "index_mb": q["index_bytes"] / 1e6,
                          "query_s": query_s, "query_over_exact": query_s / exact_s,
                          "neighbour_recall": q["neighbour_recall"], "top1": q["top1_agreement"],
                          "params": search["params"]["t2i"], "target": q.get("target"), "overrides": extra}
    print(f"\n{'index':<9} {'build s':>8} {'MB':>8} {'t2i s':>8} {'/exact':>7} {'recall':>7} {'top1':>6} "
          f"{'wall s':>7} {'peak GB':>8}  params")
    for kind, r in rows.items():
        if kind == "exact" or "error" in r:
            continue
        params = {k: v for k, v in r["params"].items() if k not in ("seed",)}
        print(f"{kind:<9} {r['build_s']:8.1f} {r['index_mb']:8.1f} {r['query_s']:8.2f} {r['query_over_exact']:7.3f} "
              f"{r['neighbour_recall']:7.4f} {r['top1']:6.3f} {r['wall_s']:7.1f} {r['peak_gb']:8.2f}  {params}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
