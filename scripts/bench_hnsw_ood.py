"""FAISS HNSW on the clustered sim's caption queries (out of distribution for a graph built on images): neighbour
recall@k and search time against the bare fp32 matmuls of the same captions in the same process, for the graph as
fusebench builds it and three variants aimed at out-of-distribution queries (docs/search.md#faiss-at-a-million).

    python scripts/bench_hnsw_ood.py --size 1000000 --variants plain sq8
    python scripts/bench_hnsw_ood.py --size 200000 --variants plain entry captions

* ``plain``: IndexHNSWFlat(d, M, inner product) with efConstruction, searched at each ``--ef``;
* ``sq8``: IndexHNSWSQ (8-bit codes in the graph) inside an IndexRefineFlat re-ranking ``--k-factor`` x k hits by the
  full vectors;
* ``entry``: the plain graph searched from level 0 only, from the nodes nearest the query's best ``--entries`` of
  ``--centroids`` k-means centroids (FAISS's ``search_level_0``, every entry point in one candidate list);
* ``captions``: held-out captions (those of the second half of the corpus's images; the queries are captions of the
  first half) inserted as extra nodes, the results restricted to the gallery's rows (IDSelectorRange).
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np
from bench_common import cpu_model
from bench_sim_structure import CLIP_LIKE, dataset_preset, rows

from fusebench.data.simulated import make_sim_corpus


def queries_and_held_out(settings, size: int, n_queries: int, seed: int):
    """(gallery rows, test captions of the first half of the images, captions of the second half)."""
    corpus = make_sim_corpus(settings)
    base, texts, _ = rows(settings, size, corpus.n_captions, CLIP_LIKE, seed)  # every caption, in caption order
    caption_image = np.asarray(corpus.caption_image)
    first = np.nonzero(caption_image < corpus.n_images // 2)[0]
    pick = np.random.default_rng(seed).choice(first, min(n_queries, len(first)), replace=False)
    return base, np.ascontiguousarray(texts[pick]), np.ascontiguousarray(texts[caption_image >= corpus.n_images // 2])


def bare_seconds(queries: np.ndarray, base: np.ndarray) -> float:
    """The best of two passes of the fp32 matmuls of ``queries`` against every row, in blocks of 65,536 rows."""
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        for s in range(0, len(base), 65536):
            queries @ base[s:s + 65536].T
        best = min(best, time.perf_counter() - started)
    return best


def recall(ids: np.ndarray, exact: np.ndarray) -> float:
    k = exact.shape[1]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ids, exact)]))


def timed(search, *args, **kwargs) -> tuple[np.ndarray, float, float]:
    """(ids, seconds, distance computations) of ``search(*args, **kwargs)`` (FAISS's (scores, ids), or ids)."""
    faiss.cvar.hnsw_stats.reset()
    started = time.perf_counter()
    out = search(*args, **kwargs)
    seconds = time.perf_counter() - started
    return (out[1] if isinstance(out, tuple) else out), seconds, faiss.cvar.hnsw_stats.ndis


def entry_search(index, base, queries, k, ef, centroids, representatives, entries):
    """Level-0 search from the nodes nearest each query's ``entries`` best centroids, all in one candidate list."""
    top = centroids.search(queries, entries)[1]
    nearest = np.ascontiguousarray(representatives[top], dtype=np.int32)
    distances = np.ascontiguousarray(-np.einsum("qd,qpd->qp", queries, base[nearest]), dtype=np.float32)
    out_d = np.empty((len(queries), k), np.float32)
    out_i = np.empty((len(queries), k), np.int64)
    index.hnsw.efSearch = ef
    index.search_level_0(len(queries), faiss.swig_ptr(queries), k, faiss.swig_ptr(nearest),
                         faiss.swig_ptr(distances), faiss.swig_ptr(out_d), faiss.swig_ptr(out_i), entries, 2)
    return out_i


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=200_000, help="gallery rows (test images + sim distractors)")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--ef", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--variants", nargs="+", default=["plain"], choices=["plain", "sq8", "entry", "captions"])
    parser.add_argument("--k-factor", type=int, default=2)
    parser.add_argument("--centroids", type=int, default=1024)
    parser.add_argument("--entries", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    faiss.omp_set_num_threads(2)
    base, queries, held_out = queries_and_held_out(dataset_preset("sim_clustered"), args.size, args.queries, args.seed)
    d, k = base.shape[1], args.depth
    flat = faiss.IndexFlatIP(d)
    flat.add(base)
    exact = flat.search(queries, k)[1]
    bare = bare_seconds(queries, base)
    print(f"CPU {cpu_model()}; faiss {faiss.__version__}; {len(base):,} rows x d {d}, {len(queries):,} caption "
          f"queries, recall@{k}; bare fp32 matmuls {bare:.2f} s")

    def row(name, ids, seconds, ndis):
        print(f"{name:<46} recall {recall(ids, exact):.4f}  {seconds:7.2f} s = {seconds / bare:.3f}x bare  "
              f"{ndis / len(queries):8.0f} distances a query", flush=True)

    def graph(extra=None, sq8=False):
        started = time.perf_counter()
        index = (faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_8bit, args.m, faiss.METRIC_INNER_PRODUCT) if sq8
                 else faiss.IndexHNSWFlat(d, args.m, faiss.METRIC_INNER_PRODUCT))
        index.hnsw.efConstruction = args.ef_construction
        if sq8:
            index.train(base[:200_000])
        index.add(base)
        if extra is not None:
            index.add(extra)
        print(f"built M {args.m} efConstruction {args.ef_construction}{' SQ8' if sq8 else ''}"
              f"{f' + {len(extra):,} caption nodes' if extra is not None else ''} in {time.perf_counter() - started:.0f} s")
        return index

    for variant in args.variants:
        if variant in ("plain", "entry"):
            index = graph()
            if variant == "plain":
                for ef in args.ef:
                    index.hnsw.efSearch = ef
                    row(f"plain efSearch {ef}", *timed(index.search, queries, k))
                continue
            km = faiss.Kmeans(d, args.centroids, niter=10, spherical=True, seed=1)
            km.train(base[np.random.default_rng(1).choice(len(base), min(len(base), 64 * args.centroids), False)])
            centroids = faiss.IndexFlatIP(d)
            centroids.add(km.centroids)
            representatives = flat.search(km.centroids, 1)[1][:, 0]  # each centroid's nearest row
            for entries in args.entries:
                for ef in args.ef:
                    row(f"entry points {entries}, efSearch {ef}", *timed(
                        entry_search, index, base, queries, k, ef, centroids, representatives, entries))
        elif variant == "sq8":
            refined = faiss.IndexRefineFlat(graph(sq8=True), faiss.swig_ptr(base))
            refined.k_factor = args.k_factor
            for ef in args.ef:
                faiss.downcast_index(refined.base_index).hnsw.efSearch = max(ef, args.k_factor * k)
                row(f"SQ8 re-ranked x{args.k_factor}, efSearch {ef}", *timed(refined.search, queries, k))
        else:
            index = graph(extra=held_out)
            only_rows = faiss.IDSelectorRange(0, len(base))
            for ef in args.ef:
                params = faiss.SearchParametersHNSW(efSearch=ef, sel=only_rows)
                row(f"caption nodes, efSearch {ef}", *timed(index.search, queries, k, params=params))


if __name__ == "__main__":
    main()
