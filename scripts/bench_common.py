"""Helpers the benchmark scripts share: the CPU's name and one timed fusebench command."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))


def views_done(run_dirs, timeout: float = 600.0) -> float:
    """Wait until every run dir's views are made (its plots manifest names each plot with its sha256: the views
    process, ``views=background``, draws after the command returned), so that the next timed command does not
    share the CPU with it; the seconds waited."""
    from fusebench.runtime.layout import read_plots_manifest

    start = time.perf_counter()
    for run_dir in run_dirs:
        while time.perf_counter() - start < timeout:
            drawn = read_plots_manifest(Path(run_dir) / "plots") if (Path(run_dir) / "plots").is_dir() else None
            if drawn and all(drawn.values()):
                break
            time.sleep(0.05)
    return time.perf_counter() - start


def cpu_model() -> str:
    path = Path("/proc/cpuinfo")
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_fusebench(args: list[str], output: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of one fusebench command with FUSEBENCH_OUTPUT=output (W&B off).

    The peak is that command's own (os.wait4), not the largest of every child so far."""
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(output), "WANDB_MODE": "disabled"}
    start = time.perf_counter()
    with subprocess.Popen([FUSEBENCH, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"fusebench {' '.join(args)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return seconds, usage.ru_maxrss / 1024**2
