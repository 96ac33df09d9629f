#!/usr/bin/env python
"""Where a cold COCO-size job through the CLI spends its time, against the bare fp32 matmuls of the same vectors.

The job is the documented vectors command (bench_eval.py's): 25,010 captions x 5,000 images, two models of width
1,152 and 1,024 given as a manifest and .npy files, both directions, DBSF by source object, top_k 100, 2,000
bootstrap draws, plots on (drawn by the views process after the command returns: the script waits for them before
the next run, and reports when they were done), W&B off, empty caches. It runs twice in fresh interpreters:

  * plain, timed from outside (the wall time a user sees);
  * instrumented: the same command in-process (``fusebench.app.cli.main``) with a timer around each stage the
    pipeline calls (imports, Hydra's composition, the typed config, corpus, vectors, each model's lists, fusion,
    ranks, bootstraps, digest, outputs, table, the views' dispatch), so every second of the run lands in one named row; what is
    left is the interpreter's start and exit.

The target (issue 30) is the plain run, less torch's import, at most 1.5x the bare fp32 matmuls.
Usage: python scripts/bench_cli.py [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import cpu_model, default_job_models, run_fusebench, views_done
from bench_eval import bare_matmuls, vectors_command

# The instrumented run: the stages a CLI job goes through, each (row, module, attribute) wrapped in a timer.
# A stage called inside another is reported on its own and subtracted from its parent (rows never double count).
STAGES = [
    ("Hydra: compose the config, job dir, logging", "fusebench.app.cli", "app"),
    ("typed config (run_config)", "fusebench.app.run_config", "run_config"),
    ("run dir checks and bookkeeping", "fusebench.app.rundir", "start_fresh"),
    ("corpus (manifest)", "fusebench.app.pipeline", "load_corpus"),
    ("vectors: read .npy, checks, normalise", "fusebench.app.pipeline", "_embeddings"),
    ("gallery stage (none here)", "fusebench.app.pipeline", "attach_gallery"),
    ("each model's lists: matmuls, top-k, exact ranks", "fusebench.backends.retrieval", "exact_lists"),
    ("fusion (DBSF by image)", "fusebench.backends.retrieval", "fuse_in_blocks"),
    ("fused lists' ranks", "fusebench.backends.retrieval", "t2i_list_ranks"),
    ("fused lists' ranks", "fusebench.backends.retrieval", "i2t_list_ranks"),
    ("recall per retriever", "fusebench.app.pipeline", "retriever_result"),
    ("paired bootstraps (2,000 draws)", "fusebench.app.pipeline", "paired_comparisons"),
    ("oracle", "fusebench.app.pipeline", "oracle_metrics"),
    ("test split's content digest", "fusebench.data.corpus", "Corpus.content_digest"),
    ("outputs: metrics.json, ranks/, topk/", "fusebench.app.pipeline", "write_run_outputs"),
    ("printed table", "fusebench.app.pipeline", "format_table"),
    ("views: the record handed to the views process (plots, W&B)", "fusebench.app.views", "dispatch"),
]

DRIVER = r"""
import time
wall_started, started = time.time(), time.perf_counter()
import importlib, json, sys
rows, stack = {}, []

def add(row, seconds):
    rows[row] = rows.get(row, 0.0) + seconds

def timed(row, fn):
    def wrapper(*args, **kwargs):
        stack.append(0.0)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - start
            inner = stack.pop()
            add(row, spent - inner)
            if stack:
                stack[-1] += spent
    return wrapper

def imported(row, name):
    start = time.perf_counter()
    module = importlib.import_module(name)
    add(row, time.perf_counter() - start)
    return module

imported("import torch", "torch")
imported("import numpy, numba, hydra, the rest", "numba")
cli = imported("import numpy, numba, hydra, the rest", "fusebench.app.cli")
imported("import numpy, numba, hydra, the rest", "fusebench.app.pipeline")
views = importlib.import_module("fusebench.app.views")
views.must_wait = lambda: False  # as in a user's terminal: the command does not wait for its plots
stages, argv, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
for row, module, attribute in stages:
    owner = importlib.import_module(module)
    if "." in attribute:
        cls, attribute = attribute.split(".")
        owner = getattr(owner, cls)
    setattr(owner, attribute, timed(row, getattr(owner, attribute)))
sys.argv = ["fusebench", *argv]
before = time.perf_counter()
try:
    cli.main()
except SystemExit as err:
    if err.code:
        raise
