"""A composed config (Hydra's DictConfig), converted once into one typed :class:`~fusebench.config.run.RunConfig`:
each group through its converter (:mod:`fusebench.config.run`), whose checks run as it is built, then what spans
groups: recall@k against the list lengths, the tuning split against the dataset, fusion against the models, an engine
preset's label, and the search backend's own rules (:mod:`fusebench.backends`, each backend checking what is its
own). Every mistake is a FusebenchError of one line naming the key and what is valid. The CLI calls it before
importing anything heavy: nothing here imports torch, numba, matplotlib or wandb.
"""

from __future__ import annotations

import os

from fusebench import FusebenchError
from fusebench.backends import base as backends
from fusebench.config.gallery import GalleryConfig, SimDistractorConfig
from fusebench.config.reference import reference_row
from fusebench.config.run import (
    VIEWS,
    VIEWS_ENV,
    RunConfig,
    _nested,
    _plain,
    check_fusion_models,
    check_gallery,
    check_top_keys,
    dataset_config,
    embed_config,
    eval_config,
    logger_config,
    tune_config,
)
from fusebench.config.schema import EvalConfig, PathsConfig, ReferenceConfig, TuneConfig
from fusebench.config.search import SearchConfig, check_depth
from fusebench.config.specs import ModelSpec, model_specs, registry
from fusebench.fusion.config import FusionConfig
from fusebench.fusion.presets import config_folders, true_label
from fusebench.runtime import checks


def check_search(search: SearchConfig, fusion: FusionConfig, models: dict[str, ModelSpec], evaluation: EvalConfig,
                 gallery: GalleryConfig, tuning: TuneConfig | None, dataset_kind: str = "") -> None:
    """Refuse a search backend this run cannot use, before any work (``fusion`` after its preset label was checked):
    what no approximate backend does yet, the list depth HNSW must reach, then the backend's own rules. The index's
    sizes against the corpus (nlist, nprobe, ef_search) are checked once the corpus is read
    (:func:`fusebench.config.search.check_sizes`)."""
    backend = backends.check_search(search, fusion, [spec.weight for spec in models.values()])
    check_slices(gallery, search, evaluation)
    if not search.approximate:
        return
    what = f"search={search.backend}" + (f" (search.index={search.index})" if not backend.engine else "")
    unsupported = [(fusion.top_k is None and len(models) > 1 and fusion.method != "none",
                    "returns lists, not whole rankings: set fusion.top_k (e.g. 100, the default)"),
                   (search.max_memory_gb is not None and not gallery.active and dataset_kind != "manifest",
                    "reads search.max_memory_gb only over a gallery (gallery=...; the test split's index is small): "
                    "leave it unset (null)"),
                   (tuning is not None, "with tune=weights is not supported: tune with search=exact, then run the "
                                        "chosen weights with the index"),
                   (bool(evaluation.positives), "with eval.positives is not supported: use search=exact for the "
                                                "extra positives")]
    for bad, why in unsupported:
        if bad:
            raise FusebenchError(f"{what} {why}.")
    if gallery.active and backend.engine:  # the distractors alone, now; the rest once the corpus is read (pipeline)
        backends.check_capacity(backend, len(models), fusion.fuse_on == "document", gallery.size, search=search)
    check_depth(search, max(evaluation.lists.depth, fusion.top_k or 0, evaluation.save_topk or 0))


def views_choice(value) -> str:
    """The ``views`` key, whose default comes from ``$FUSEBENCH_VIEWS`` (conf/config.yaml): an empty variable counts
    as unset, and a bad value that came from it is named as the variable, since the user never typed ``views=``."""
    env = os.environ.get(VIEWS_ENV)
    if env is not None and value == env:
        return checks.choice(env.strip() or VIEWS[0], f"${VIEWS_ENV} (the default of views)", VIEWS)
    return checks.choice(value, "views", VIEWS)


def check_slices(gallery: GalleryConfig, search: SearchConfig, evaluation: EvalConfig) -> None:
    """``gallery.slices`` cuts the exact search of a gallery, whose slices are kept in the stores' folder. Slices
    search in fp32 (``auto`` means fp32 with slices: pipeline.search_settings): a low-precision pass rescores other
    candidates in each slice than in one process, so its scores' last bits could differ from the one-process run's."""
    if gallery.slices is None:
        return
    for bad, why in [(search.approximate, f"is the exact search's; search={search.backend} builds an index of the "
                                          "whole gallery: use search=exact"),
                     (not gallery.active, "cuts a gallery's search: it needs distractors (gallery=sim | folder | "
                                          "webdataset | paths | vectors with gallery.size > 0)"),
                     (not evaluation.lists.store, "keeps each slice in the slice store (embed.cache.dir/slices): set "
                                                  "eval.lists.store=true"),
                     (evaluation.search_precision not in ("auto", "fp32"),
                      f"searches each slice in fp32, bit for bit as one process does (eval.search_precision="
                      f"{evaluation.search_precision} rescores other candidates in a slice than in the whole "
                      "gallery): set eval.search_precision=fp32 or auto")]:
        if bad:
            raise FusebenchError(f"gallery.slices={gallery.slices} {why}.")


def run_config(cfg) -> RunConfig:
    """The composed config ``cfg`` (a DictConfig or a mapping of its groups) as one checked :class:`RunConfig`."""

    keys = checks.config_keys(RunConfig)
    check_top_keys(cfg, keys)
    group = {key: _plain(checks.required(cfg, key, "config")) for key in keys}
    evaluation = eval_config(group["eval"], "eval")
    fusion = checks.typed(FusionConfig, group["fusion"], "fusion")
    fusion.check_ks(evaluation.ks)
    models = model_specs(group["models"], registry(config_folders()))
    plots = checks.boolean(group["plots"], "plots")
    views = views_choice(group["views"])
    logger = logger_config(group["logger"])
    reference = reference_row(None if not group["reference"] else
                              checks.typed(ReferenceConfig, group["reference"], "reference"))
    embed = embed_config(group["embed"], "embed")
    dataset = dataset_config(group["dataset"])
    tuning = tune_config(group["tune"], dataset)
    check_fusion_models(fusion, models, tuning)
    gallery = checks.typed(GalleryConfig, group["gallery"], "gallery", nested={"sim": _nested(SimDistractorConfig)},
                           dataset_kind=dataset.kind)
    check_gallery(gallery, dataset, models, fusion, tuning)
    fusion = true_label(fusion, weights=[spec.weight for spec in models.values()])
    search = checks.typed(SearchConfig, group["search"], "search")
    check_search(search, fusion, models, evaluation, gallery, tuning, dataset.kind)
    if tuning is not None:
        fusion.check_ks([tuning.k], "tune.criterion")
    resolved = {str(key): group[key] for key in cfg if key != "hydra"}  # the composed order
    return RunConfig(paths=checks.typed(PathsConfig, group["paths"], "paths"), dataset=dataset, gallery=gallery, search=search,
                     models=models,
                     fusion=fusion, eval=evaluation, embed=embed, logger=logger, tune=tuning, plots=plots, views=views,
                     reference=reference, resolved=resolved)
