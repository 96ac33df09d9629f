"""The run's ``tune`` stage: the fusion's weights (and settings) chosen on a tuning split, by the grid of
:mod:`fusebench.evaluation.tuning` over lists from :func:`~fusebench.backends.retrieval.retrieve`; and the progress
bars the stages show."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from fusebench.backends.retrieval import ListSource, retrieve
from fusebench.config.run import RunConfig
from fusebench.config.schema import DATASET_KINDS, TuneConfig
from fusebench.data import load_corpus
from fusebench.evaluation.record import TuneRecord
from fusebench.evaluation.tuning import apply, best, grid, run_grid, seeded_split, slice_embeddings
from fusebench.fusion.presets import true_label
from fusebench.runtime.progress import bar as progress_bar

log = logging.getLogger(__name__)


def tune_on_split(tuning: TuneConfig, config: RunConfig, corpus, embeddings, fusion, search, embed: Callable):
    """Evaluate the tuning grid on the tuning split (``embed(config, corpus)``: the pipeline's embedding step, for
    another split's rows); return the tuning record, the test corpus and models
    (without the held-out images for a seeded split) with the chosen weights, and the chosen fusion."""
    if tuning.split == "seeded":
        held = seeded_split(corpus, tuning.fraction, tuning.seed)
        tune_corpus, tune_images, tune_captions = corpus.without_images(~held)
        test_corpus, test_images, test_captions = corpus.without_images(held)
        test_corpus = replace(test_corpus, meta={**corpus.meta, "tuning_held_out_images": int(held.sum())})
        tune_models = slice_embeddings(embeddings, tune_images, tune_captions)
        corpus, embeddings = test_corpus, slice_embeddings(embeddings, test_images, test_captions)
    else:
        tune_models, tune_corpus = embed(config, load_corpus(
            DATASET_KINDS.get(config.dataset.kind).split_params(config.dataset, tuning.split)))
    points = grid(tuning, [m.name for m in embeddings], fusion)
    log.info("tuning on %s (%d images, %d captions): %d settings by %s", tuning.split, tune_corpus.n_images,
             tune_corpus.n_captions, len(points), tuning.criterion)
    quiet = replace(search, progress=None)
    started = time.perf_counter()
    source = ListSource()  # one source for the grid: each model's lists are built once, reused by every point

    def lists_of(models, point_fusion):
        return retrieve(models, tune_corpus.caption_image, point_fusion, keep_k=1, settings=quiet, source=source)

    curve = run_grid(points, tune_models, fusion, tuning, lists_of,
                     progress=progress_updates("tuning", len(points), unit="setting"))
    chosen = best(curve)
    embeddings, fusion = apply(chosen, embeddings, fusion)
    fusion = true_label(fusion, weights=[m.weight for m in embeddings])  # tuned settings may leave a preset
    seeded = tuning.split == "seeded"
    record = TuneRecord(split=tuning.split, criterion=tuning.criterion, n_images=tune_corpus.n_images,
                        n_captions=tune_corpus.n_captions, curve=curve, chosen=chosen, singles=curve[0].singles or {},
                        seconds=round(time.perf_counter() - started, 3), fraction=tuning.fraction if seeded else None,
                        seed=tuning.seed if seeded else None)
    return record, corpus, embeddings, fusion


def progress_updates(desc: str, total: int, unit: str = "query"):
    """A tqdm bar for one stage of the search; closed when it reaches its total."""
    bar = progress_bar(total=total, desc=desc, unit=unit, leave=False)

    def update(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()

    return update
