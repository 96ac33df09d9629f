#!/usr/bin/env python
"""Benchmark sweeps: the shipped fusion_ablation on dataset=sim, cold and warm, against one default job.

Runs, each as a user would (the fusebench CLI, Hydra's basic launcher, plots on, logger=none), in a fresh
output folder so that the first sweep starts with empty caches:
  1. one default job, three times (each in a fresh folder: cold caches); the median is the reference
                                          fusebench dataset=sim logger=none
  2. the ablation, cold (empty caches):   fusebench experiment=fusion_ablation dataset=sim logger=none
  3. the same ablation again, warm (every model's lists already stored)
and reports wall times, the ratio to the default job's median (target <= 5x; the default job's spread on a
shared machine is reported beside it), each command timed to its return, its plots then waited for (the views
process draws them after it: when they were done is reported), then
  4. the cold ablation once more in a fresh interpreter with a timer around each stage of a job (scripts/bench_cli.py's
     instrumentation): each stage's seconds per job (compose, Hydra's job dir, typed config, the job's own work,
     outputs, table, the views' dispatch, the report),
peak memory of each command
(target <= 3 GB), the fraction of jobs that computed any similarity block, and, for a few jobs
(--check, default: a list job, a dense job and the last job), that their ranks equal the same job run
alone with empty caches.
Usage: python scripts/bench_sweep.py [--check 0,2,29] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from bench_cli import instrumented
from bench_common import cpu_model, run_fusebench, views_done

# A job's fixed cost in a sweep, per stage (the instrumented cold sweep, in a fresh interpreter): each row's total
# over the sweep's jobs, shown per job. A stage called inside another is subtracted from its parent.
SWEEP_STAGES = [
    # Hydra loads its plugins (the sweeper, the launcher) afresh when it scans them: what they call is timed where
    # it lives, in Hydra's own modules, which the scan does not reload
    ("each job's config composed (the sweeper)", "hydra._internal.config_loader_impl",
     "ConfigLoaderImpl.load_sweep_config"),
    ("Hydra's per-job work: job dir, .hydra/ files, logging", "hydra.core.utils", "run_job"),
    ("typed config (run_config)", "fusebench.app.cli", "run_config"),
    ("run dir checks", "fusebench.app.rundir", "start_fresh"),
    ("the job's own work (search, fusion, ranks, bootstraps: the record's run.seconds)", "fusebench.app.pipeline",
     "measure"),
    ("outputs: metrics.json, ranks/, topk/", "fusebench.app.pipeline", "write_run_outputs"),
    ("printed table", "fusebench.app.pipeline", "format_table"),
    ("views: the record handed to the views process (plots, W&B)", "fusebench.app.views", "dispatch"),
    ("the sweep report (summary.md, gains.csv; its plots unless the views process draws them)",
     "fusebench.app.callback", "SweepReport.on_multirun_end"),
]


def sweep_jobs(output: Path) -> list[Path]:
    (folder,) = [p for p in (output / "multirun").glob("*/*") if p.is_dir()]
    return sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", default="0,2,29", help="job numbers re-run alone with empty caches")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    try:
        defaults = []
        for i in range(3):  # each waits for its views (plots) before the next command, as every run below
            defaults.append(run_fusebench(["dataset=sim", "logger=none", f"hydra.run.dir={root / f'default{i}'}/run"],
                                          root / f"default{i}", terminal=True))
            views_done([root / f"default{i}" / "run"])
        t_default, rss_default = float(np.median([t for t, _ in defaults])), max(r for _, r in defaults)
        ablation = ["experiment=fusion_ablation", "dataset=sim", "logger=none"]
        t_cold, rss_cold = run_fusebench(ablation, root / "sweep", terminal=True)
        views_cold = views_done(sweep_jobs(root / "sweep"))
        cold_metrics = [json.loads((job / "metrics.json").read_text()) for job in sweep_jobs(root / "sweep")]
        shutil.rmtree(root / "sweep" / "multirun")
        t_warm, rss_warm = run_fusebench(ablation, root / "sweep", terminal=True)
        warm_jobs = sweep_jobs(root / "sweep")
        views_warm = views_done(warm_jobs)
        (root / "instrumented").mkdir()
        _, stage_rows = instrumented(ablation, root / "instrumented", SWEEP_STAGES)  # cold: its own empty caches
        views_done(sweep_jobs(root / "instrumented" / "out"))
        metrics = [json.loads((job / "metrics.json").read_text()) for job in warm_jobs]
        identical = {}
        for number in (int(n) for n in args.check.split(",") if n):
            overrides = (warm_jobs[number] / ".hydra" / "overrides.yaml").read_text().split("\n")
            overrides = [o[2:].strip() for o in overrides if o.startswith("- ")]
            alone = root / f"alone{number}"
            run_fusebench(["hydra.mode=RUN", f"hydra.run.dir={alone}/run", *overrides], alone)
            same = all(np.array_equal(np.load(f), np.load(alone / "run" / "ranks" / f.name))
                       for f in (warm_jobs[number] / "ranks").glob("*.npy"))
            identical[f"job {number} ({' '.join(o for o in overrides if o.startswith('fusion'))})"] = same
    finally:
        shutil.rmtree(root, ignore_errors=True)
    did_matmul = lambda ms: sum(1 for m in ms if m["run"].get("similarity_blocks", 1) > 0)  # noqa: E731
    result = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "jobs": len(metrics),
        "default_job_s": round(t_default, 2), "default_job_runs_s": [round(t, 2) for t, _ in defaults],
        "default_job_peak_gb": round(rss_default, 2),
        "ablation_cold_s": round(t_cold, 2), "ablation_cold_over_default": round(t_cold / t_default, 2),
        "ablation_warm_s": round(t_warm, 2), "ablation_warm_over_default": round(t_warm / t_default, 2),
        "sweep_peak_gb": round(max(rss_cold, rss_warm), 2),
        "cold_jobs_with_matmul": did_matmul(cold_metrics), "warm_jobs_with_matmul": did_matmul(metrics),
        "job_search_s": {"list jobs (median)": float(np.median([m["run"]["search_seconds"] for m in metrics
                                                                  if m["fusion"]["top_k"] is not None])),
                         "whole-ranking jobs (median)": float(np.median([m["run"]["search_seconds"] for m in metrics
                                                                         if m["fusion"]["top_k"] is None]))},
        "jobs_run_s_total": {"cold": round(sum(m["run"]["seconds"] for m in cold_metrics), 1),  # up to the record: no outputs or plots
                             "warm": round(sum(m["run"]["seconds"] for m in metrics), 1)},
        "ranks_identical_to_job_alone": identical,
        "views_after_return_s": {"cold": round(views_cold, 2), "warm": round(views_warm, 2)},
        "per_job_s_instrumented_cold": {row: round(seconds / len(metrics), 3) for row, seconds in stage_rows.items()},
    }
    print(f"CPU {result['cpu']} ({result['cores']} cores); fusion_ablation on dataset=sim, {result['jobs']} jobs")
    print(f"  one default job (median of 3)   {t_default:8.1f} s   peak {rss_default:.2f} GB"
          f"   (runs: {', '.join(f'{t:.1f}' for t, _ in defaults)} s)")
    print(f"  ablation, cold (empty caches)   {t_cold:8.1f} s   = {t_cold / t_default:.1f}x the default job (target <= 5x)"
          f"   jobs that computed similarities: {result['cold_jobs_with_matmul']}/{len(metrics)}")
    print(f"  ablation, warm (lists stored)   {t_warm:8.1f} s   = {t_warm / t_default:.1f}x"
          f"   jobs that computed similarities: {result['warm_jobs_with_matmul']}/{len(metrics)}")
    print(f"  peak memory of a sweep process  {result['sweep_peak_gb']:8.2f} GB   (target <= 3 GB)")
    print(f"  search+fusion per job (warm):   {result['job_search_s']}")
    print(f"  the jobs' own run time, summed: {result['jobs_run_s_total']} s (the rest: Hydra, outputs, plots, the report)")
    print(f"  ranks identical to the job run alone with empty caches: {identical}")
    print(f"  the views process (plots) was done {views_cold:.1f} s (cold) and {views_warm:.1f} s (warm) after the "
          "sweep returned")
    print("  per job, the instrumented cold sweep (each row's total over the jobs / jobs):")
    for row, seconds in sorted(result["per_job_s_instrumented_cold"].items(), key=lambda kv: -kv[1]):
        print(f"    {row:<84} {seconds:7.3f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
