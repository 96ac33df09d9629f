"""Helpers the benchmark scripts share: the CPU's name, one timed fusebench command, the default job's vectors."""

from __future__ import annotations

import os
import platform
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))


def views_done(run_dirs, timeout: float = 600.0) -> float:
    """Wait until every run dir's views are made (its plots manifest names each plot with its sha256: the views
    process, ``views=background``, draws after the command returned), and a sweep's report plots (its sweep
    dir's lock, which the views process holds while it draws them in a terminal's sweep), so that the next timed command does not
    share the CPU with it; the seconds waited."""
    from fusebench.runtime import run_lock
    from fusebench.runtime.layout import read_plots_manifest

    start = time.perf_counter()
    for run_dir in run_dirs:
        while time.perf_counter() - start < timeout:
            drawn = read_plots_manifest(Path(run_dir) / "plots") if (Path(run_dir) / "plots").is_dir() else None
            if drawn and all(drawn.values()):
                break
            time.sleep(0.05)
    for sweep_dir in {Path(run_dir).parent for run_dir in run_dirs if (Path(run_dir).parent / "multirun.yaml").is_file()}:
        run_lock.check_free(sweep_dir, key="hydra.sweep.dir")  # waits while the views process draws its report's plots
    return time.perf_counter() - start


def cpu_model() -> str:
    path = Path("/proc/cpuinfo")
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _peak_kib(pid: int) -> int | None:
    """The process's own peak RSS so far (VmHWM, KiB), or None where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _drain(fd: int, out: list[str]) -> None:
    """Read a pseudo-terminal's main side until its other side is closed (EIO)."""
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out.append(b"".join(chunks).decode("utf-8", "replace"))


def run_fusebench(args: list[str], output: Path, terminal: bool = False) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of one fusebench command with FUSEBENCH_OUTPUT=output (W&B off).
    ``terminal``: its stderr a pseudo-terminal, as in a user's terminal, where the command returns without
    waiting for its views process (the plots: ``fusebench.app.views.must_wait``); else it waits for it.

    The peak is that command's own: its VmHWM (the peak of its address space since it started), read every 50 ms
    while it runs. ``os.wait4``'s ru_maxrss is not: Linux carries the peak of the process that spawned it across
    ``exec`` (the child's maxrss starts at the spawning harness's own peak: a harness that wrote 1 GB of inputs
    reports every command as at least that big). Where /proc is missing, ru_maxrss is the fallback."""
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(output), "WANDB_MODE": "disabled"}
    main_fd, secondary = pty.openpty() if terminal else (None, None)
    start = time.perf_counter()
    with subprocess.Popen([FUSEBENCH, *args], env=env, stdout=subprocess.DEVNULL,
                          stderr=secondary if terminal else subprocess.PIPE, text=True) as proc:
        stderr: list[str] = []
        if terminal:
            os.close(secondary)
            reader = threading.Thread(target=_drain, args=(main_fd, stderr), daemon=True)
        else:
            reader = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
        reader.start()
        peak = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = _peak_kib(proc.pid) or peak
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if not terminal:
            reader.join()
    if terminal:
        reader.join(timeout=5)  # the command's end closed the terminal's other side
        os.close(main_fd)
    if proc.returncode != 0:
        sys.exit(f"fusebench {' '.join(args)} failed ({proc.returncode}):\n{''.join(stderr)[-3000:]}")
    return seconds, (peak if peak is not None else usage.ru_maxrss) / 1024**2


DEFAULT_MODELS = ("sim_siglip2_like", "sim_dfn5b_like")  # the default job's models, d = 1,152 and 1,024


def default_job_models(**corpus_settings):
    """The default job's sim corpus (``SimDatasetConfig(**corpus_settings)``; none: 5,000 images, 25,010 captions)
    and its two models' embeddings of it, as the job computes them: ``(corpus, [EmbeddedModel, ...])``."""
    # imported here: scripts that only time commands need not load torch and fusebench
    from omegaconf import OmegaConf

    from fusebench.config import CONFIG_DIR
    from fusebench.data.kinds.sim import SimDatasetConfig
    from fusebench.data.simulated import make_sim_corpus
    from fusebench.encoders.models import embed

    corpus = make_sim_corpus(SimDatasetConfig(**corpus_settings))
    models = [embed(name, OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "models" / f"{name}.yaml")), corpus)
              for name in DEFAULT_MODELS]
    return corpus, models
