#!/usr/bin/env python
"""Benchmark the embedding pipeline for one model on the current device.

Reports images/s of the whole pipeline (decode and preprocess in DataLoader workers, forward pass, cache
write) against images/s of the model's forward pass alone on pre-made tensors, and the wall time of a
warm-cache rerun against the cold run. Model loading is timed separately and excluded from images/s.

With no weights available (offline machines), ``--model ViT-B-32`` builds open_clip's ViT-B/32 with
random weights and saves it as a local-dir checkpoint, so the timing is that of the real architecture,
loaded through the users' code path. Images: the tiny dataset's photographs, repeated to --images.
Usage: python scripts/bench_embed.py [--model ViT-B-32] [--images 512] [--batch-size 64] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from fusebench.config.schema import EmbedConfig
from fusebench.data.corpus import Corpus
from fusebench.data.tiny import load_tiny
from fusebench.encoders.devices import resolve_device
from fusebench.encoders.models import load_raw
from fusebench.encoders.openclip import OpenClipEncoder
from fusebench.encoders.real import autocast


def random_open_clip(model: str, folder: Path) -> Path:
    import open_clip
    from open_clip.factory import get_model_config
    from safetensors.torch import save_file

    cfg = get_model_config(model)
    net = open_clip.create_model(model, pretrained=None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": {}}))
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return folder


def repeated_corpus(n_images: int) -> Corpus:
    base = load_tiny()
    index = [i % base.n_images for i in range(n_images)]
    return Corpus(name="bench", image_ids=[f"img{i}" for i in range(n_images)],
                  captions=[base.captions[5 * j] for j in index], caption_image=torch.arange(n_images).numpy(),
                  image_paths=[base.image_paths[j] for j in index])


def forward_only(spec: dict, corpus: Corpus, runtime: EmbedConfig, device: torch.device) -> tuple[float, float]:
    encoder = OpenClipEncoder("bench", spec)
    precision = runtime.resolved_precision(device)
    started = time.perf_counter()
    encoder.load(device)
    load_seconds = time.perf_counter() - started
    from PIL import Image

    tensors = [encoder.image_transform(Image.open(p).convert("RGB")) for p in corpus.image_paths[: runtime.batch_size]]
    batch = torch.stack(tensors).to(device)
    batches = -(-corpus.n_images // runtime.batch_size)
    with autocast(device, precision):
        encoder.encode_images(batch)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(batches):
            encoder.encode_images(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return batches * runtime.batch_size / (time.perf_counter() - started), load_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-B-32", help="open_clip architecture (random weights)")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    device = resolve_device(args.device)
    work = Path(tempfile.mkdtemp(prefix="fusebench-bench-embed-"))
    spec = {"kind": "open_clip", "model": f"local-dir:{random_open_clip(args.model, work / 'ckpt')}"}
    corpus = repeated_corpus(args.images)
    runtime = EmbedConfig.with_defaults(str(work / "cache"), device=args.device, batch_size=args.batch_size,
                                    num_workers=args.workers)

    forward_ips, _ = forward_only(spec, corpus, runtime, device)
    started = time.perf_counter()
    cold = load_raw("bench", spec, corpus, runtime)
    cold_seconds = time.perf_counter() - started
    seconds = cold.info["embed_seconds"]
    pipeline_ips = corpus.n_images / (seconds["images"] - seconds["model_load"])
    started = time.perf_counter()
    warm = load_raw("bench", spec, corpus, runtime)
    warm_seconds = time.perf_counter() - started
    assert warm.info["cache"]["image_hit"] and not warm.info["model_loaded"]

    result = {"device": str(device), "model": args.model, "images": corpus.n_images, "batch_size": args.batch_size,
              "workers": args.workers, "forward_only_img_s": round(forward_ips, 1),
              "pipeline_img_s": round(pipeline_ips, 1), "pipeline_over_forward": round(pipeline_ips / forward_ips, 2),
              "model_load_s": seconds["model_load"], "cold_run_s": round(cold_seconds, 2),
              "warm_run_s": round(warm_seconds, 3), "warm_speedup": round(cold_seconds / warm_seconds, 1)}
    print(f"{args.model} (random weights) on {device}, {corpus.n_images} images, batch {args.batch_size}, "
          f"{args.workers} workers")
    print(f"  forward pass only, pre-made tensors   {forward_ips:8.1f} img/s")
    print(f"  whole pipeline (decode..cache write)  {pipeline_ips:8.1f} img/s   = {pipeline_ips / forward_ips:.2f}x"
          f"   (target >= 0.8x on a 2-core CPU, 0.9x on a GPU)")
    print(f"  cold run (load, images, texts)        {cold_seconds:8.2f} s   (model load {seconds['model_load']:.2f} s)")
    print(f"  warm-cache rerun                      {warm_seconds:8.3f} s   = {cold_seconds / warm_seconds:.0f}x faster"
          f"   (target >= 20x)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