rows["_main"] = time.perf_counter() - before
rows["_in_process"] = time.perf_counter() - started
rows["_wall_started"], rows["_wall_ended"] = wall_started, time.time()
with open(out, "w", encoding="utf-8") as fh:
    json.dump(rows, fh)
cli.quick_exit(0)  # how the console script ends (fusebench.app.cli.console_main)
"""


def instrumented(command: list[str], folder: Path, stages: list | None = None) -> tuple[float, dict[str, float]]:
    """One run of ``command`` in a fresh interpreter with every stage (``STAGES`` unless given) timed: its wall
    time and seconds per row."""
    out = folder / "rows.json"
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(folder / "out"), "WANDB_MODE": "disabled"}
    start, wall_start = time.perf_counter(), time.time()
    subprocess.run([sys.executable, "-c", DRIVER, json.dumps(stages or STAGES), json.dumps(command), str(out)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    wall, wall_end = time.perf_counter() - start, time.time()
    rows = json.loads(out.read_text())
    main, in_process = rows.pop("_main"), rows.pop("_in_process")
    began, ended = rows.pop("_wall_started"), rows.pop("_wall_ended")
    inside = sum(v for k, v in rows.items() if not k.startswith("import"))
    rows["the CLI around the app (model names checked, Ctrl-C watch)"] = main - inside
    rows["interpreter start (to the first line)"] = began - wall_start
    rows["interpreter exit (from the last line)"] = wall_end - ended
    rows["(unaccounted)"] = wall - in_process - (began - wall_start) - (wall_end - ended)
    return wall, rows


def in_run_dir(command: list[str], folder: str) -> list[str]:
    """``command`` with its run dir in ``folder`` (each run starts with empty caches and a new dir)."""
    return [a if not a.startswith("hydra.run.dir=") else f"hydra.run.dir={folder}/run" for a in command]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (the median is reported)")
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    torch.set_float32_matmul_precision("highest")
    corpus, models = default_job_models()
    device = torch.device("cpu")
    bare_matmuls(models, args.chunk_size, device)  # warm-up
    walls, matmuls, breakdowns, views = [], [], [], []
    with tempfile.TemporaryDirectory() as folder:
        command = vectors_command(models, corpus, Path(folder), "dbsf")
        for _ in range(args.repeats):  # interleaved: the machine's load falls on every kind alike
            matmuls.append(bare_matmuls(models, args.chunk_size, device))
            with tempfile.TemporaryDirectory() as fresh:
                walls.append(run_fusebench(in_run_dir(command, fresh), Path(fresh) / "out", terminal=True)[0])
                views.append(views_done([Path(fresh) / "run"]))  # the plots, drawn after the command returned
            with tempfile.TemporaryDirectory() as fresh:
                breakdowns.append(instrumented(in_run_dir(command, fresh), Path(fresh)))
                views_done([Path(fresh) / "run"])
    matmul, wall = float(np.median(matmuls)), float(np.median(walls))
    rows = {row: float(np.median([b[1].get(row, 0.0) for b in breakdowns])) for row in breakdowns[0][1]}
    torch_import = rows["import torch"]
    result = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "bare_fp32_matmuls_s": round(matmul, 3),
              "cli_cold_s": round(wall, 3), "torch_import_s": round(torch_import, 3),
              "cli_net_of_torch_over_matmul": round((wall - torch_import) / matmul, 2),
              "instrumented_s": round(float(np.median([b[0] for b in breakdowns])), 3),
              "rows_s": {k: round(v, 3) for k, v in rows.items()}, "repeats": args.repeats,
              "views_after_return_s": round(float(np.median(views)), 3)}
    print(f"CPU {result['cpu']} ({result['threads']} threads); median of {args.repeats} interleaved runs, empty caches")
    print(f"  bare fp32 matmuls, 2 models (25,010 x 5,000, d 1,152 and 1,024)  {matmul:7.3f} s")
    print(f"  the CLI job, cold, as a user runs it                             {wall:7.3f} s")
    print(f"  less torch's import ({torch_import:.3f} s)                               {wall - torch_import:7.3f} s "
          f"= {result['cli_net_of_torch_over_matmul']:.2f}x the matmuls (target <= 1.5x)")
    print(f"  its plots (the views process) were all drawn {result['views_after_return_s']:.3f} s after it returned")
    print(f"  where the instrumented run's {result['instrumented_s']:.3f} s go:")
    for row, seconds in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"    {row:<58} {seconds:7.3f} s  {seconds / matmul:5.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
