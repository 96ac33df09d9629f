"""The typed form of a whole composed config, :class:`RunConfig`, and each group's converter: what
:func:`fusebench.app.run_config.run_config` assembles (it checks the search backend too, so it lives above the
backends).

It resolves every group, turns each into its dataclass (:mod:`fusebench.config.schema`, the model
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
from fusebench.config.gallery import GalleryConfig
from fusebench.config.schema import (
    DATASET_KINDS,
    LOGGERS,
    BootstrapConfig,
    CacheConfig,
    DatasetConfig,
    EmbedConfig,
    EvalConfig,
    ListsConfig,
    LoggerConfig,
    PathsConfig,
    TuneConfig,
)
from fusebench.config.search import SearchConfig
from fusebench.config.specs import DEFAULT_WEIGHT, ModelSpec
from fusebench.fusion.config import FusionConfig
from fusebench.runtime import checks

log = logging.getLogger(__name__)


VIEWS = ("background", "wait", "inline")  # where a run's plots and logger are made (fusebench.app.views)
VIEWS_ENV = "FUSEBENCH_VIEWS"  # the variable conf/config.yaml takes the default of ``views`` from


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
    views: str  # where the plots and the logger are made: background | wait | inline (fusebench.app.views)
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
    kind = DATASET_KINDS.get(checks.required(given, "kind", "dataset"))
    return checks.typed(kind.params, given, "dataset")


def logger_config(value) -> LoggerConfig:
    """The ``logger`` group: ``kind: none`` reads nothing else (``+logger.project=x`` with it is an error)."""
    given = checks.mapping(value, "logger")
    kind = checks.choice(checks.required(given, "kind", "logger"), "logger.kind", tuple(LOGGERS))
    return checks.typed(LOGGERS[kind], given, "logger (logger=none)" if kind == "none" else "logger")


def tune_config(value, dataset: DatasetConfig) -> TuneConfig | None:
    """The ``tune`` group, None when off; ``split: auto`` is val for a kind with named splits (Karpathy's: its
    ``split_params``), seeded otherwise, and the test split itself is refused."""
    if not value:
        return None
    tune = checks.typed(TuneConfig, value, "tune")
    if not tune.enabled:
        return None
    named = DATASET_KINDS.get(dataset.kind).split_params is not None
    split = ("val" if named else "seeded") if tune.split == "auto" else tune.split
    if named and split == "seeded":
        raise FusebenchError(f"tune.split=seeded holds out part of the test corpus; a {dataset.kind} dataset has its "
                             "own tuning split: use tune.split=val.")
    if not named and split != "seeded":
        raise FusebenchError(f"tune.split={split!r}: a {dataset.kind} corpus has no named splits; use "
                             "tune.split=seeded (a seeded share of its images, tune.fraction).")
    if named and split == dataset.split:
        raise FusebenchError(f"tune.split={split!r} is the split the run reports on (dataset.split={dataset.split}): "
                             "tuning on the test split inflates the gain. Tune on val (tune.split=val).")
    return replace(tune, split=split)


def check_fusion_models(fusion: FusionConfig, models: dict[str, ModelSpec], tuning: TuneConfig | None) -> None:
    """Refuse fusions that cannot mean anything with these models; say when a fusion is skipped."""
    if tuning is not None and (len(models) < 2 or fusion.method == "none"):
        raise FusebenchError("tune tunes a fusion's weights: select at least two models and a fusion method "
                             "(e.g. fusion=dbsf), or set tune=none.")
    fusing = fusion.method != "none" and len(models) > 1
    unread = [(name, spec.weight) for name, spec in models.items() if spec.weight != DEFAULT_WEIGHT]
    if not fusing and unread:
        name, weight = unread[0]
        why, fix = (("fusion.method=none", "pick a fusion method (e.g. fusion=dbsf)") if fusion.method == "none" else
                    (f"one model selected ({name})", "select two or more models"))
        raise FusebenchError(f"models.{name}.weight={weight:g} is never read: no fusion runs ({why}), so each model "
                             f"is evaluated alone, and a weight is read only by a fusion of two or more models; "
                             f"leave it at {DEFAULT_WEIGHT:g} (the default), or {fix}.")
    if len(models) < 2:
        if fusion.method != "none":
            log.warning("fusion.method=%s is skipped: one model is selected (%s), and fusion needs two or more",
                        fusion.method, next(iter(models)))
        return
    if fusion.method != "none" and tuning is None:
        checks.some_weight({f"models.{n}.weight": spec.weight for n, spec in models.items()})


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


def check_top_keys(cfg: Mapping, valid: list[str]) -> None:
    """A key added at the top (``+bogus=1``) is read by nothing: an error naming it."""
    unknown = sorted(str(k) for k in cfg if k not in valid and k != "hydra")
    if unknown:
        raise FusebenchError(f"unknown top-level key(s) {', '.join(unknown)} (nothing reads them); valid: "
                             f"{', '.join(valid)} (each a config group: fusebench --help lists them).")
