#!/usr/bin/env python
"""The GPU checks, in one prepared run (under 8 minutes on one H100/H200-class GPU): what a session lent a device
runs once, and pastes the table of into its note. Each check is a row of ONE table printed at the end (check,
expected, measured, status), also written as JSON with ``--json FILE``.

1. **Embedding on CUDA equals the CPU's**: the tiny random-weight models the tests build (open_clip from a small
   config, transformers CLIP and SigLIP 2 from small configs, saved and loaded through the users' code path) embed
   the tiny dataset on the CPU in fp32 and on CUDA in fp32 and in bf16 autocast (``embed.precision``); the largest
   absolute difference of the L2-normalised rows must stay under ``FP32_TOL`` (fp32; TF32 matmuls allowed) and
   ``BF16_TOL`` (bf16).
2. **Exact search at a million images**: ``--n`` (1,000,000) seeded distractors plus 5,000 test images, ``--captions``
   (25,010) captions whose target is a noisy copy of their image, at widths 1,152 and 1,024 (SigLIP 2 So400m's and
   DFN5B's), through ``gallery_lists`` in fp32 and in the certified bf16 path (``eval.search_precision=bf16``, what
   ``auto`` picks on CUDA); the ranks and the top-100 ids must be equal, and the certified path's seconds per model
   must be at most ``SEARCH_TARGET_S`` (fp32's are reported beside it).
3. **FAISS on the GPU**, where FAISS's GPU build is installed: one ``fusebench`` multirun over a ``gallery=sim``
   gallery (``--faiss-n`` distractors, 200,000, clustered sim, d = 256, one model) with ``search=faiss_flat, faiss_ivf_flat,
   faiss_ivf_pq`` and ``eval.device=cuda``: each index must be searched on CUDA (the run's ``where``), with its
   neighbour recall against exact search and its search time as a fraction of the exact t2i pass; the flat index's
   recall must be at least ``FLAT_RECALL``. HNSW has no GPU form in FAISS (fusebench searches it on the CPU): its row
   says so.
4. **A whole job on CUDA at COCO size**: the documented vectors command (``scripts/bench_eval.py``: 25,010 captions
   x 5,000 images, d = 1,152 and 1,024, DBSF by image, 2,000 draws, plots) with ``eval.device=cuda`` in a fresh
   process with empty caches, against the bare fp32 matmuls of the same vectors on the GPU, net of torch's import
   (issue 41 item 1's ratio; its 1.5x target is the 2-core CPU's: on a GPU the matmuls take milliseconds and this
   is the job's fixed cost, reported, not judged).

``--device cpu`` is a dry run at tiny sizes that takes every code path the GPU run takes; what needs CUDA (the
comparisons against the CPU, the timing targets, FAISS's GPU placement) reads "skipped: no cuda" in its row, with
what was measured beside it. tests/test_gpu_check.py runs it.

Usage: python scripts/gpu_check.py [--json gpu_check.json]
       python scripts/gpu_check.py --device cpu --json dry.json            (the dry run, about a minute on 2 cores)
Exits 1 when a check fails, 0 when every row passed or was skipped (a skipped row says why).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny models the tests build (helpers/tiny_models.py)

FP32_TOL = 1e-3  # fp32 on CUDA (cuDNN/cuBLAS, TF32 where enabled) against the CPU, normalised rows
BF16_TOL = 5e-2  # bf16 autocast against fp32 on the CPU, normalised rows
SEARCH_TARGET_S = 2.0  # certified bf16 exact search of 1,005,000 images x 25,010 captions, per model
FLAT_RECALL = 0.999  # FAISS's flat index on the GPU against exact search (ties may order differently)
N_TEST, DEPTH = 5000, 100
NO_CUDA = "skipped: no cuda"
# (--n, --captions, --widths, --faiss-n, the FAISS jobs' width and their dataset's latent width, the COCO job's
# images and captions) of the GPU run and of the dry run (a narrow model: FAISS's PQ training is the dry run's slowest)
SIZES = {"cuda": (1_000_000, 25_010, [1152, 1024], 200_000, 256, 64, 5000, 25_010),
         "cpu": (8_000, 1_000, [64], 3_000, 32, 16, 300, 1_500)}
FAISS_PRESETS = ("faiss_flat", "faiss_ivf_flat", "faiss_ivf_pq")  # the families FAISS has a GPU form of


def row(check: str, expected: str, measured: str, status: str) -> dict:
    """One line of the table: ``status`` is pass, FAIL, info (measured, not judged) or skipped: why."""
    return {"check": check, "expected": expected, "measured": measured, "status": status}


def judged(ok: bool, cuda: bool) -> str:
    """A row's status: pass / FAIL on CUDA; on the dry run a comparison against the GPU cannot be made."""
    return NO_CUDA if not cuda else ("pass" if ok else "FAIL")


