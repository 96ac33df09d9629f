#!/usr/bin/env python
"""Benchmark start-up: how long each command that does no run takes, as a user types it (target < 1.0 s each).

Each command runs --repeat times (default 5) as a subprocess from an empty temporary folder, with the venv's
console scripts (the ones beside this Python); the median wall time is reported, with the fastest and slowest.
A config mistake must end with exit 2 and one ``error:`` line, the others with exit 0. With --first-run it also
times a default job (``fusebench logger=none``) with numba's cache cleared (NUMBA_CACHE_DIR pointed at an empty
folder: what a user's first run pays when nothing was compiled at install time) against the same job warm.
Usage: python scripts/bench_start.py [--repeat 5] [--first-run] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import cpu_model

BIN = Path(sys.executable).parent
COMMANDS = [  # (command, expected exit code)
    (["fusebench", "--help"], 0),
    (["fusebench", "--cfg", "job"], 0),
    (["fusebench-models"], 0),
    (["fusebench-cache", "list"], 0),
    (["fusebench-report", "--help"], 0),
    (["fusebench", "fusion=nosuch"], 2),
    (["fusebench", "eval.bootstrap.draws=abc"], 2),
    (["fusebench", "fusion.top_k=0"], 2),
]


def timed(argv: list[str], cwd: Path, env: dict, expect: int | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if expect is not None and proc.returncode != expect:
        print(f"  {' '.join(argv)}: exit {proc.returncode}, expected {expect}:\n{proc.stderr[-1500:]}", file=sys.stderr)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--first-run", action="store_true", help="also time a default job: numba cache cold vs warm")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict = {"cpu": cpu_model(), "cores": os.cpu_count(), "repeat": args.repeat, "commands": {}}
    print(f"CPU: {results['cpu']} ({results['cores']} cores); median of {args.repeat} runs each (min-max)")
    with tempfile.TemporaryDirectory() as tmp:
        cwd, env = Path(tmp), {**os.environ, "FUSEBENCH_OUTPUT": str(Path(tmp) / "out"), "WANDB_MODE": "disabled"}
        for argv, code in COMMANDS:
            times = [timed(argv, cwd, env, code) for _ in range(args.repeat)]
            line = " ".join(argv)
            results["commands"][line] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
            flag = "" if statistics.median(times) < 1.0 else "   (over 1.0 s)"
            print(f"  {line:<40} {statistics.median(times):6.2f} s  ({min(times):.2f}-{max(times):.2f}){flag}")
        if args.first_run:
            job = ["fusebench", "logger=none"]
            env_cold = {**env, "NUMBA_CACHE_DIR": str(Path(tmp) / "numba-cold")}
            first = timed(job, cwd, env_cold, 0)
            warm = statistics.median(timed(job, cwd, env_cold, 0) for _ in range(max(1, args.repeat // 2)))
            results["first_run"] = {"first_s": first, "warm_s": warm, "ratio": first / warm}
            print(f"  default job, numba cache empty: first {first:.1f} s, warm {warm:.1f} s "
                  f"(x{first / warm:.2f}; target <= 1.3)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
