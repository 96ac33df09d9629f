#!/usr/bin/env python
"""The GPU checks, in one prepared run (under 8 minutes on one H100/H200-class GPU): what a session lent a device
runs once, and pastes the output of into its note.

1. **Embedding on CUDA equals the CPU's**: the tiny random-weight models the tests build (open_clip from a small
   config, transformers CLIP and SigLIP 2 from small configs, saved and loaded through the users' code path) embed
   the tiny dataset on the CPU in fp32 and on CUDA in fp32 and in bf16 autocast (``embed.precision``); the largest
   absolute difference of the L2-normalised rows must stay under ``FP32_TOL`` (fp32; TF32 matmuls allowed) and
   ``BF16_TOL`` (bf16).
2. **Exact search at a million images**: 1,000,000 seeded unit distractors plus 5,000 test images, 25,010 captions
   whose target is a noisy copy of their image, at widths 1152 and 1024 (SigLIP 2 So400m's and DFN5B's), through
   ``gallery_lists`` on CUDA in fp32 and in the certified bf16 path (``eval.search_precision=auto``); the ranks and
   the top-100 ids must be equal, and the seconds per model are reported (target: 2 s).
3. **FAISS's GPU index**, where the GPU build is installed: ``IndexFlatIP`` over 200,000 of those rows on the GPU
   against the same index on the CPU (ids equal where the scores are not tied).

Usage: python scripts/gpu_check.py [--n 1000000] [--captions 25010] [--widths 1152 1024] [--out gpu_check.json]
       python scripts/gpu_check.py --device cpu --n 20000 --captions 2000 --widths 64   (a dry run of the script)
Exits 1 when a check fails, 0 when all held (a section skipped for want of CUDA or FAISS's GPU build says so).
"""

from __future__ import annotations

import argparse
import json
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
N_TEST, DEPTH = 5000, 100


def embedding_check(device: str) -> dict:
    """Section 1: each tiny model's rows on ``device`` (fp32, bf16) against the CPU's (fp32)."""
    from helpers.tiny_models import build_hf, build_open_clip

    from fusebench.config.schema import EmbedConfig
    from fusebench.data.tiny import load_tiny
    from fusebench.encoders.models import embed

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        specs = {"open_clip": {"kind": "open_clip", "model": f"local-dir:{build_open_clip(root / 'oc')}"},
                 "hf_clip": {"kind": "hf", "checkpoint": str(build_hf(root / "clip", "clip"))},
                 "hf_siglip2": {"kind": "hf", "checkpoint": str(build_hf(root / "siglip2", "siglip2"))}}
        corpus = load_tiny()
        for name, spec in specs.items():
            rows = {}
            for where, precision in (("cpu", "fp32"), (device, "fp32"), (device, "bf16")):
                runtime = EmbedConfig.with_defaults(str(root / f"cache_{where}_{precision}"), device=where,
                                                    precision=precision, num_workers=0, batch_size=16,
                                                    cache_dtype="fp32")
                got = embed(name, spec, corpus, runtime)
                rows[where, precision] = (got.image, got.text)
            base = rows["cpu", "fp32"]
            diff = {p: max(float(np.abs(rows[device, p][i] - base[i]).max()) for i in (0, 1)) for p in ("fp32", "bf16")}
            out[name] = {"max_abs_fp32": diff["fp32"], "max_abs_bf16": diff["bf16"],
                         "ok": diff["fp32"] <= FP32_TOL and diff["bf16"] <= BF16_TOL}
            print(f"embed {name}: |{device} fp32 - cpu| {diff['fp32']:.2e} (<= {FP32_TOL:g}), |{device} bf16 - cpu| "
                  f"{diff['bf16']:.2e} (<= {BF16_TOL:g}): {'ok' if out[name]['ok'] else 'FAILED'}", flush=True)
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def unit(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=np.float32)


def search_check(device: str, n: int, captions: int, width: int) -> dict:
    """Section 2 at one width: fp32 and certified bf16 on ``device``, ranks and ids equal, seconds each."""
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
    out = {}
    for precision in ("fp32", None):
        sync(device)
        began = time.perf_counter()
        lists = gallery_lists(text, image, caption_image, distractors, DEPTH, device, precision=precision)
        sync(device)
        out["bf16_certified" if precision is None else "fp32"] = (lists, time.perf_counter() - began)
    (fp32, s32), (bf16, s16) = out["fp32"], out["bf16_certified"]
    same = {d: bool(np.array_equal(np.asarray(fp32[d].ranks), np.asarray(bf16[d].ranks))
                    and np.array_equal(np.asarray(fp32[d].ids), np.asarray(bf16[d].ids))) for d in ("t2i", "i2t")}
    result = {"width": width, "items": N_TEST + n, "captions": captions, "fp32_s": round(s32, 2),
              "bf16_certified_s": round(s16, 2), "equal": same, "ok": all(same.values())}
    print(f"search d={width}: {N_TEST + n:,} items x {captions:,} captions: fp32 {s32:.2f} s, certified bf16 "
          f"{s16:.2f} s (target 2 s); ranks and ids equal: {same}", flush=True)
    return result


def faiss_gpu_check(n: int, width: int = 1024) -> dict:
    """Section 3: FAISS's flat index on the GPU against the CPU's, where the GPU build is installed."""
    try:
        import faiss
    except ImportError:
        return {"skipped": "faiss is not installed"}
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        return {"skipped": f"faiss {faiss.__version__} has no GPU build here"}
    rng = np.random.default_rng(7)
    items = unit(rng.standard_normal((n, width), dtype=np.float32))
    queries = unit(items[:2000] + rng.standard_normal((2000, width), dtype=np.float32) / np.sqrt(width))
    cpu = faiss.IndexFlatIP(width)
    cpu.add(items)
    resources = faiss.StandardGpuResources()
    gpu = faiss.index_cpu_to_gpu(resources, 0, cpu)
    began = time.perf_counter()
    gs, gi = gpu.search(queries, DEPTH)
    seconds = time.perf_counter() - began
    cs, ci = cpu.search(queries, DEPTH)
    untied = np.abs(cs - gs) > 1e-5  # a position whose score differs: not the same neighbour
    ok = bool(not untied.any() and (np.mean(ci == gi) > 0.999))
    print(f"faiss gpu flat: {n:,} x {width}, 2,000 queries in {seconds:.2f} s; ids equal {np.mean(ci == gi):.4%}: "
          f"{'ok' if ok else 'FAILED'}", flush=True)
    return {"items": n, "seconds": round(seconds, 3), "same_ids": float(np.mean(ci == gi)), "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000, help="distractors in the search check")
    parser.add_argument("--captions", type=int, default=25_010)
    parser.add_argument("--widths", type=int, nargs="+", default=[1152, 1024])
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself (small --n)")
    args = parser.parse_args()
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing was checked.")
    began = time.perf_counter()
    report = {"gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else "none (cpu dry run)",
              "torch": torch.__version__}
    print(f"GPU: {report['gpu']}, torch {report['torch']}", flush=True)
    report["embedding"] = embedding_check(device)
    report["search"] = [search_check(device, args.n, args.captions, w) for w in args.widths]
    report["faiss_gpu"] = faiss_gpu_check(min(args.n, 200_000))
    report["seconds"] = round(time.perf_counter() - began, 1)
    Path(args.out).write_text(json.dumps(report, indent=2))
    ok = (all(r["ok"] for r in report["embedding"].values()) and all(r["ok"] for r in report["search"])
          and report["faiss_gpu"].get("ok", True))
    print(f"gpu_check: {'all checks held' if ok else 'a check FAILED'} in {report['seconds']} s ({args.out})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
