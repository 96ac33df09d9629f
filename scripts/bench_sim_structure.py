#!/usr/bin/env python
"""How approximate indexes behave on the simulator's two structures (dataset.structure: isotropic | clustered).

For each structure: one sim model's image rows over a gallery of --size rows (the sim test split's 5,000 images,
then gallery=sim distractors, both as fusebench draws them) and --queries of its caption queries (a seeded sample of
the test split's 25,010 captions), searched with FAISS directly (inner product on unit rows = cosine):
  * exact: IndexFlatIP, the reference lists (top --depth) and its query time;
  * IVF-Flat over --nlist lists (default about 4 sqrt(size), trained on a seeded sample of 64 rows per list):
    neighbour recall@depth against exact and query time at each nprobe of a doubling ladder, and the smallest share
    of lists visited that reaches recall --target; the same for in-distribution image queries (images drawn like
    the gallery's, not in it), to show what the modality gap does to an image index;
  * HNSW (M --hnsw-m, efConstruction --ef-construction): build time, and recall and query time per efSearch.
Query times are the least of --repeats runs of the whole query batch, on --threads threads.
The clustered structure uses conf/dataset/sim_clustered.yaml's values; the isotropic one the sim defaults.

Usage: python scripts/bench_sim_structure.py [--size 200000] [--queries 2000] [--dim 254] [--threads 2]
       [--structures isotropic clustered] [--skip-hnsw] [--json FILE]      (--size 1000000 for the issue's target)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np
from bench_common import cpu_model
from omegaconf import OmegaConf

from fusebench.config import CONFIG_DIR
from fusebench.config.gallery import GalleryConfig
from fusebench.config.specs import SimParams
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import make_sim_corpus, sim_model_embeddings
from fusebench.encoders.distractors import normalised
from fusebench.encoders.simulated import sim_distractor_rows

# a CLIP-family-like sim model (conf/models/sim_dfn5b_like.yaml's noise and score placement) at d = 254 (+2)
CLIP_LIKE = SimParams(dim=254, image_noise=0.24, text_noise=0.21, seed=2, score_scale=0.4, score_shift=0.12)


def preset_values(name: str) -> dict:
    """The keys conf/dataset/``name``.yaml sets, over those of the dataset presets its defaults list names."""
    node = OmegaConf.load(Path(CONFIG_DIR) / "dataset" / f"{name}.yaml")
    values = {}
    for entry in node.pop("defaults", None) or []:  # a sibling preset (not a schema, not _self_)
        if isinstance(entry, str) and not entry.startswith("/") and entry != "_self_":
            values.update(preset_values(entry))
    return {**values, **OmegaConf.to_container(node)}


def dataset_preset(name: str, **changes):
    """The sim dataset of conf/dataset/``name``.yaml (a preset of kind sim), with ``changes`` to its keys."""
    return SimDatasetConfig(**{**preset_values(name), **changes})


def dataset(structure: str):
    """The sim dataset of ``structure``: the isotropic defaults, or the sim_clustered preset's values."""
    return dataset_preset("sim" if structure == "isotropic" else "sim_clustered")


def rows(settings: SimDatasetConfig, size: int, n_queries: int, params: SimParams, seed: int):
    """(gallery rows (size, d), caption query rows, image query rows), unit float32."""
    corpus = make_sim_corpus(settings)
    images, texts = sim_model_embeddings(corpus, params.dim, params.image_noise, params.text_noise, params.seed,
                                         params.score)
    images, texts = normalised(images), normalised(texts)
    n_distractors = max(0, size - corpus.n_images)
    gallery = GalleryConfig(kind="sim", size=n_distractors + n_queries, near_duplicate=None)
    distractors = sim_distractor_rows(params, corpus, gallery)
    pick = np.sort(np.random.default_rng(seed).choice(corpus.n_captions, n_queries, replace=False))
    base = np.vstack([images[:size], distractors.read(0, n_distractors)])
    image_queries = distractors.read(n_distractors, n_distractors + n_queries)  # drawn like the gallery, not in it
    return np.ascontiguousarray(base), np.ascontiguousarray(texts[pick]), np.ascontiguousarray(image_queries)


def timed_search(index, queries: np.ndarray, k: int, repeats: int) -> tuple[np.ndarray, float]:
    best, ids = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        _, ids = index.search(queries, k)
        best = min(best, time.perf_counter() - start)
    return ids, best


