#!/usr/bin/env python
"""Where a model's lists spend their time beyond the matmul: the CPU selection kernels stage by stage.

For each of the default job's two models (25,010 captions x 5,000 images, d = 1,152 and 1,024) the lists' pass is
replayed tile by tile as ``search.model_lists.lists_pass`` runs it on the CPU (4,096-caption tiles, every image in
one tile), each stage timed on its own: the tile's matmul, the rows' heaps with the rank counts
(``topk_kernels.offer_rows_count``), the columns' heaps (``offer_columns``) and the heaps' final sorts (``finish``).
Each pass's lists (ids and scores, both directions) and t2i ranks are checked against the pipeline's own
``compute_model_lists`` (the same kernels: this checks the replay, not the kernels, which tests/ compares with
``topk_stable``). The medians of ``--repeats`` passes are printed in
seconds and as a ratio to the model's matmuls ([docs/speed.md](../docs/speed.md#where-a-cold-cli-job-goes)).

Usage: python scripts/bench_selection.py [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import DEFAULT_MODELS, cpu_model, default_job_models

from fusebench.search.exact import float_rows, similarity
from fusebench.search.model_lists import compute_model_lists
from fusebench.search.topk_kernels import Heaps, offer_rows_count

STAGES = ("matmul", "rows", "columns", "sorts")


def one_pass(text: torch.Tensor, image: torch.Tensor, caption_image: np.ndarray, chunk: int, depth: int = 100):
    """The lists' pass with a timer around each stage: (seconds per stage, {t2i_ids, t2i_scores, t2i_ranks, i2t_ids,
    i2t_scores}); a t2i rank is the entries counted ahead of the caption's target, plus one."""
    n_captions, n_images = text.shape[0], image.shape[0]
    query_images = np.unique(caption_image)
    slot = np.full(n_images, -1, dtype=np.int64)
    slot[query_images] = np.arange(query_images.size)
    columns = Heaps(query_images.size, depth)
    buffer = torch.empty(chunk * n_images)
    seconds = dict.fromkeys(STAGES, 0.0)
    t2i_ids, t2i_scores, t2i_ranks = [], [], []
    for r0 in range(0, n_captions, chunk):
        r1 = min(n_captions, r0 + chunk)
        start = time.perf_counter()
        block = similarity(text[r0:r1], image, out=buffer[: (r1 - r0) * n_images].view(r1 - r0, n_images)).numpy()
        seconds["matmul"] += time.perf_counter() - start
        rows = Heaps(r1 - r0, depth)
        targets = caption_image[r0:r1]
        target_score = block[np.arange(r1 - r0), targets].copy()
        ahead = np.zeros(r1 - r0, dtype=np.int64)
        start = time.perf_counter()
        offer_rows_count(block, 0, rows.vals, rows.ids, rows.counts, target_score, targets, ahead)
        seconds["rows"] += time.perf_counter() - start
        start = time.perf_counter()
        columns.offer_columns(block, r0, slot)
        seconds["columns"] += time.perf_counter() - start
        start = time.perf_counter()
        scores, ids = rows.lists()
        seconds["sorts"] += time.perf_counter() - start
        t2i_ids.append(ids.copy())
        t2i_scores.append(scores.copy())
        t2i_ranks.append(ahead + 1)
    start = time.perf_counter()
    i2t_scores, i2t_ids = columns.lists()
    seconds["sorts"] += time.perf_counter() - start
    return seconds, {"t2i_ids": np.concatenate(t2i_ids), "t2i_scores": np.concatenate(t2i_scores),
                     "t2i_ranks": np.concatenate(t2i_ranks), "i2t_ids": i2t_ids, "i2t_scores": i2t_scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="passes per model (the median is reported)")
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    torch.set_float32_matmul_precision("highest")
    corpus, models = default_job_models()
    caption_image = np.asarray(corpus.caption_image).astype(np.int64)
    result = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "repeats": args.repeats, "models": {}}
    for name, model in zip(DEFAULT_MODELS, models):
        text, image = float_rows(model.text, torch.device("cpu")), float_rows(model.image, torch.device("cpu"))
        reference = compute_model_lists(text, image, caption_image, 100, "cpu", args.chunk_size).arrays()
        one_pass(text, image, caption_image, args.chunk_size)  # warm-up: kernels loaded, buffers touched
        runs = []
        for _ in range(args.repeats):
            seconds, arrays = one_pass(text, image, caption_image, args.chunk_size)
            differ = [key for key, array in arrays.items() if not np.array_equal(array, reference[key])]
            if differ:
                raise SystemExit(f"{name}: the replayed pass's {', '.join(differ)} differ from compute_model_lists'")
            runs.append(seconds)
        result["models"][name] = {stage: round(float(np.median([r[stage] for r in runs])), 4) for stage in STAGES}
    print(f"CPU {result['cpu']} ({result['threads']} threads); median of {args.repeats} passes per model, "
          "4,096-caption tiles x 5,000 images")
    for name, stages in result["models"].items():
        matmul = stages["matmul"]
        parts = ", ".join(f"{stage} {stages[stage]:.3f} s = {stages[stage] / matmul:.3f}x" for stage in STAGES[1:])
        selection = sum(stages[stage] for stage in STAGES[1:])
        print(f"  {name:18} matmul {matmul:.3f} s; {parts}; selection {selection / matmul:.3f}x the matmul")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
