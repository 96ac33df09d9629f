"""A composed config (Hydra's DictConfig), converted once into one typed :class:`RunConfig`.

:func:`run_config` resolves every group, turns each into its dataclass (:mod:`fusebench.config.schema`, the model
specs of :mod:`fusebench.config.specs`, :class:`fusebench.fusion.config.FusionConfig`), whose checks run as they
are built, then checks what spans groups: recall@k against the list lengths, the tuning split against the dataset,
fusion against the models selected, an engine preset's label. Every mistake is a FusebenchError of one line naming
the key and what is valid; a key nothing reads is one, at any level (the dataclasses' fields are the valid keys).
The CLI calls it before importing anything heavy; nothing here imports torch, numba, matplotlib or wandb.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig, SimDistractorConfig
from fusebench.config.schema import (
    DATASETS,
    LOGGERS,
    BootstrapConfig,
    CacheConfig,
    DatasetConfig,
    EmbedConfig,
    EvalConfig,
    ListsConfig,
    LoggerConfig,
    PathsConfig,
    ReferenceConfig,
    TuneConfig,
)
from fusebench.config.search import ENGINE_PRESETS, MILVUS_MAX_NQ, MILVUS_MAX_TOPK, SearchConfig
from fusebench.config.specs import ModelSpec, model_specs, registry
from fusebench.fusion.config import FusionConfig
from fusebench.runtime import checks

log = logging.getLogger(__name__)


@dataclass
class RunConfig:
    """One job's whole config, typed and checked (the top-level keys are its fields, ``resolved`` aside)."""

    paths: PathsConfig
    dataset: DatasetConfig
    gallery: GalleryConfig  # distractors added to the dataset's gallery (kind none: the test split alone)
    models: dict[str, ModelSpec]
    fusion: FusionConfig
    eval: EvalConfig
    search: SearchConfig  # who answers the queries: exact search, a FAISS index, or an embedded engine
    embed: EmbedConfig
    logger: LoggerConfig
    tune: TuneConfig | None  # None: no tuning (tune.enabled=false); else its split resolved for the dataset
    plots: bool
    reference: dict | None  # the article's row for reference: {dataset, study} (fusebench.report.article)
    resolved: dict = field(default_factory=dict, repr=False, metadata=checks.INTERNAL)  # as composed, for trackers

    @property
    def weights(self) -> list[float]:
        return [spec.weight for spec in self.models.values()]