def neighbour_recall(ids: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |approximate top-k ∩ exact top-k| / k."""
    k = exact.shape[1]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ids, exact)]))


def nprobe_ladder(nlist: int) -> list[int]:
    ladder, n = [], 1
    while n < nlist:
        ladder.append(n)
        n *= 2
    return ladder + [nlist]


def measure(structure: str, args, params: SimParams) -> dict:
    start = time.perf_counter()
    base, text_q, image_q = rows(dataset(structure), args.size, args.queries, params, args.seed)
    out = {"structure": structure, "rows": len(base), "dim": base.shape[1], "queries": len(text_q),
           "generate_s": time.perf_counter() - start}
    d, k = base.shape[1], args.depth
    flat = faiss.IndexFlatIP(d)
    flat.add(base)
    exact_text, out["exact_s"] = timed_search(flat, text_q, k, args.repeats)
    exact_image, _ = timed_search(flat, image_q, k, 1)
    scores, _ = flat.search(text_q, k)
    out["t2i_neighbour_cosine"] = [float(scores[:, 0].mean()), float(scores.mean()), float(scores[:, -1].mean())]
    scores, _ = flat.search(image_q, 2)
    out["i2i_neighbour_cosine"] = float(scores[:, 0].mean())
    del flat

    nlist = args.nlist or int(2 ** round(np.log2(4 * np.sqrt(len(base)))))
    quantizer = faiss.IndexFlatIP(d)
    ivf = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    sample = base[np.sort(np.random.default_rng(args.seed).choice(len(base), min(len(base), 64 * nlist),
                                                                   replace=False))]
    start = time.perf_counter()
    ivf.train(sample)
    ivf.add(base)
    out["ivf"] = {"nlist": nlist, "build_s": time.perf_counter() - start, "text": [], "image": []}
    for nprobe in nprobe_ladder(nlist):
        ivf.nprobe = nprobe
        ids, seconds = timed_search(ivf, text_q, k, args.repeats)
        recall_t = neighbour_recall(ids, exact_text)
        recall_i = neighbour_recall(ivf.search(image_q, k)[1], exact_image)
        out["ivf"]["text"].append([nprobe, recall_t, seconds])
        out["ivf"]["image"].append([nprobe, recall_i])
        if recall_t >= 0.999 and recall_i >= 0.999:
            break
    del ivf, quantizer

    if not args.skip_hnsw:
        hnsw = faiss.IndexHNSWFlat(d, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = args.ef_construction
        start = time.perf_counter()
        hnsw.add(base)
        out["hnsw"] = {"M": args.hnsw_m, "efConstruction": args.ef_construction,
                       "build_s": time.perf_counter() - start, "text": []}
        for ef in args.ef_search:
            hnsw.hnsw.efSearch = ef
            ids, seconds = timed_search(hnsw, text_q, k, args.repeats)
            out["hnsw"]["text"].append([ef, neighbour_recall(ids, exact_text), seconds])
    return out


def first_reaching(ladder: list, target: float, nlist: int) -> str:
    hit = next((row for row in ladder if row[1] >= target), None)
    return "not reached" if hit is None else f"nprobe {hit[0]} ({100 * hit[0] / nlist:.1f}% of lists)"


def report(results: list[dict], args) -> str:
    lines = [f"rows {results[0]['rows']:,} x d {results[0]['dim']}, {results[0]['queries']:,} caption queries, "
             f"top {args.depth}, {args.threads} threads, faiss {faiss.__version__}, CPU: {cpu_model()}", "",
             "| structure | exact s (flat, the caption queries, as every time here) "
             "| t2i top-1 / mean / 100th cosine | i2i top-1 cosine | IVF nlist | IVF lists for "
             f"recall {args.target}: captions; images | IVF at that nprobe: recall, s (x exact) | HNSW build s | "
             "HNSW efSearch: recall, s (x exact) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        ivf, exact = r["ivf"], r["exact_s"]
        hit = next((row for row in ivf["text"] if row[1] >= args.target), ivf["text"][-1])
        hnsw = r.get("hnsw")
        hnsw_cells = ("-", "-") if hnsw is None else (
            f"{hnsw['build_s']:.1f}",
            "; ".join(f"{ef}: {rec:.3f}, {s:.2f} ({s / exact:.2f}x)" for ef, rec, s in hnsw["text"]))
        lines.append(
            f"| {r['structure']} | {exact:.2f} | {' / '.join(f'{c:.3f}' for c in r['t2i_neighbour_cosine'])} | "
            f"{r['i2i_neighbour_cosine']:.3f} | {ivf['nlist']} | {first_reaching(ivf['text'], args.target, ivf['nlist'])}; "
            f"{first_reaching(ivf['image'], args.target, ivf['nlist'])} | {hit[1]:.3f}, {hit[2]:.2f} "
            f"({hit[2] / exact:.2f}x) | {hnsw_cells[0]} | {hnsw_cells[1]} |")
    lines.append("")
    for r in results:
        lines.append(f"{r['structure']} IVF ladder (nprobe: caption recall, image recall, caption s): " + "; ".join(
            f"{t[0]}: {t[1]:.3f}, {i[1]:.3f}, {t[2]:.2f}" for t, i in zip(r["ivf"]["text"], r["ivf"]["image"])))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=200_000, help="gallery rows (test images + distractors)")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--dim", type=int, default=254, help="the sim model's dim (rows carry two more)")
    parser.add_argument("--structures", nargs="+", default=["isotropic", "clustered"])
    parser.add_argument("--nlist", type=int, default=None)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--ef-search", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--skip-hnsw", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)
    params = replace(CLIP_LIKE, dim=args.dim)  # the CLIP-like sim model at --dim
    results = []
    for structure in args.structures:
        results.append(measure(structure, args, params))
        print(json.dumps(results[-1]), flush=True)
    print(report(results, args))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "cpu": cpu_model(),
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
