"""Helpers for notebooks: find a sweep, reload a run's corpus, list the misses that are right answers.

The DataFrames a notebook explores (runs, retrievers, comparisons, one run's queries won and lost) are in
:mod:`fusebench.report.frames`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from fusebench import FUSED
from fusebench.config.run import dataset_config
from fusebench.data import load_corpus
from fusebench.report.runs import Run, load_runs


def latest_sweep(outputs: str | Path | None = None) -> Path | None:
    """$FUSEBENCH_SWEEP if set, else the newest multirun dir under outputs/multirun."""
    if os.environ.get("FUSEBENCH_SWEEP"):
        return Path(os.environ["FUSEBENCH_SWEEP"])
    root = Path(outputs or os.environ.get("FUSEBENCH_OUTPUT", "outputs")) / "multirun"
    sweeps = sorted(p for p in root.glob("*/*") if p.is_dir())
    return sweeps[-1] if sweeps else None


def run_corpus(run: Run):
    """The run's corpus, rebuilt from its saved config (sim corpora are regenerated from their seed)."""
    cfg = OmegaConf.load(run.path / ".hydra" / "config.yaml")

    return load_corpus(dataset_config(OmegaConf.to_container(cfg.dataset, resolve=True)))


def positive_misses(run: Run, positive_set: str = "eccv", retriever: str = FUSED, direction: str = "t2i",
                    corpus=None) -> list[dict]:
    """Queries of ``positive_set`` (eval.positives) that the split counts as missed at R@1, although the first
    item retrieved is one of the set's extra positives: the "misses" that are right answers. ``corpus``: the
    run's corpus (default: rebuilt from its saved config)."""
    from fusebench.evaluation.positives import load_positives  # lazy: heavy (torch, scipy)

    corpus = corpus if corpus is not None else run_corpus(run)
    positives = load_positives(positive_set, corpus)
    with np.load(run.path / "topk" / f"{retriever}.{direction}.npz") as data:
        lists = data["ids"]
    ranks = run.ranks(retriever, direction)
    if direction == "t2i":
        rows, sets = positives.t2i_queries, positives.t2i_sets
    else:
        rows, sets = np.searchsorted(corpus.i2t_query_images, positives.i2t_queries), positives.i2t_sets
    out = []
    for query, row, positive in zip(positives.t2i_queries if direction == "t2i" else positives.i2t_queries, rows, sets):
        listed = [int(i) for i in lists[row] if i >= 0 and (direction == "t2i" or positives.caption_gallery[i])]
        if ranks[row] == 1 or not listed or listed[0] not in set(positive.tolist()):
            continue
        first = listed[0]
        if direction == "t2i":
            out.append({"query": corpus.captions[query], "caption_id": corpus.caption_ids[query],
                        "its image": corpus.image_ids[int(corpus.caption_image[query])],
                        f"retrieved first ({positive_set} positive)": corpus.image_ids[first],
                        "rank of its image": int(ranks[row]),
                        "image_path": (corpus.image_paths or [None] * corpus.n_images)[first]})
        else:
            out.append({"query image": corpus.image_ids[query], f"retrieved first ({positive_set} positive)":
                        corpus.captions[first], "caption_id": corpus.caption_ids[first],
                        "rank of its own captions": int(ranks[row])})
    return out


__all__ = ["latest_sweep", "load_runs", "positive_misses", "run_corpus"]
