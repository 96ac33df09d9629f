#!/usr/bin/env python
"""Benchmark the FAISS search backend at COCO size against the exact path.

Builds the default job's corpus (dataset=sim: 5,000 images, 25,010 captions) and its two simulated models
(conf/models/sim_siglip2_like.yaml and sim_dfn5b_like.yaml, through fusebench's own encoder) and reports, per
model:
  * exact: compute_model_lists at --depth (both directions in one pass, exact ranks: the exact path's search);
  * per index kind (flat, ivf_flat, hnsw, ivf_pq at the search config's defaults, or the values given) and
    direction: build seconds, query seconds (every query of the direction, batched) and per query, index bytes,
    neighbour recall@depth and top-1 agreement against the exact lists; for flat, the share of queries whose list
    and rank equal the exact ones (ids that differ only within float-rounding ties are counted apart);
  * FAISS's total query time (both directions) over the exact path's search time (target <= 2x), build apart.
Times are the least of --repeats runs (the exact path's, and each index's searches: the first run builds the index
into a temporary index store, the later ones read it back), so that a machine shared with other work is measured
at its least loaded. Usage: python scripts/bench_ann.py [--indexes flat hnsw] [--depth 100] [--repeats 2]
[--threads N] [--nprobe 32] [--ef-search 256] [--nlist N] [--hnsw-m 32] [--ef-construction 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from bench_common import cpu_model
from omegaconf import OmegaConf

from fusebench.backends import base as backends
from fusebench.backends.faiss_index import faiss_lists, faiss_version
from fusebench.backends.quality import with_quality
from fusebench.config import CONFIG_DIR
from fusebench.config.search import INDEX_READS, INDEXES, SearchConfig
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import make_sim_corpus
from fusebench.encoders.models import embed
from fusebench.search.model_lists import compute_model_lists

MODELS = ("sim_siglip2_like", "sim_dfn5b_like")
TIE = 1e-5  # scores this close are float-rounding ties (FAISS's BLAS and torch's matmul sum in other orders)


def flat_agreement(ann, exact, direction: str) -> dict:
    """Flat against exact: queries with identical ids and list ranks; of the others, those whose every differing
    position holds the same score in both lists within TIE (items tied up to float rounding, which FAISS's BLAS
    and torch's matmul order differently, a boundary tie with an item past the list included), and the largest
    score difference at any position."""
    ids, scores = ann.lists[direction].ids.numpy(), ann.lists[direction].scores.numpy()
    ex_ids, ex_scores = exact[direction].ids.numpy()[:, :ids.shape[1]], exact[direction].scores.numpy()[:, :ids.shape[1]]
    ex_ranks = exact[direction].ranks
    same = (ids == ex_ids).all(axis=1) & (ann.lists[direction].ranks == np.where(ex_ranks <= ids.shape[1], ex_ranks, 0))
    tied = ~same & ((ids == ex_ids) | (np.abs(scores - ex_scores) <= TIE)).all(axis=1)
    return {"identical": float(same.mean()), "differ": int((~same).sum()), "differ_within_ties": int(tied.sum()),
            "max_score_diff": float(np.abs(scores - ex_scores).max())}


def exact_lists(model, caption_image, depth: int):
    started = time.perf_counter()
    lists = compute_model_lists(model.text, model.image, caption_image, depth, "cpu")
    return lists, time.perf_counter() - started


def index_runs(model, caption_image, depth: int, config: SearchConfig, repeats: int, store: str):
    """The first run's lists (the index built and stored), its build seconds, and the least query seconds per
    direction over ``repeats`` runs (the later ones read the index from the store)."""
    runs = [faiss_lists(model, caption_image, depth, config, torch.device("cpu"), store) for _ in range(repeats)]
    query_s = {d: min(r.costs[d].query_ms * len(r.lists[d].ids.numpy()) / 1000 for r in runs) for d in runs[0].costs}
    return runs[0], query_s


def bench_model(model, caption_image, depth: int, indexes: list[str], overrides: dict, repeats: int) -> dict:
    timed = [exact_lists(model, caption_image, depth) for _ in range(repeats)]
    exact, exact_s = timed[0][0], min(seconds for _, seconds in timed)
    out = {"exact_s": exact_s, "indexes": {}}
    for kind in indexes:
        reads = {*INDEX_READS[kind], *backends.get("faiss").settings}  # an index is given only the settings it reads
        config = SearchConfig(backend="faiss", index=kind, **{k: v for k, v in overrides.items() if k in reads})
        with tempfile.TemporaryDirectory() as store:
            ann, query_s = index_runs(model, caption_image, depth, config, repeats, store)
        quality = with_quality(ann, exact)
        rows = {}
        for direction, q in quality.items():
            rows[direction] = {**asdict(q), "query_s": query_s[direction],
                               "query_ms": 1000 * query_s[direction] / len(ann.lists[direction].ids.numpy()),
                               "params": ann.params[direction]}
            if kind == "flat":
                rows[direction]["flat_vs_exact"] = flat_agreement(ann, exact, direction)
        out["indexes"][kind] = rows
    return out


def print_table(results: dict, depth: int) -> None:
    print(f"\n{'model':<18} {'index':<9} {'dir':<4} {'build s':>8} {'query s':>8} {'ms/query':>9} {'MB':>7} "
          f"{'recall@' + str(depth):>10} {'top1':>6}  params")
    for name, result in results.items():
        print(f"{name:<18} {'exact':<9} both {'-':>8} {result['exact_s']:8.2f} {'':>9} {'':>7} {'1.0000':>10} {'1.000':>6}  "
              f"compute_model_lists depth {depth}")
        for kind, rows in result["indexes"].items():
            for direction, r in rows.items():
                extra = ""
                if "flat_vs_exact" in r:
                    f = r["flat_vs_exact"]
                    extra = (f"  identical {f['identical']:.4f} ({f['differ']} differ, {f['differ_within_ties']} within ties; "
                             f"largest score difference {f['max_score_diff']:.1e})")
                print(f"{name:<18} {kind:<9} {direction:<4} {r['build_seconds']:8.2f} {r['query_s']:8.2f} "
                      f"{r['query_ms']:9.4f} {r['index_bytes'] / 2**20:7.1f} {r['neighbour_recall']:10.4f} "
                      f"{r['top1_agreement']:6.3f}  {r['params']}{extra}")
            query = sum(r["query_s"] for r in rows.values())
            build = sum(r["build_seconds"] for r in rows.values())
            print(f"{'':<18} {kind:<9} both {build:8.2f} {query:8.2f}  query / exact search = "
                  f"{query / result['exact_s']:.2f}x  (build + query = {(build + query) / result['exact_s']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--indexes", nargs="+", default=list(INDEXES), choices=INDEXES)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None, help="FAISS threads (default: every core)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs; the least search time is reported")
    for name in ("nlist", "nprobe", "hnsw-m", "ef-construction", "ef-search", "pq-m", "nbits"):
        parser.add_argument(f"--{name}", type=int, default=None, help="default: the search config's")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    overrides = {k: v for k, v in vars(args).items() if v is not None and k not in ("indexes", "depth", "json", "repeats")}
    print(f"CPU: {cpu_model()}  torch threads: {torch.get_num_threads()}  {faiss_version()}  overrides: {overrides}")
    corpus = make_sim_corpus(SimDatasetConfig())  # the default job's: 5,000 images, 25,010 captions
    specs = {name: OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "models" / f"{name}.yaml")) for name in MODELS}
    models = [embed(name, spec, corpus) for name, spec in specs.items()]
    print(f"{corpus.n_images} images, {corpus.n_captions} captions; widths {[m.dim for m in models]}")
    small = models[0]
    compute_model_lists(small.text[:300], small.image[:200], corpus.caption_image[:300] % 200, 10, "cpu")  # kernels
    results = {m.name: bench_model(m, corpus.caption_image, args.depth, args.indexes, overrides, args.repeats)
               for m in models}
    print_table(results, args.depth)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "faiss": faiss_version(), "overrides": overrides,
                                               "results": results}, indent=2, default=str))


if __name__ == "__main__":
    main()
