"""The queries ``search.target_recall`` chooses an index's search-time setting on, gathered before the search and
never among the queries reported (:mod:`fusebench.backends.target_recall` says how they are used).

* ``search.tune_queries=split``: ``search.tune_images`` images of the dataset's other split
  (:func:`fusebench.data.tuning_split`: Karpathy's val, a sim corpus's val draw), embedded by every model as its
  test split is (through the cache); the reported corpus is untouched.
* ``held_out``: a seeded sample of the test images with captions (at most ``search.tune_images`` and at most
  :data:`HELD_OUT_SHARE` of them), with their captions, taken out of the test split before anything is searched:
  every reported metric, of every retriever, is over the other images, and the record says how many were held out
  (``dataset.meta.index_tuning_held_out_images``).
* ``auto``: ``split`` where the dataset has one and every model can embed it, else ``held_out``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fusebench import FusebenchError
from fusebench.backends.target_recall import TuningQueries
from fusebench.config.run import RunConfig
from fusebench.data import other_split, tuning_split
from fusebench.data.corpus import Corpus
from fusebench.encoders.base import ModelEmbeddings
from fusebench.encoders.kinds.vectors import VectorsModel
from fusebench.evaluation.tuning import slice_embeddings

log = logging.getLogger(__name__)
HELD_OUT_SHARE = 0.1  # held_out: at most this share of the test images with captions
HELD_OUT_KEY = "index_tuning_held_out_images"  # the test corpus's meta: images held out for the index's tuning


def _no_split_reason(config: RunConfig, given: bool) -> str | None:
    """Why the run's models cannot be asked for another split's queries (None: they can)."""
    if given:
        return "the corpus and rows were handed to the run (fusebench.evaluate), so there is no other split to embed"
    if other_split(config.dataset) is None:
        return f"a {config.dataset.kind} dataset has one split only"
    fixed = [name for name, spec in config.models.items() if isinstance(spec, VectorsModel)]
    if fixed:
        return f"model {fixed[0]} is kind vectors (rows of the test split only: nothing can embed another split)"
    return None


def held_out_images(corpus: Corpus, n_images: int, seed: int) -> np.ndarray:
    """(n_images,) bool: the test images held out (a seeded sample of those with captions: at most ``n_images`` and
    :data:`HELD_OUT_SHARE` of them, at least one, never all)."""
    with_captions = corpus.i2t_query_images
    if len(with_captions) < 2:
        raise FusebenchError("search.tune_queries=held_out needs at least two test images with captions (one to tune "
                             "on, one to report).")
    n = max(1, min(n_images, int(HELD_OUT_SHARE * len(with_captions)), len(with_captions) - 1))
    held = np.zeros(corpus.n_images, dtype=bool)
    held[np.random.default_rng(seed).choice(with_captions, size=n, replace=False)] = True
    return held


def _rows(models: list[ModelEmbeddings], corpus: Corpus) -> dict[str, dict[str, np.ndarray]]:
    images = corpus.i2t_query_images
    return {m.name: {"t2i": np.asarray(m.text), "i2t": np.asarray(m.image)[images]} for m in models}


def tuning_queries(config: RunConfig, corpus: Corpus, embeddings: list[ModelEmbeddings],
                   embed: Callable[[RunConfig, Corpus], tuple[list[ModelEmbeddings], Corpus]], given: bool = False
                   ) -> tuple[TuningQueries | None, Corpus, list[ModelEmbeddings]]:
    """(the tuning queries, the corpus and embeddings the run reports on); nothing to gather (None, as given)
    without ``search.target_recall`` on an index that has a setting to choose. ``embed(config, corpus)``: the
    pipeline's embedding step; ``given``: the corpus and rows came from the caller (no other split)."""
    search = config.search
    if not search.tuned:
        return None, corpus, embeddings
    why = _no_split_reason(config, given)
    mode = search.tune_queries if search.tune_queries != "auto" else ("held_out" if why else "split")
    if mode == "split":
        if why:
            raise FusebenchError(f"search.tune_queries=split asks for the queries of another split, and {why}; "
                                 "valid: search.tune_queries=held_out (test images held out of every reported "
                                 "metric) or auto.")
        tune_corpus = tuning_split(config.dataset, search.tune_images, search.seed)
        tune_models, tune_corpus = embed(config, tune_corpus)
        split = other_split(config.dataset)
        log.info("index tuning: %d captions, %d images of the %s split", tune_corpus.n_captions,
                 tune_corpus.n_images, split)
        return (TuningQueries("split", split, tune_corpus.n_images, tune_corpus.n_captions,
                              _rows(tune_models, tune_corpus)), corpus, embeddings)
    held = held_out_images(corpus, search.tune_images, search.seed)
    tune_corpus, tune_images, tune_captions = corpus.without_images(~held)
    test_corpus, test_images, test_captions = corpus.without_images(held)
    test_corpus = replace(test_corpus, meta={**corpus.meta, HELD_OUT_KEY: int(held.sum())})
    log.info("index tuning: %d test images and their %d captions held out of every reported metric",
             tune_corpus.n_images, tune_corpus.n_captions)
    queries = TuningQueries("held_out", str(getattr(config.dataset, "split", "test")), tune_corpus.n_images,
                            tune_corpus.n_captions, _rows(slice_embeddings(embeddings, tune_images, tune_captions),
                                                          tune_corpus))
    return queries, test_corpus, slice_embeddings(embeddings, test_images, test_captions)