def table(rows: list[dict]) -> str:
    """The rows as one plain-text table, columns padded to their widest cell."""
    heads = ("check", "expected", "measured", "status")
    widths = [max(len(h), *(len(r[h]) for r in rows)) for h in heads]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(r[h].ljust(w) for h, w in zip(heads, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def failed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "FAIL"]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def unit(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=np.float32)


def embedding_rows(device: str) -> list[dict]:
    """Section 1: each tiny model's rows on ``device`` (fp32, bf16) against the CPU's (fp32)."""
    from helpers.tiny_models import build_hf, build_open_clip

    from fusebench.config.schema import EmbedConfig
    from fusebench.data.tiny import load_tiny
    from fusebench.encoders.models import embed

    rows, cuda = [], device.startswith("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        specs = {"open_clip": {"kind": "open_clip", "model": f"local-dir:{build_open_clip(root / 'oc')}"},
                 "hf_clip": {"kind": "hf", "checkpoint": str(build_hf(root / "clip", "clip"))},
                 "hf_siglip2": {"kind": "hf", "checkpoint": str(build_hf(root / "siglip2", "siglip2"))}}
        corpus = load_tiny()
        for name, spec in specs.items():
            got = {}
            for where, precision in (("cpu", "fp32"), (device, "fp32"), (device, "bf16")):
                runtime = EmbedConfig.with_defaults(str(root / f"cache_{where}_{precision}"), device=where,
                                                    precision=precision, num_workers=0, batch_size=16,
                                                    cache_dtype="fp32")
                out = embed(name, spec, corpus, runtime)
                got[where, precision] = (out.image, out.text)
            for precision, tol in (("fp32", FP32_TOL), ("bf16", BF16_TOL)):
                diff = max(float(np.abs(got[device, precision][i] - got["cpu", "fp32"][i]).max()) for i in (0, 1))
                rows.append(row(f"embed {name} {precision} on {device} vs cpu fp32", f"max |diff| <= {tol:g}",
                                f"{diff:.2e}", judged(diff <= tol, cuda)))
    return rows


def search_rows(device: str, n: int, captions: int, width: int) -> list[dict]:
    """Section 2 at one width: fp32 and certified bf16 on ``device``: ranks and ids equal, seconds each."""
    from fusebench.encoders.distractors import ArrayRows
    from fusebench.search.gallery_search import gallery_lists

    rng = np.random.default_rng(width)
    image = unit(rng.standard_normal((N_TEST, width), dtype=np.float32))
    caption_image = np.sort(rng.integers(0, N_TEST, captions))
    noise = rng.standard_normal((captions, width), dtype=np.float32) / np.sqrt(width)  # norm about 1
    text = unit(image[caption_image] + noise)
    rows = rng.standard_normal((n, width), dtype=np.float32)
    near = rng.choice(n, n // 100, replace=False)  # a hundredth of them resemble some test image (hard ones)
    rows[near] = image[rng.integers(0, N_TEST, near.size)] * np.sqrt(width) + 0.8 * rows[near]
    distractors = ArrayRows(rows, label=f"gpu_check_{width}")
    del rows
    warm = ArrayRows(distractors.rows[:4096], label="gpu_check_warm")
    timed = {}
    for precision in ("fp32", "bf16"):  # bf16: the certified-margin path, what eval.search_precision=auto runs on CUDA
        gallery_lists(text[:512], image, caption_image[:512], warm, DEPTH, device, precision=precision)  # kernels, pools
        sync(device)
        began = time.perf_counter()
        lists = gallery_lists(text, image, caption_image, distractors, DEPTH, device, precision=precision)
        sync(device)
        timed[precision] = (lists, time.perf_counter() - began)
    (fp32, s32), (bf16, s16) = timed["fp32"], timed["bf16"]
    same = {d: bool(np.array_equal(np.asarray(fp32[d].ranks), np.asarray(bf16[d].ranks))
                    and np.array_equal(np.asarray(fp32[d].ids), np.asarray(bf16[d].ids))) for d in ("t2i", "i2t")}
    size = f"{N_TEST + n:,} x {captions:,}, d {width}"
    return [row(f"exact {size}: certified bf16 = fp32", "ranks and top-100 ids equal (t2i, i2t)",
                ", ".join(f"{d} {'equal' if ok else 'DIFFER'}" for d, ok in same.items()),
                "pass" if all(same.values()) else "FAIL"),
            row(f"exact {size}: fp32 seconds", "reported", f"{s32:.2f} s", "info"),
            row(f"exact {size}: certified bf16 seconds", f"<= {SEARCH_TARGET_S:g} s per model", f"{s16:.2f} s",
                judged(s16 <= SEARCH_TARGET_S, device.startswith("cuda")))]


def fusebench(args: list[str], output: Path) -> tuple[float, int, str]:
    """(wall seconds, exit code, the end of stderr) of one ``fusebench`` command in a fresh interpreter, its outputs
    and caches under ``output``, W&B off."""
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(output), "WANDB_MODE": "disabled", "TQDM_DISABLE": "1"}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fusebench.app.cli", *args], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - began, done.returncode, done.stderr[-2000:]


def faiss_gpu_skip(device: str) -> str | None:
    """Why the FAISS rows are not run, or None: no FAISS; on CUDA, a FAISS without its GPU build."""
    try:
        import faiss  # heavy, optional: only this section needs it
    except ImportError:
        return "skipped: faiss is not installed"
    if device.startswith("cuda") and (not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1):
        return f"skipped: faiss {faiss.__version__} has no GPU build here"
    return None


def faiss_row(preset: str, metrics: dict | None, cuda: bool, items: str) -> dict:
    """One FAISS family's row from its job's metrics.json (None: the job failed); ``items``: the gallery, said."""
    check = f"faiss {preset.removeprefix('faiss_')} on {'cuda' if cuda else 'cpu'}, {items}"
    expected = "searched on cuda; " + (f"neighbour recall >= {FLAT_RECALL}" if preset == "faiss_flat" else
                                       "neighbour recall reported")
    if metrics is None:
        return row(check, expected, "the job failed (its stderr is printed above)", "FAIL")
    (model, found), = metrics["search"]["models"].items()
    t2i, lists = found["t2i"], metrics["run"]["lists"][model]
    search_s = t2i["query_ms"] * metrics["dataset"]["t2i_queries"] / 1000
    measured = (f"where {t2i['where']}, recall {t2i['neighbour_recall']:.4f}, search {search_s:.2f} s = "
                f"{search_s / max(lists['t2i_seconds'], 1e-9):.2f}x exact t2i, build {t2i['build_seconds']:.1f} s")
    ok = t2i["where"] == "cuda" and (preset != "faiss_flat" or t2i["neighbour_recall"] >= FLAT_RECALL)
    return row(check, expected, measured, judged(ok, cuda))


def faiss_rows(device: str, n: int, dims: tuple[int, int], corpus: tuple[int, int], folder: Path) -> list[dict]:
    """Section 3: one multirun over FAISS's GPU families (``dims``: the model's width and the sim's latent width;
    ``corpus``: the test split's images and captions), each job's row from its metrics.json."""
    hnsw = row("faiss hnsw", "no GPU form in FAISS", "searched on the CPU by fusebench (not run here)", "info")
    why = faiss_gpu_skip(device)
    if why is not None:
        return [row(f"faiss {p.removeprefix('faiss_')}", "searched on cuda", "-", why) for p in FAISS_PRESETS] + [hnsw]
    sweep = folder / "faiss"
    args = ["-m", "dataset=sim_clustered", f"dataset.n_images={corpus[0]}", f"dataset.n_captions={corpus[1]}",
            f"dataset.latent_dim={dims[1]}", "gallery=sim", f"gallery.size={n}", "models=[sim_siglip2_like]",
            f"models.sim_siglip2_like.dim={dims[0]}", "fusion=none", f"search={','.join(FAISS_PRESETS)}",
            f"eval.device={device}", "eval.bootstrap.draws=200", "logger=none", "plots=false",
            "eval.lists.store=false",  # each job times its own exact pass, the one its index is measured against
            f"embed.cache.dir={folder / 'cache'}", f"hydra.sweep.dir={sweep}"]
    seconds, code, stderr = fusebench(args, folder / "out")
    print(f"faiss multirun ({len(FAISS_PRESETS)} jobs): {seconds:.1f} s, exit {code}", flush=True)
    if code != 0:
        print(stderr, file=sys.stderr)
    jobs = json.loads((sweep / "multirun_jobs.json").read_text()) if (sweep / "multirun_jobs.json").exists() else []
    metrics = {}
    for job in jobs.get("jobs", []) if isinstance(jobs, dict) else []:
        preset = next(o.split("=", 1)[1] for o in job["overrides"] if o.startswith("search="))
        path = sweep / job["dir"] / "metrics.json"
        metrics[preset] = json.loads(path.read_text()) if path.exists() else None
    items = f"{n:,} + {corpus[0]:,} items, d {dims[0]}"
    return [faiss_row(p, metrics.get(p), device.startswith("cuda"), items) for p in FAISS_PRESETS] + [hnsw]


def torch_import_seconds(repeats: int) -> float:
    """Median wall time of a fresh interpreter that imports torch and exits."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def job_rows(device: str, n_images: int, n_captions: int, folder: Path) -> list[dict]:
    """Section 4: the cold vectors command on ``device`` against the bare fp32 matmuls of its vectors there."""
    from bench_common import default_job_models
    from bench_eval import bare_matmuls, vectors_command

    corpus, models = default_job_models(n_images=n_images, n_captions=n_captions)
    torch_device = torch.device(device)
    bare_matmuls(models, 4096, torch_device)  # warm-up: cuBLAS handles, the allocator
    matmuls = bare_matmuls(models, 4096, torch_device)
    job = folder / "job"
    job.mkdir()
    command = vectors_command(models, corpus, job, "dbsf") + [f"eval.device={device}",
                                                              f"embed.cache.dir={job / 'cache'}"]
    seconds, code, stderr = fusebench(command, job / "out")
    torch_s = torch_import_seconds(3 if device.startswith("cuda") else 1)
    size = f"{n_captions:,} x {n_images:,}, d 1,152 + 1,024"
    if code != 0:
        print(stderr, file=sys.stderr)
        return [row(f"cold vectors job on {device} ({size})", "exit 0", f"exit {code}", "FAIL")]
    net = seconds - torch_s
    return [row(f"cold vectors job on {device} ({size})", "runs; item 1's <= 1.5x is the 2-core CPU's target",
                f"{seconds:.2f} s - torch import {torch_s:.2f} s = {net:.2f} s vs bare fp32 matmuls {matmuls:.4f} s = "
                f"{net / max(matmuls, 1e-9):.1f}x", "info")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script at tiny sizes")
    parser.add_argument("--n", type=int, help="distractors in the exact search check (cuda: 1,000,000)")
    parser.add_argument("--captions", type=int, help="captions in the exact search check (cuda: 25,010)")
    parser.add_argument("--widths", type=int, nargs="+", help="widths of the exact search check (cuda: 1152 1024)")
    parser.add_argument("--faiss-n", type=int, help="distractors in the FAISS jobs (cuda: 200,000)")
    parser.add_argument("--json", help="also write the table (and the machine) to this file")
    args = parser.parse_args()
    device = args.device
    cuda = device.startswith("cuda")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the embedding's bars: the table is this run's output
    if cuda and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing was checked. "
                 "--device cpu is the dry run.")
    n, captions, widths, faiss_n, faiss_dim, latent_dim, job_images, job_captions = SIZES["cuda" if cuda else "cpu"]
    n, captions, widths, faiss_n = (args.n or n, args.captions or captions, args.widths or widths,
                                    args.faiss_n or faiss_n)
    began = time.perf_counter()
    machine = {"gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else "none (cpu dry run)",
               "torch": torch.__version__, "device": device}
    print(f"GPU: {machine['gpu']}, torch {machine['torch']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sections = [("embedding", lambda: embedding_rows(device)),
                    *((f"exact search d={w}", lambda w=w: search_rows(device, n, captions, w)) for w in widths),
                    ("faiss", lambda: faiss_rows(device, faiss_n, (faiss_dim, latent_dim), (job_images, job_captions),
                                                        Path(tmp))),
                    ("cold job", lambda: job_rows(device, job_images, job_captions, Path(tmp)))]
        for name, section in sections:
            started = time.perf_counter()
            got = section()
            rows += got
            print(f"{name}: {time.perf_counter() - started:.1f} s, " + ", ".join(r["status"] for r in got), flush=True)
    seconds = round(time.perf_counter() - began, 1)
    print("\n" + table(rows))
    bad = failed(rows)
    print(f"\ngpu_check on {machine['gpu']}: {'all checks held' if not bad else f'{len(bad)} check(s) FAILED'} "
          f"in {seconds} s")
    if args.json:
        Path(args.json).write_text(json.dumps({**machine, "seconds": seconds, "rows": rows}, indent=2),
                                   encoding="utf-8")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
