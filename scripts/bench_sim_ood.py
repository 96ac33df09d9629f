#!/usr/bin/env python
"""How out of distribution are the simulator's caption queries for an index built on its images?

The published out-of-distribution (OOD) workloads (big-ann-benchmarks' NeurIPS'23 OOD track on Yandex
Text-to-Image, OOD-DiskANN, RoarGraph) compare, on one index built on image vectors, what text queries cost against
what in-distribution (ID) image queries cost for the same neighbour recall. This script measures that ratio on a sim
model's gallery (bench_sim_structure.py's rows: the sim test split's images, then gallery=sim distractors; ID
queries are rows drawn like the gallery's, not in it):

  * IVF-Flat (nlist about 4 sqrt(rows), trained as bench_sim_structure.py does): for each query, the rank of its
    exact neighbours' lists in its probe order gives neighbour recall at every nprobe at once (an IVF-Flat scan of
    the probed lists returns every true neighbour they hold), so the smallest share of lists reaching each target
    recall is exact, not read off a ladder;
  * HNSW (M --hnsw-m, efConstruction --ef-construction, over the first --hnsw-size rows): distance computations
    per query (faiss.cvar.hnsw_stats.ndis) along an efSearch ladder, interpolated (log ndis, linear in recall) to
    each target recall;
  * RoarGraph's two measures of an OOD query: how far its nearest neighbours are (cosine to the 1st and k-th) and how
    far apart they are from one another (mean cosine between its k nearest).

Every ratio is caption queries over image queries, within one run, at recall@k for each --ks and --targets.

Usage: python scripts/bench_sim_ood.py [--dataset sim_clustered] [--set key=value ...] [--size 200000]
       [--queries 2000] [--ks 10 100] [--targets 0.9 0.95] [--hnsw-size 100000] [--skip-hnsw] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import faiss
import numpy as np
from bench_common import cpu_model
from bench_sim_structure import CLIP_LIKE, dataset_preset, rows

# --- IVF: the lists a query needs ------------------------------------------------------------------------------


def ivf_nlist(n_rows: int) -> int:
    """About 4 sqrt(rows), a power of two (bench_sim_structure.py's default)."""
    return int(2 ** round(np.log2(4 * np.sqrt(n_rows))))


def train_ivf(base: np.ndarray, nlist: int, seed: int):
    """An IVF-Flat quantizer trained as bench_sim_structure.py trains it (64 sampled rows per list) and each base
    row's list: (quantizer, list of each row (n,) int64)."""
    d = base.shape[1]
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = seed
    pick = np.sort(np.random.default_rng(seed).choice(len(base), min(len(base), 64 * nlist), replace=False))
    ivf.train(base[pick])
    quantizer = ivf.quantizer
    assign = quantizer.search(base, 1)[1][:, 0]
    return ivf, assign


def list_ranks(quantizer, assign: np.ndarray, queries: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
    """(q, k) int: the position (0 = probed first) of each exact neighbour's list in its query's probe order
    (lists by inner product with the query, as IndexIVFFlat probes them). Neighbour j is found at nprobe n iff
    its rank < n."""
    nlist = quantizer.ntotal
    order = quantizer.search(queries, nlist)[1]
    rank = np.empty_like(order)
    rank[np.arange(len(order))[:, None], order] = np.arange(nlist)
    return np.take_along_axis(rank, assign[neighbours], axis=1)


def lists_for_recall(ranks: np.ndarray, target: float) -> int:
    """The smallest nprobe whose neighbour recall (mean over queries of the share of each query's neighbours in its
    first nprobe lists) reaches ``target``."""
    flat = np.sort(ranks, axis=None)
    return int(flat[max(0, math.ceil(target * flat.size - 1e-9) - 1)]) + 1


# --- HNSW: distance computations a query needs ---------------------------------------------------------------

EF_LADDER = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def neighbour_recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |found ∩ exact| / k."""
    k = exact.shape[1]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(found, exact)]))


def hnsw_curve(hnsw, queries: np.ndarray, exact: np.ndarray, ladder=EF_LADDER) -> list[tuple[int, float, float]]:
    """[(efSearch, recall@k, distance computations per query)] along ``ladder`` (k = exact's width), up to the
    first efSearch whose recall passes 0.99."""
    k, curve = exact.shape[1], []
    for ef in sorted({max(ef, k) for ef in ladder}):  # FAISS searches with max(efSearch, k)
        hnsw.hnsw.efSearch = ef
        faiss.cvar.hnsw_stats.reset()
        found = hnsw.search(queries, k)[1]
        curve.append((ef, neighbour_recall(found, exact), faiss.cvar.hnsw_stats.ndis / len(queries)))
        if curve[-1][1] >= 0.99:
            break
    return curve


def work_at(curve: list[tuple[int, float, float]], target: float) -> float:
    """Distance computations per query at recall ``target``: log-linear between the ladder points around it (nan
    when the ladder never reaches it)."""
    for (_, r0, w0), (_, r1, w1) in zip(curve, curve[1:]):
        if r0 >= target:
            return w0
        if r1 >= target:
            share = (target - r0) / (r1 - r0)
            return float(np.exp(np.log(w0) + share * (np.log(w1) - np.log(w0))))
    return curve[0][2] if curve and curve[0][1] >= target else float("nan")


# --- RoarGraph's measures ------------------------------------------------------------------------------------

def neighbour_geometry(base: np.ndarray, queries: np.ndarray, scores: np.ndarray, ids: np.ndarray, k: int) -> dict:
    """Cosine of each query to its 1st and k-th nearest row, and the mean cosine between its k nearest rows
    (RoarGraph: an OOD query's neighbours lie far from it and far from one another), averaged over queries."""
    near = base[ids[:, :k]]
    gram = np.einsum("qid,qjd->qij", near, near)
    off = (gram.sum(axis=(1, 2)) - np.trace(gram, axis1=1, axis2=2)) / (k * (k - 1))
    return {"first": float(scores[:, 0].mean()), "kth": float(scores[:, k - 1].mean()), "among": float(off.mean())}


# --- one measurement -------------------------------------------------------------------------------------------

def measure(base: np.ndarray, text_q: np.ndarray, image_q: np.ndarray, ks, targets, seed: int,
            hnsw_rows: int | None, hnsw_m: int = 32, ef_construction: int = 100) -> dict:
    """Every ratio of the module docstring on one gallery (``hnsw_rows``: rows HNSW is built on, None = no HNSW)."""
    d, depth = base.shape[1], max(ks)
    flat = faiss.IndexFlatIP(d)
    flat.add(base)
    exact = {name: flat.search(q, depth) for name, q in (("text", text_q), ("image", image_q))}
    out = {"rows": len(base), "dim": d, "queries": len(text_q), "geometry": {}, "ivf": {}, "hnsw": None}
    for name, q in (("text", text_q), ("image", image_q)):
        out["geometry"][name] = {k: neighbour_geometry(base, q, *exact[name], k) for k in ks}
    nlist = ivf_nlist(len(base))
    ivf, assign = train_ivf(base, nlist, seed)
    ranks = {name: list_ranks(ivf.quantizer, assign, q, exact[name][1])
             for name, q in (("text", text_q), ("image", image_q))}
    out["ivf"] = {"nlist": nlist, "lists": {f"{k}@{t}": {name: lists_for_recall(r[:, :k], t) for name, r in ranks.items()}
                                            for k in ks for t in targets}}
    if hnsw_rows:
        sub = base[:hnsw_rows]
        hnsw = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = ef_construction
        start = time.perf_counter()
        hnsw.add(sub)
        out["hnsw"] = {"rows": len(sub), "M": hnsw_m, "efConstruction": ef_construction,
                       "build_s": time.perf_counter() - start, "curves": {}, "ndis": {}}
        small = faiss.IndexFlatIP(d)
        small.add(sub)
        for k in ks:
            for name, q in (("text", text_q), ("image", image_q)):
                curve = hnsw_curve(hnsw, q, small.search(q, k)[1])
                out["hnsw"]["curves"][f"{k}/{name}"] = curve
                for t in targets:
                    out["hnsw"]["ndis"].setdefault(f"{k}@{t}", {})[name] = work_at(curve, t)
    return out


def report(r: dict, label: str) -> str:
    lines = [f"{label}: {r['rows']:,} rows x d {r['dim']}, {r['queries']:,} caption and image queries; IVF nlist "
             f"{r['ivf']['nlist']}" + ("" if r["hnsw"] is None else
                                        f"; HNSW M {r['hnsw']['M']} efC {r['hnsw']['efConstruction']} over "
                                        f"{r['hnsw']['rows']:,} rows (build {r['hnsw']['build_s']:.0f} s)"),
             "", "| recall@k target | IVF lists: captions / images (share of nlist) | ratio | HNSW distances per "
             "query: captions / images | ratio |", "| --- | --- | --- | --- | --- |"]
    nlist = r["ivf"]["nlist"]
    for key, lists in r["ivf"]["lists"].items():
        k, t = key.split("@")
        text, image = lists["text"], lists["image"]
        ivf_cell = f"{text} ({100 * text / nlist:.2f}%) / {image} ({100 * image / nlist:.2f}%) | {text / image:.1f}x"
        if r["hnsw"] is None:
            hnsw_cell = "- | -"
        else:
            w = r["hnsw"]["ndis"][key]
            hnsw_cell = f"{w['text']:,.0f} / {w['image']:,.0f} | {w['text'] / w['image']:.1f}x"
        lines.append(f"| {t} @ {k} | {ivf_cell} | {hnsw_cell} |")
    lines.append("")
    for name, by_k in r["geometry"].items():
        lines.append(f"{name} queries: " + "; ".join(
            f"k={k}: cosine to 1st {g['first']:.3f}, to {k}th {g['kth']:.3f}, among the {k} {g['among']:.3f}"
            for k, g in by_k.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="sim_clustered", help="a conf/dataset preset of kind sim")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="dataset keys to change")
    parser.add_argument("--size", type=int, default=200_000, help="gallery rows (test images + distractors)")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--ks", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--targets", type=float, nargs="+", default=[0.9, 0.95])
    parser.add_argument("--hnsw-size", type=int, default=None, help="rows HNSW is built on (default --size)")
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--skip-hnsw", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)
    overrides = dict(item.split("=", 1) for item in args.set)
    settings = dataset_preset(args.dataset, **{k: json.loads(v) if v[:1] in "-.0123456789[{tfn" else v
                                               for k, v in overrides.items()})
    start = time.perf_counter()
    base, text_q, image_q = rows(settings, args.size, args.queries, CLIP_LIKE, args.seed)
    result = measure(base, text_q, image_q, args.ks, args.targets, args.seed,
                     None if args.skip_hnsw else (args.hnsw_size or args.size), args.hnsw_m, args.ef_construction)
    result["seconds"] = time.perf_counter() - start
    label = f"{args.dataset}" + (f" ({', '.join(args.set)})" if args.set else "")
    print(report(result, label))
    print(f"\n{result['seconds']:.0f} s, {args.threads} threads, faiss {faiss.__version__}, CPU: {cpu_model()}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "cpu": cpu_model(),
                                         "result": result}, indent=1))


if __name__ == "__main__":
    main()
