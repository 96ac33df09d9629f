#!/usr/bin/env python
"""Benchmark FAISS indexes over a gallery (``search=faiss_* gallery=sim``) against the exact streamed search.

Runs the real ``fusebench`` command once per search preset on one corpus and one shared cache: first
``search=exact`` (the exact streamed gallery search: its lists go to the list store, so every index run after it
reads them for its neighbour recall instead of searching again; when the store already holds them, exact runs once
more with ``eval.lists.store=false`` so that its time is measured in this run too), then each preset in turn. The
models are ``--models`` (default the study's pair, sim_siglip2_like and sim_dfn5b_like) at ``--dim`` (a sim model's
width is a config key), fused by the config's fusion (DBSF), ``--n-images`` test images and ``--n-captions``
captions (the t2i queries), and ``--size`` simulated distractors (gallery=sim, near-duplicates kept).

Reports per preset and model: build seconds, index bytes, t2i query seconds and that over the exact run's t2i
seconds for the same model (like with like: the exact run's ``run.lists.MODEL.t2i_seconds``, the one pass's work
less what only i2t needs), neighbour recall@depth and top-1 agreement against the exact gallery lists, the settings
that ran (a target recall's choice, with its tuning seconds); per preset: fused t2i R@1 minus the exact run's, the
exact run's bootstrap half-width of fused minus the best single model at R@1 (what "within the exact run's
half-width" is measured against), the command's wall time and its peak RSS (os.wait4, the command's own).

Usage: python scripts/bench_gallery_index.py [--size 200000] [--dim 256] [--n-images 5000] [--n-captions 25010]
       [--searches faiss_ivf_flat_recall95 faiss_ivf_pqfs_recall95 ...] [--models sim_siglip2_like sim_dfn5b_like]
       [--dataset sim_clustered] [--extra "search.max_memory_gb=0.05"] [--cache DIR] [--json FILE]
At a million, split the presets over several calls sharing ``--cache`` (each call under the shared lock measures
exact again: ``flock /work/bench.lock python scripts/bench_gallery_index.py --size 1000000 --cache C --searches X``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench_common import cpu_model, run_fusebench

SEARCHES = ("faiss_ivf_flat_recall95", "faiss_ivf_pqfs_recall95", "faiss_ivf_pq_recall95", "faiss_hnsw_recall95")
MODELS = ("sim_siglip2_like", "sim_dfn5b_like")


def base_args(args, cache: Path) -> list[str]:
    models = [f"models=[{','.join(args.models)}]", *(f"models.{m}.dim={args.dim}" for m in args.models)]
    fusion = [] if len(args.models) > 1 else ["fusion=none"]
    return [f"dataset={args.dataset}", f"dataset.n_images={args.n_images}", f"dataset.n_captions={args.n_captions}",
            *models, *fusion, "gallery=sim", f"gallery.size={args.size}", "gallery.near_duplicate=null",
            f"fusion.top_k={args.depth}", f"eval.lists.depth={args.depth}", f"eval.bootstrap.draws={args.draws}",
            "plots=false", "logger=none", f"embed.cache.dir={cache}"]


def record_of(out: Path) -> dict:
    runs = sorted(out.rglob("metrics.json"))
    return json.loads(runs[-1].read_text())


def comparison(record: dict, baseline: str, candidate: str) -> dict | None:
    """The record's paired t2i R@1 comparison of ``candidate`` against ``baseline``, or None."""
    for c in record.get("comparisons", []):
        if (c["baseline"], c["candidate"], c["direction"], c["k"]) == (baseline, candidate, "t2i", 1):
            return c
    return None


def exact_row(args, common: list[str], out: Path) -> dict:
    """The exact run, measured here (again with the list store off when the store already held its lists)."""
    wall, peak = run_fusebench(common, out / "exact")
    record = record_of(out / "exact")
    if any(record["run"]["lists"][m]["hit"] for m in args.models):  # read, not searched: search again, timed
        wall, peak = run_fusebench([*common, "eval.lists.store=false"], out / "exact_timed")
        record = record_of(out / "exact_timed")
    lists = record["run"]["lists"]
    row = {"wall_s": wall, "peak_gb": peak, "search_s": record["run"]["search_seconds"],
           "t2i_s": {m: lists[m]["t2i_seconds"] for m in args.models},
           "i2t_s": {m: lists[m]["i2t_seconds"] for m in args.models}}
    if len(args.models) > 1:
        singles = {m: record["retrievers"][m]["t2i"]["R@1"] for m in args.models}
        best = max(singles, key=singles.get)
        gain = comparison(record, best, "fused")
        row["fused_r1"] = record["retrievers"]["fused"]["t2i"]["R@1"]
        row["half_width"] = (gain["ci_high"] - gain["ci_low"]) / 2 if gain else None
    return row


