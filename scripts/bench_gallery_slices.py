#!/usr/bin/env python
"""Benchmark the exact gallery search cut into slices (``gallery.slices``, one job per ``gallery.slice`` on the
joblib launcher) and merged, against the one-process search of the same gallery (docs/galleries.md, "Searching one
gallery in many jobs").

Phases, each a real ``fusebench`` command (run them in separate calls to keep each under the shared lock's ~15
minutes; every call adds its numbers to ``--json``):

* ``one``: the one-process run (its own cache: nothing stored before), wall time and peak RSS (VmHWM);
* ``slices``: the slices ``--from``..``--to``-1 of ``--slices`` as one joblib multirun (``--n-jobs`` workers):
  the sweep's wall time, and per slice job its ``slice.json`` (seconds, each model's seconds, the worker's peak
  VmHWM: a worker that ran several slice jobs reports the largest);
* ``merge``: the run that merges the stored slices and evaluates (every slice must be stored: a slice it computed
  itself is reported), wall time and peak RSS;
* ``compare``: every file under ``ranks/`` and ``topk/`` of the one-process and merged runs, byte for byte;
* ``table``: the markdown table of what ``--json`` holds.

Usage (1M, the study's pair at d = 256, 25,010 captions):
  flock /work/bench.lock python scripts/bench_gallery_slices.py --size 1000000 --work W --json W/r.json --phase one
  flock /work/bench.lock python scripts/bench_gallery_slices.py --size 1000000 --work W --json W/r.json \\
      --phase slices --from 0 --to 4         # then --from 4 --to 8
  flock /work/bench.lock python scripts/bench_gallery_slices.py --size 1000000 --work W --json W/r.json --phase merge
  python scripts/bench_gallery_slices.py --work W --json W/r.json --phase compare
  python scripts/bench_gallery_slices.py --work W --json W/r.json --phase table
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import time
from pathlib import Path

from bench_common import cpu_model, run_fusebench

MODELS = ("sim_siglip2_like", "sim_dfn5b_like")


def base_args(args) -> list[str]:
    models = [f"models=[{','.join(args.models)}]", *(f"models.{m}.dim={args.dim}" for m in args.models)]
    fusion = [] if len(args.models) > 1 else ["fusion=none"]
    return [f"dataset={args.dataset}", f"dataset.n_images={args.n_images}", f"dataset.n_captions={args.n_captions}",
            *models, *fusion, "gallery=sim", f"gallery.size={args.size}", "gallery.near_duplicate=null",
            f"fusion.top_k={args.depth}", f"eval.lists.depth={args.depth}", f"eval.save_topk={args.depth}",
            f"eval.bootstrap.draws={args.draws}", "plots=false", "logger=none"]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def phase_one(args, work: Path) -> dict:
    load_before = load()
    seconds, peak = run_fusebench([*base_args(args), f"embed.cache.dir={work / 'cache_one'}",
                                   f"hydra.run.dir={work / 'one'}"], work / "out")
    record = json.loads((work / "one" / "metrics.json").read_text())
    lists = record["run"]["lists"]
    return {"seconds": round(seconds, 1), "peak_gb": round(peak, 3), "load": [load_before, load()],
            "models": {m: {"t2i_seconds": lists[m].get("t2i_seconds"), "i2t_seconds": lists[m].get("i2t_seconds")}
                       for m in args.models}}


def phase_slices(args, work: Path) -> dict:
    load_before = load()
    sweep = work / f"slices_{args.start}_{args.stop}"
    seconds, peak = run_fusebench(["-m", *base_args(args), f"embed.cache.dir={work / 'cache_sliced'}",
                                   f"gallery.slices={args.slices}", f"gallery.slice=range({args.start},{args.stop})",
                                   "hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.n_jobs}",
                                   f"hydra.sweep.dir={sweep}"], work / "out")
    jobs = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/slice.json"))]
    return {"seconds": round(seconds, 1), "launcher_peak_gb": round(peak, 3), "load": [load_before, load()],
            "n_jobs": args.n_jobs, "jobs": jobs}


def phase_merge(args, work: Path) -> dict:
    load_before = load()
    seconds, peak = run_fusebench([*base_args(args), f"embed.cache.dir={work / 'cache_sliced'}",
                                   f"gallery.slices={args.slices}", f"hydra.run.dir={work / 'merged'}"], work / "out")
    log = (work / "merged" / "fusebench.log").read_text() if (work / "merged" / "fusebench.log").exists() else ""
    return {"seconds": round(seconds, 1), "peak_gb": round(peak, 3), "load": [load_before, load()],
            "computed_slices_here": "not in the slice store" in log}


def phase_compare(_args, work: Path) -> dict:
    one, merged = work / "one", work / "merged"
    files = sorted(p for folder in ("ranks", "topk") for p in (one / folder).rglob("*") if p.is_file())
    differ = [str(p.relative_to(one)) for p in files if not filecmp.cmp(p, merged / p.relative_to(one), shallow=False)]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files), "differ": differ}


def table(results: dict) -> str:
    lines = [f"CPU: {results.get('cpu')}; size {results.get('size'):,}, {results.get('slices')} slices", "",
             "| job | wall s | peak GB | load (1-min, before / after) | what |", "| --- | ---: | ---: | --- | --- |"]
    one = results.get("one")
    if one:
        per_model = ", ".join(f"{m} t2i {v['t2i_seconds']} s" for m, v in one["models"].items())
        lines.append(f"| one process | {one['seconds']} | {one['peak_gb']} | {one['load'][0].split()[0]} / "
                     f"{one['load'][1].split()[0]} | {per_model} |")
    for key in sorted(k for k in results if k.startswith("slices_")):
        sweep = results[key]
        for job in sorted(sweep["jobs"], key=lambda j: j["slice"]):
            items = next(iter(job["models"].values()))
            per_model = ", ".join(f"{m} {v['seconds']} s" for m, v in job["models"].items())
            lines.append(f"| slice {job['slice']} (items {items['start']:,}..{items['stop'] - 1:,}) | {job['seconds']} "
                         f"| {job['peak_rss_gb']} | | {per_model} |")
        lines.append(f"| joblib sweep of slices {key[7:].replace('_', '..')} (n_jobs={sweep['n_jobs']}) | "
                     f"{sweep['seconds']} | {sweep['launcher_peak_gb']} (launcher) | {sweep['load'][0].split()[0]} / "
                     f"{sweep['load'][1].split()[0]} | |")
    merge = results.get("merge")
    if merge:
        lines.append(f"| merge, fusion and evaluation | {merge['seconds']} | {merge['peak_gb']} | "
                     f"{merge['load'][0].split()[0]} / {merge['load'][1].split()[0]} | "
                     f"{'computed a slice itself' if merge['computed_slices_here'] else 'every slice read'} |")
    compare = results.get("compare")
    if compare:
        lines += ["", f"ranks/ and topk/: {compare['files']} files ({compare['bytes'] / 1e6:.1f} MB), "
                      f"{len(compare['differ'])} differ{': ' + ', '.join(compare['differ']) if compare['differ'] else ''}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("one", "slices", "merge", "compare", "table"), required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--size", type=int, default=200000)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--from", dest="start", type=int, default=0)
    parser.add_argument("--to", dest="stop", type=int, default=None)
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--n-images", type=int, default=5000)
    parser.add_argument("--n-captions", type=int, default=25010)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--dataset", default="sim_clustered")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    args.stop = args.slices if args.stop is None else args.stop
    args.work.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    results.update(cpu=cpu_model(), size=results.get("size", args.size), slices=results.get("slices", args.slices))
    started = time.perf_counter()
    if args.phase == "table":
        print(table(results))
        return
    key = f"slices_{args.start}_{args.stop}" if args.phase == "slices" else args.phase
    runner = {"one": phase_one, "slices": phase_slices, "merge": phase_merge, "compare": phase_compare}[args.phase]
    results[key] = runner(args, args.work)
    args.json.write_text(json.dumps(results, indent=2))
    print(json.dumps(results[key], indent=2)[:3000], f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
