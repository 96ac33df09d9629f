#!/usr/bin/env python
"""Benchmark the embedded engines over a gallery (``search=lancedb|milvus|qdrant gallery=sim``): the stock engine
loading the test images and every distractor block by block, building its index, answering every caption.

Runs the real ``fusebench`` command once per engine setting on one corpus and one shared cache: first
``search=exact`` (the exact streamed gallery search; its lists go to the list store, so every engine run after it
reads them for its neighbour recall and its exact preset), then each engine. Two sim models (sim_siglip2_like and
sim_dfn5b_like) at ``--dim``, ``--dataset`` (default sim_clustered: the structure indexes see in real embeddings),
``--n-images`` test images and ``--n-captions`` captions, ``--size`` distractors (gallery=sim, near-duplicates
kept). Reports per engine setting, t2i (the direction the gallery is in): ingest, index build and query seconds
(the engine's own, as metrics.json records them) and the queries' time over the exact streamed search's t2i time
(like with like: both models' ``run.lists.MODEL.t2i_seconds`` of the exact run, the one pass's work less what only
i2t needs; the exact fusion's own time is not in it, the engine's fusion is in its queries' time), the fused list's
t2i R@1 against the same preset over exact lists,
each model's neighbour recall, disk bytes, the command's wall time and its peak RSS (os.wait4: the process the
engine runs in, Milvus Lite's server thread and LanceDB's Rust pool included).

Usage: python scripts/bench_engine_gallery.py [--size 200000] [--dim 256] [--n-images 1000] [--n-captions 5000]
       [--engines lancedb_ivf_pq lancedb_hnsw milvus_hnsw qdrant] [--extra "search.nprobe=32"] [--json FILE]
       (--engines: conf/search presets; ``milvus`` with ``--extra search.index=ivf_flat`` and the like)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench_common import cpu_model, run_fusebench

MODELS = ("sim_siglip2_like", "sim_dfn5b_like")
PRESET = {"lancedb": "lancedb_rrf", "milvus": "milvus_rrf", "qdrant": "qdrant_rrf"}
ENGINES = ("lancedb_ivf_pq", "lancedb_hnsw", "milvus_hnsw", "qdrant")  # conf/search presets


def base_args(args, cache: Path) -> list[str]:
    return [f"dataset={args.dataset}", f"dataset.n_images={args.n_images}", f"dataset.n_captions={args.n_captions}",
            f"models=[{','.join(MODELS)}]", *(f"models.{m}.dim={args.dim}" for m in MODELS), "gallery=sim",
            f"gallery.size={args.size}", "gallery.near_duplicate=null", "eval.bootstrap.draws=200", "plots=false",
            "logger=none", f"embed.cache.dir={cache}"]


def engine_args(preset: str, args) -> list[str]:
    """The search preset (conf/search/PRESET.yaml: it selects the engine's fusion preset) and --extra."""
    return [f"search={preset}", "search.latency_queries=20", *args.extra.split()]


def record_of(out: Path) -> dict:
    return json.loads(sorted(out.rglob("metrics.json"))[-1].read_text())


def r_at_1(record: dict, retriever: str) -> float:
    return record["retrievers"][retriever]["t2i"]["R@1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=200_000, help="distractors")
    parser.add_argument("--dataset", default="sim_clustered")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--n-images", type=int, default=1000)
    parser.add_argument("--n-captions", type=int, default=5000)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES))
    parser.add_argument("--extra", default="", help="more overrides for every engine run")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; {args.dataset}: {args.n_images:,} test images + {args.size:,} distractors, "
          f"{args.n_captions:,} t2i queries, d = {args.dim}, two models", flush=True)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "runs"
        common = base_args(args, cache)
        wall, peak = run_fusebench(common + ["fusion=rrf"], out / "exact")
        exact = record_of(out / "exact")
        timed = [exact["run"]["lists"][m] for m in MODELS]
        exact_t2i = sum(t["t2i_seconds"] for t in timed)  # what each engine's t2i queries are set beside
        rows["exact"] = {"wall_s": wall, "peak_gb": peak, "search_s": exact["run"]["search_seconds"],
                         "t2i_s": exact_t2i, "i2t_s": sum(t["i2t_seconds"] for t in timed)}
        print(f"exact: t2i {exact_t2i:.2f} s (both models), i2t's own work {rows['exact']['i2t_s']:.2f} s (search "
              f"both directions {rows['exact']['search_s']:.1f} s), wall {wall:.1f} s, peak {peak:.2f} GB", flush=True)
        for setting in args.engines:
            try:
                wall, peak = run_fusebench(common + engine_args(setting, args), out / setting)
            except SystemExit as err:
                rows[setting] = {"error": str(err).splitlines()[-1][:300]}
                print(f"{setting}: {rows[setting]['error']}", flush=True)
                continue
            record = record_of(out / setting)
            cost = record["search"]["engine"]["t2i"]
            recall = {m: record["search"]["models"][m]["t2i"]["neighbour_recall"] for m in MODELS}
            rows[setting] = {"wall_s": wall, "peak_gb": peak, "ingest_s": cost["ingest_seconds"],
                             "build_s": cost["build_seconds"], "query_s": cost["search_seconds"],
                             "query_over_exact_t2i": cost["search_seconds"] / exact_t2i,
                             "latency_ms": cost["latency_ms_median"], "disk_mb": cost["disk_bytes"] / 1e6,
                             "fused_r1": r_at_1(record, "fused"), "exact_fused_r1": r_at_1(record, "exact_fused"),
                             "neighbour_recall": recall, "version": record["search"]["version"]}
            r = rows[setting]
            print(f"{setting}: ingest {r['ingest_s']:.1f} s, build {r['build_s']:.1f} s, t2i queries {r['query_s']:.1f} s "
                  f"({r['query_over_exact_t2i']:.2f}x exact t2i), "
                  f"fused R@1 {r['fused_r1']:.2f} (exact preset {r['exact_fused_r1']:.2f}), recall "
                  f"{'/'.join(f'{v:.3f}' for v in recall.values())}, wall {wall:.1f} s, peak {peak:.2f} GB", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