def index_row(args, search: str, common: list[str], out: Path, exact: dict) -> dict:
    extra = [f"search={search}", *args.extra.split()]
    try:
        wall, peak = run_fusebench(common + extra, out / search)
    except SystemExit as err:  # a target the index does not reach: its one line
        return {"error": str(err).splitlines()[-1]}
    record = record_of(out / search)
    models = {}
    for m in args.models:
        q = record["search"]["models"][m]["t2i"]
        params = record["search"]["params"]["t2i"]
        query_s = q["query_ms"] * args.n_captions / 1000
        models[m] = {"build_s": q["build_seconds"], "hit": q["hit"], "index_mb": q["index_bytes"] / 1e6,
                     "query_s": query_s, "query_over_exact": query_s / exact["t2i_s"][m],
                     "neighbour_recall": q["neighbour_recall"], "top1": q["top1_agreement"],
                     "params": params.get(m, params), "target": q.get("target")}
    row = {"wall_s": wall, "peak_gb": peak, "label": record["search"]["label"], "models": models, "overrides": extra}
    if len(args.models) > 1:
        row["fused_r1"] = record["retrievers"]["fused"]["t2i"]["R@1"]
        row["fused_minus_exact"] = row["fused_r1"] - exact["fused_r1"]
        paired = comparison(record, "fused", "exact_fused")
        row["exact_fused_gain_ci"] = [paired["ci_low"], paired["ci_high"]] if paired else None
    return row


def print_table(rows: dict, exact: dict) -> None:
    print(f"\n{'search / model':<44} {'build s':>8} {'MB':>7} {'t2i s':>7} {'/exact':>7} {'recall':>7} {'top1':>6} "
          f"{'wall s':>7} {'peak GB':>7}  setting")
    for m, t in exact["t2i_s"].items():
        print(f"{'exact / ' + m:<44} {'':>8} {'':>7} {t:7.2f} {1:7.3f} {1:7.4f} {1:6.3f} {exact['wall_s']:7.1f} "
              f"{exact['peak_gb']:7.2f}")
    for search, r in rows.items():
        if "error" in r:
            print(f"{search}: {r['error']}")
            continue
        for m, q in r["models"].items():
            target = q["target"] or {}
            chosen = f"{target['setting']}={target['value']} (tuning {target['seconds']:.1f} s)" if target else ""
            build = "stored" if q["hit"] else f"{q['build_s']:.1f}"
            print(f"{search + ' / ' + m:<44} {build:>8} {q['index_mb']:7.1f} {q['query_s']:7.2f} "
                  f"{q['query_over_exact']:7.3f} {q['neighbour_recall']:7.4f} {q['top1']:6.3f} {r['wall_s']:7.1f} "
                  f"{r['peak_gb']:7.2f}  {chosen}")
        if "fused_r1" in r:
            print(f"  fused t2i R@1 {r['fused_r1']:.2f} = exact's {r['fused_r1'] - r['fused_minus_exact']:.2f} "
                  f"{r['fused_minus_exact']:+.2f} (exact run's half-width {exact['half_width']:.2f}; exact_fused - "
                  f"fused in this run {r['exact_fused_gain_ci']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=200_000, help="distractors")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--n-images", type=int, default=5000)
    parser.add_argument("--n-captions", type=int, default=25010)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--draws", type=int, default=1000, help="bootstrap draws (eval.bootstrap.draws)")
    parser.add_argument("--searches", nargs="*", default=list(SEARCHES), help="conf/search presets (none: exact only)")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--dataset", default="sim_clustered", help="sim (isotropic) | sim_clustered")
    parser.add_argument("--extra", default="", help="more overrides for every index run")
    parser.add_argument("--cache", help="the cache (lists, indexes) to share between calls; default a temporary one")
    parser.add_argument("--exact-json", help="take the exact run from this earlier --json of the same --cache (no "
                        "exact run here: for a call that builds indexes; ratios then across calls)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; {args.n_images:,} test images + {args.size:,} distractors, {args.n_captions:,} "
          f"t2i queries, d = {args.dim}, depth {args.depth}, models {', '.join(args.models)}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(args.cache or Path(tmp) / "cache"), Path(tmp) / "runs"
        common = base_args(args, cache)
        if args.exact_json:  # an earlier call's exact run over the same cache (its lists are in the store)
            exact = json.loads(Path(args.exact_json).read_text())["exact"]
            print(f"exact: from {args.exact_json} (another call: the ratios are across calls)")
        else:
            exact = exact_row(args, common, out)
        for search in args.searches:
            rows[search] = index_row(args, search, common, out, exact)
    print_table(rows, exact)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "args": vars(args), "exact": exact, "rows": rows},
                                              indent=2))


if __name__ == "__main__":
    main()