def _plain(cfg):
    """A composed config node as plain Python (dicts, lists, values), interpolations resolved."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg) if isinstance(cfg, Mapping) else cfg


def _nested(cls, **fields_):
    """A converter (value, key) -> ``cls`` for a group whose fields ``fields_`` are groups of their own."""
    def convert(value, key):
        return checks.typed(cls, value, key, nested=fields_)
    return convert


eval_config = _nested(EvalConfig, bootstrap=_nested(BootstrapConfig), lists=_nested(ListsConfig))
embed_config = _nested(EmbedConfig, cache=_nested(CacheConfig))


def dataset_config(value) -> DatasetConfig:
    """The ``dataset`` group as its kind's dataclass (every key set, as the group's YAML files do)."""
    given = checks.mapping(_plain(value), "dataset")
    kind = checks.choice(checks.required(given, "kind", "dataset"), "dataset.kind", tuple(DATASETS))
    return checks.typed(DATASETS[kind], given, "dataset")


def logger_config(value) -> LoggerConfig:
    """The ``logger`` group: ``kind: none`` reads nothing else (``+logger.project=x`` with it is an error)."""
    given = checks.mapping(value, "logger")
    kind = checks.choice(checks.required(given, "kind", "logger"), "logger.kind", tuple(LOGGERS))
    return checks.typed(LOGGERS[kind], given, "logger (logger=none)" if kind == "none" else "logger")


def tune_config(value, dataset: DatasetConfig) -> TuneConfig | None:
    """The ``tune`` group, None when off; ``split: auto`` is val for a Karpathy dataset, seeded otherwise, and the
    test split itself is refused."""
    if not value:
        return None
    tune = checks.typed(TuneConfig, value, "tune")
    if not tune.enabled:
        return None
    karpathy = dataset.kind == "karpathy"
    split = ("val" if karpathy else "seeded") if tune.split == "auto" else tune.split
    if karpathy and split == "seeded":
        raise FusebenchError("tune.split=seeded holds out part of the test corpus; a Karpathy dataset has its own "
                             "tuning split: use tune.split=val.")
    if not karpathy and split != "seeded":
        raise FusebenchError(f"tune.split={split!r}: a {dataset.kind} corpus has no named splits; use "
                             "tune.split=seeded (a seeded share of its images, tune.fraction).")
    if karpathy and split == dataset.split:
        raise FusebenchError(f"tune.split={split!r} is the split the run reports on (dataset.split={dataset.split}): "
                             "tuning on the test split inflates the gain. Tune on val (tune.split=val).")
    return replace(tune, split=split)


def check_fusion_models(fusion: FusionConfig, models: dict[str, ModelSpec], tuning: TuneConfig | None) -> None:
    """Refuse fusions that cannot mean anything with these models; say when a fusion is skipped."""
    if tuning is not None and (len(models) < 2 or fusion.method == "none"):
        raise FusebenchError("tune tunes a fusion's weights: select at least two models and a fusion method "
                             "(e.g. fusion=dbsf), or set tune=none.")
    if len(models) < 2:
        if fusion.method != "none":
            log.warning("fusion.method=%s is skipped: one model is selected (%s), and fusion needs two or more",
                        fusion.method, next(iter(models)))
        return
    if fusion.method != "none" and tuning is None and not any(spec.weight for spec in models.values()):
        raise FusebenchError(f"every model weight is 0 ({', '.join(f'models.{n}.weight' for n in models)}): "
                             "every fused score would be 0. Give at least one model a weight > 0.")


def check_gallery(gallery: GalleryConfig, dataset: DatasetConfig, models: dict[str, ModelSpec],
                  fusion: FusionConfig, tuning: TuneConfig | None) -> None:
    """Refuse galleries that cannot run with this dataset, these models or this fusion, before any work."""
    if not gallery.active:
        return
    if gallery.kind == "sim" and dataset.kind != "sim":
        raise FusebenchError(f"gallery=sim simulates distractors of a simulated corpus; dataset={dataset.name} is "
                             "real data: use gallery=folder | webdataset | paths | vectors.")
    if gallery.kind != "sim" and dataset.kind == "sim":
        raise FusebenchError(f"gallery={gallery.kind} holds real images, but dataset=sim is simulated: use "
                             "gallery=sim with it.")
    if gallery.kind == "vectors":
        missing = [name for name in models if name not in gallery.vectors]
        extra = [name for name in gallery.vectors if name not in models]
        if missing or extra:
            raise FusebenchError(f"gallery.vectors must name one dump per model of the run ({', '.join(models)}); "
                                 + "; ".join(([f"missing: {', '.join(missing)}"] if missing else [])
                                             + ([f"not a model: {', '.join(extra)}"] if extra else [])) + ".")
    if tuning is not None:
        raise FusebenchError("tune=weights with distractors is not supported: tune on the test split's own "
                             "gallery (gallery=none), then run the chosen weights with the distractors.")
    if fusion.method != "none" and len(models) > 1 and fusion.top_k is None:
        raise FusebenchError(f"fusion.top_k=null fuses whole rankings, {gallery.size:,} distractors long per query: "
                             "with a gallery set fusion.top_k (e.g. 100, the default).")


def check_search(search: SearchConfig, fusion: FusionConfig, models: dict[str, ModelSpec], evaluation: EvalConfig,
                 gallery: GalleryConfig, tuning: TuneConfig | None) -> None:
    """Refuse a search backend this run cannot use, before any work (``fusion`` after its preset label was checked).
    The index's sizes against the corpus (nlist, nprobe) are checked once the corpus is read
    (:func:`fusebench.config.search.check_sizes`)."""
    if not search.approximate:
        return
    what = f"search={search.backend}" + (f" (search.index={search.index})" if search.backend == "faiss" else "")
    unsupported = [(fusion.top_k is None and len(models) > 1 and fusion.method != "none",
                    "returns lists, not whole rankings: set fusion.top_k (e.g. 100, the default)"),
                   (gallery.active, "over a gallery with distractors is not supported yet: use gallery=none"),
                   (tuning is not None, "with tune=weights is not supported: tune with search=exact, then run the "
                                        "chosen weights with the index"),
                   (bool(evaluation.positives), "with eval.positives is not supported: use search=exact for the "
                                                "extra positives")]
    for bad, why in unsupported:
        if bad:
            raise FusebenchError(f"{what} {why}.")
    depth = max(evaluation.lists.depth, fusion.top_k or 0)
    if search.index == "hnsw" and search.ef_search < depth:
        raise FusebenchError(f"search.ef_search={search.ef_search} is below the list depth {depth} (fusion.top_k, "
                             f"eval.lists.depth): HNSW returns at most ef_search neighbours; valid search.ef_search "
                             f">= {depth}.")
    if not search.engine:
        return
    if len(models) < 2 or fusion.method == "none":
        raise FusebenchError(f"{what} runs the engine's hybrid search over two or more models: select two or more "
                             "models and one of the engine's presets (fusion=...).")
    presets = ENGINE_PRESETS[search.backend]
    if fusion.preset not in presets:
        why = ("this fusion is no preset: a plain method, or a preset whose settings were changed"
               if fusion.preset is None else f"fusion={fusion.preset} is another engine's")
        raise FusebenchError(f"{what} fuses by the engine's own rule, so the fusion must be one of its presets, "
                             f"unchanged ({why}); valid: {' | '.join(f'fusion={p}' for p in presets)}.")
    if fusion.fuse_on == "document" and search.backend != "qdrant":
        raise FusebenchError(f"fusion.fuse_on=document needs one entry per model's hit, which {what} does not hold "
                             "(one row per image with every model's vector): valid fusion.fuse_on=source_object.")
    if search.backend == "milvus":  # the settings, whatever the corpus: a real Milvus refuses them
        for key in ("top_k", "final_top_k"):
            value = getattr(fusion, key)
            if value is not None and value > MILVUS_MAX_TOPK:
                raise FusebenchError(f"fusion.{key}={value} is past Milvus' limit of {MILVUS_MAX_TOPK} results per "
                                     f"search (Milvus refuses such a request): valid fusion.{key} is "
                                     f"1..{MILVUS_MAX_TOPK}.")
        if search.batch_size > MILVUS_MAX_NQ:
            raise FusebenchError(f"search.batch_size={search.batch_size} is more queries per request than Milvus "
                                 f"takes: valid search.batch_size is 1..{MILVUS_MAX_NQ}.")
    weights = [spec.weight for spec in models.values()]
    if fusion.preset in ("milvus_weighted", "milvus_weighted_ip") and not all(0 <= w <= 1 for w in weights):
        raise FusebenchError(f"fusion={fusion.preset} runs Milvus' WeightedRanker, which takes weights in [0, 1]; the "
                             f"models' weights are {'/'.join(f'{w:g}' for w in weights)}: scale them into [0, 1] "
                             "(only their ratios matter).")
    if len(set(weights)) > 1 and fusion.preset in ("milvus_rrf", "lancedb_rrf"):
        raise FusebenchError(f"fusion={fusion.preset} takes no per-model weights (the engine's RRF ranker has none), "
                             f"but the models' weights differ ({'/'.join(f'{w:g}' for w in weights)}): valid: equal "
                             "weights" + (", or fusion=milvus_weighted" if search.backend == "milvus" else "") + ".")


def check_top_keys(cfg: Mapping, valid: list[str]) -> None:
    """A key added at the top (``+bogus=1``) is read by nothing: an error naming it."""
    unknown = sorted(str(k) for k in cfg if k not in valid and k != "hydra")
    if unknown:
        raise FusebenchError(f"unknown top-level key(s) {', '.join(unknown)} (nothing reads them); valid: "
                             f"{', '.join(valid)} (each a config group: fusebench --help lists them).")


def run_config(cfg) -> RunConfig:
    """The composed config ``cfg`` (a DictConfig or a mapping of its groups) as one checked :class:`RunConfig`."""
    from fusebench.config.reference import reference_row
    from fusebench.fusion.presets import config_folders, true_label

    keys = checks.config_keys(RunConfig)
    check_top_keys(cfg, keys)
    group = {key: _plain(checks.required(cfg, key, "config")) for key in keys}
    evaluation = eval_config(group["eval"], "eval")
    fusion = checks.typed(FusionConfig, group["fusion"], "fusion")
    fusion.check_ks(evaluation.ks)
    models = model_specs(group["models"], registry(config_folders()))
    plots = checks.boolean(group["plots"], "plots")
    logger = logger_config(group["logger"])
    reference = reference_row(None if not group["reference"] else
                              checks.typed(ReferenceConfig, group["reference"], "reference"))
    embed = embed_config(group["embed"], "embed")
    dataset = dataset_config(group["dataset"])
    tuning = tune_config(group["tune"], dataset)
    check_fusion_models(fusion, models, tuning)
    gallery = checks.typed(GalleryConfig, group["gallery"], "gallery", nested={"sim": _nested(SimDistractorConfig)})
    check_gallery(gallery, dataset, models, fusion, tuning)
    fusion = true_label(fusion, weights=[spec.weight for spec in models.values()])
    search = checks.typed(SearchConfig, group["search"], "search")
    check_search(search, fusion, models, evaluation, gallery, tuning)
    if tuning is not None:
        fusion.check_ks([tuning.k], "tune.criterion")
    resolved = {str(key): group[key] for key in cfg if key != "hydra"}  # the composed order
    return RunConfig(paths=checks.typed(PathsConfig, group["paths"], "paths"), dataset=dataset, gallery=gallery, search=search,
                     models=models,
                     fusion=fusion, eval=evaluation, embed=embed, logger=logger, tune=tuning, plots=plots,
                     reference=reference, resolved=resolved)
