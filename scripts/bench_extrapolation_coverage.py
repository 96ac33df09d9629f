#!/usr/bin/env python
"""Coverage of the distractor-scaling extrapolation's interval (fusebench.evaluation.extrapolation) on the sim.

Per setting (structure: isotropic | clustered; test images: 3,000 | 5,000, 5 captions each; N -> M distractors:
2,000 -> 20,000 | 10,000 -> 100,000) and seed s (``dataset.seed`` = ``gallery.seed`` = s, so each seed is a fresh
test split and a fresh gallery), one sim model (conf/models/sim_siglip2_like.yaml at width ``--width``, 256 as
experiment=gallery_indexes uses) is searched exactly with fusebench's own code: ``gallery_lists`` (the search a run
does) over the test images and ``gallery=sim``'s first N distractors gives the exact ranks and the saved t2i lists
(``--depth`` deep, 50 as experiment=distractor_scaling saves them); since galleries of one seed nest, a query's
rank at M is its rank at N plus its count of distractors N..M-1 scoring above its target (the same rows,
:class:`~fusebench.encoders.simulated.SimDistractorRows`), counted for the queries at rank 1 with N (only R@1 is
predicted, and a rank only grows), so nothing is searched twice. ``predict_recall`` then predicts R@1 at M from N
(``--draws`` bootstrap draws, 95%), and the table gives per setting: the seeds, the observed coverage (the
measured R@1 at M inside the interval), the point prediction's mean error (predicted - measured) and its sd, the
mean interval width and the mean measured R@1.

The searches are cached per (structure, images, seed) under ``--cache`` (npz; one 10,000 -> 100,000 seed of 5,000
images takes 1-2 minutes on 2 shared cores), so a change of the prediction is measured again without searching
(``--cached``: predict from the seeds the cache holds, search nothing; ``--search-only``: fill it). Every seed's
2,000 -> 20,000 search comes before the first 10,000 -> 100,000 one, and a stopped run goes on where it stopped.
  python scripts/bench_extrapolation_coverage.py --seeds 0-19 --draws 200 --cache /tmp/extrap_cache
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from fusebench.config.gallery import GalleryConfig
from fusebench.config.specs import SimParams
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import make_sim_corpus
from fusebench.encoders.simulated import SimDistractorRows, sim_arrays
from fusebench.evaluation.extrapolation import predict_recall
from fusebench.search.exact import float_rows, similarity
from fusebench.search.gallery_search import gallery_lists

CLUSTERED = dict(structure="clustered", caption_noise=1.65, shared_caption_noise=0.36)  # dataset=sim_clustered's
STEPS = {"small": (2000, 20000), "large": (10000, 100000)}


def model(width: int) -> SimParams:
    """conf/models/sim_siglip2_like.yaml at ``width``."""
    return SimParams(dim=width, image_noise=0.22, text_noise=0.22, seed=1, score_scale=0.3, score_shift=0.0)


def corpus_of(structure: str, images: int, seed: int):
    return make_sim_corpus(SimDatasetConfig(n_images=images, n_captions=5 * images, seed=seed,
                                            **(CLUSTERED if structure == "clustered" else {})))


def count_above(text: torch.Tensor, target: torch.Tensor, rows: SimDistractorRows, start: int, stop: int,
                tile: int = 4096, chunk: int = 8192) -> np.ndarray:
    """Per caption, the distractors start..stop-1 scoring strictly above its target (a tie ranks after it: a
    distractor's index is past every test image's)."""
    out = torch.zeros(text.shape[0], dtype=torch.int64)
    for c0 in range(start, stop, tile):
        items = float_rows(rows.read(c0, min(c0 + tile, stop)))
        for r0 in range(0, text.shape[0], chunk):
            out[r0:r0 + chunk] += (similarity(text[r0:r0 + chunk], items) > target[r0:r0 + chunk, None]).sum(dim=1)
    return out.numpy()


def searched(structure: str, images: int, seed: int, width: int, depth: int, phase: str, cache: Path) -> dict:
    """The cached search of one (structure, images, seed): ranks and lists at 2,000 and 10,000 distractors, ranks
    at 20,000 and (phase large) 100,000."""
    path = cache / f"{structure}_{images}_{seed}_w{width}_d{depth}.npz"
    done = dict(np.load(path)) if path.is_file() else {}
    if "rank_20000" in done and (phase == "small" or "rank_100000" in done):
        return done
    corpus = corpus_of(structure, images, seed)
    params = model(width)
    image, text_np = sim_arrays(params, corpus)
    caption_image = np.asarray(corpus.caption_image)
    rows = SimDistractorRows(params, corpus, GalleryConfig(kind="sim", size=100000, seed=seed, near_duplicate=None))
    text = float_rows(text_np)
    image_t = float_rows(image)
    target = (text * image_t[torch.as_tensor(caption_image)]).sum(dim=1)
    if "rank_20000" not in done:
        for n in (2000, 10000):
            t2i = gallery_lists(text_np, image, caption_image, _Prefix(rows, n), depth).arrays()
            done[f"rank_{n}"], done[f"ids_{n}"], done[f"scores_{n}"] = (t2i["t2i_ranks"], t2i["t2i_ids"],
                                                                        t2i["t2i_scores"])
        first = np.flatnonzero(done["rank_2000"] == 1)  # only R@1 is measured at M (ranks only grow)
        done["rank_20000"] = done["rank_10000"].copy()  # exact where the rank at 2,000 is 1
        done["rank_20000"][first] += count_above(text[first], target[first], rows, 10000, 20000)
        done["caption_image"] = caption_image
    if phase == "large":  # only R@1 is measured at M: the queries at rank 1 with 10,000 are counted on
        first = np.flatnonzero(done["rank_10000"] == 1)
        rank = done["rank_20000"].copy()
        rank[first] += count_above(text[first], target[first], rows, 20000, 100000)
        done["rank_100000"] = rank  # exact where the rank at 10,000 is 1; elsewhere above 1 (not needed)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **done)
    tmp.replace(path)
    return done


def cached(structure: str, images: int, seed: int, args) -> dict:
    """What the cache holds for one (structure, images, seed) ({} when nothing)."""
    path = args.cache / f"{structure}_{images}_{seed}_w{args.width}_d{args.depth}.npz"
    return dict(np.load(path)) if path.is_file() else {}


class _Prefix:
    """The first ``n`` rows of a SimDistractorRows (the gallery of ``gallery.size=n``: galleries nest)."""

    def __init__(self, rows: SimDistractorRows, n: int):
        self._rows, self.n, self.dim, self.key = rows, int(n), rows.dim, {**rows.key, "n": int(n)}

    def read(self, start: int, stop: int) -> np.ndarray:
        return self._rows.read(start, min(stop, self.n))


def predicted(lists: dict, images: int, n: int, m: int, draws: int) -> tuple[float, float, float, float]:
    """(predicted, low, high, measured) R@1 at ``m`` from the lists at ``n``."""
    cap = lists["caption_image"]
    p = predict_recall(lists[f"rank_{n}"], cap, lists[f"ids_{n}"], lists[f"scores_{n}"], images, cap, n, m,
                       draws=draws)
    return p.value, p.low, p.high, 100.0 * float(np.mean(lists[f"rank_{m}"] == 1))


def seeds_of(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-19")
    ap.add_argument("--structures", nargs="+", default=["clustered", "isotropic"])
    ap.add_argument("--images", nargs="+", type=int, default=[3000, 5000])
    ap.add_argument("--steps", nargs="+", default=["small", "large"], choices=list(STEPS))
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=50)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/fusebench_extrapolation_coverage"))
    ap.add_argument("--search-only", action="store_true", help="fill the cache, predict nothing")
    ap.add_argument("--cached", action="store_true", help="search nothing: predict from the seeds in the cache")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    seeds = seeds_of(args.seeds)
    for step in [s for s in ("small", "large") if s in args.steps and not args.cached]:  # every 2k -> 20k first
        for images in args.images:  # the seeds in turn, each in every setting: a run stopped early is even
            for seed in seeds:
                for structure in args.structures:
                    start = time.perf_counter()
                    searched(structure, images, seed, args.width, args.depth, step, args.cache)
                    print(f"# searched {structure} {images} seed {seed} ({step}): "
                          f"{time.perf_counter() - start:.0f} s", flush=True)
    if args.search_only:
        return
    print(f"\nsim_siglip2_like at width {args.width}, lists {args.depth} deep, {args.draws} draws, nominal 95%; "
          f"seeds {args.seeds}\n")
    print("| structure | test images (captions) | N -> M | seeds | covered | coverage | mean error (pred - meas) "
          "| sd of error | mean width | mean measured R@1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for step in args.steps:
        n, m = STEPS[step]
        for structure in args.structures:
            for images in args.images:
                ready = [s for s in seeds if f"rank_{m}" in cached(structure, images, s, args)]
                if not ready:
                    continue
                got = np.array([predicted(cached(structure, images, s, args), images, n, m, args.draws)
                                for s in ready])
                value, low, high, measured = got.T
                inside = (low <= measured) & (measured <= high)
                error = value - measured
                print(f"| {structure} | {images:,} ({5 * images:,}) | {n:,} -> {m:,} | {len(ready)} | "
                      f"{int(inside.sum())} | {100 * inside.mean():.0f}% | {error.mean():+.2f} | "
                      f"{error.std(ddof=1) if len(seeds) > 1 else 0:.2f} | {(high - low).mean():.2f} | "
                      f"{measured.mean():.2f} |", flush=True)


if __name__ == "__main__":
    main()
