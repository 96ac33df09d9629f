"""The config groups as types: every key a user can set, its type, its default and its checks, in one place.

Each class is one group (``EvalConfig`` is ``eval``; a dataset kind's keys are its module's class in
:mod:`fusebench.data.kinds`, listed by :data:`DATASET_KINDS`; the fusion group
is :class:`fusebench.fusion.config.FusionConfig`; model specs, free-form per kind, are
:mod:`fusebench.config.specs`). Its ``__post_init__`` checks every value, through the typed reads of
:mod:`fusebench.runtime.checks`, and the conversion of a whole composed config into these types happens once,
in :func:`fusebench.app.run_config.run_config`; past the CLI, code reads these objects, never the config's dicts.

Registered with Hydra's ConfigStore as ``schema_GROUP`` (``schema_fusion`` is ``FusionConfig``), and each YAML
option of those groups starts from it (``defaults: [/schema_fusion@_here_, _self_]``), so the YAML files only say
what differs and Hydra checks every value's type while composing (``eval.bootstrap.draws=abc`` is an error naming
the key before any work). Code has no fallbacks of its own: a key missing from a composed group is an error.
Importing this module imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fusebench import FusebenchError
from fusebench.fusion.config import FusionConfig
from fusebench.runtime import checks
from fusebench.runtime.plugins import Registry

POSITIVE_SETS = ("eccv", "cxc")  # extra positives (COCO 5k): fusebench.evaluation.positives
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SEARCH_PRECISIONS = ("auto", "fp32", "bf16", "tf32")  # a gallery's distractor tiles (fusebench.search.margin)
TUNE_DIRECTIONS = ("t2i", "i2t", "mean")  # a tuning criterion's direction: one of the two or their mean


MAX_DRAWS = 100_000  # bootstrap resamples: past this only time grows (2,000 put a 95% interval's end within ~0.1 point)


def check_draws(value, key: str) -> int:
    """Bootstrap draws: an integer in 1..MAX_DRAWS (1e9 ran for minutes on 200 images: bounded, never a hang)."""
    draws = checks.integer(value, key, 1, "resamples per comparison, e.g. 2000")
    if draws > MAX_DRAWS:
        raise FusebenchError(f"{key}={draws} is not valid; valid: 1..{MAX_DRAWS:,} resamples per comparison (2000 is "
                             "the default; more only costs time)")
    return draws


@dataclass
class BootstrapConfig:
    draws: int = 2000  # paired bootstrap resamples per comparison
    seed: int = 0
    level: float = 0.95  # central percentile interval

    def __post_init__(self):
        self.draws = check_draws(self.draws, "eval.bootstrap.draws")
        self.level = checks.number(self.level, "eval.bootstrap.level", 0, 1, open_low=True, open_high=True,
                                   hint="the interval's coverage, e.g. 0.95")
        self.seed = checks.integer(self.seed, "eval.bootstrap.seed", 0)


@dataclass
class ListsConfig:
    store: bool = True  # keep each model's ranked lists in the list store (embed.cache.dir/lists), reuse them
    depth: int = 100  # list length stored per query and model; a job asking for more stores deeper lists
    max_scores_mb: int = 2048  # fusion.top_k=null: store whole score matrices up to this size (MB), 0 = never

    def __post_init__(self):
        self.depth = checks.integer(self.depth, "eval.lists.depth", 1, "list length stored per query")
        self.max_scores_mb = checks.integer(self.max_scores_mb, "eval.lists.max_scores_mb", 0,
                                            "0: never store score matrices")
        self.store = checks.boolean(self.store, "eval.lists.store")


@dataclass
class EvalConfig:
    ks: list[int] = field(default_factory=lambda: [1, 5, 10])  # recall@k, both directions
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    device: str = "auto"  # auto | cpu | cuda | cuda:1 | mps
    chunk_size: int = 4096  # query rows per similarity block
    item_chunk_size: int = 16384  # item columns per similarity block (memory: chunk_size x item_chunk_size)
    save_topk: int | None = 25  # positions saved per list in topk/*.npz; null = whole list
    lists: ListsConfig = field(default_factory=ListsConfig)
    positives: list[str] = field(default_factory=list)  # extra positives (COCO 5k): eccv, cxc (fusebench.evaluation.positives)
    search_precision: str = "auto"  # distractor tiles: auto (bf16 on cuda, fp32 elsewhere) | fp32 | bf16 | tf32 (exact either way)

    def __post_init__(self):
        self.ks = sorted(set(checks.integer_list(self.ks, "eval.ks")))
        self.save_topk = checks.optional_integer(self.save_topk, "eval.save_topk", 1, "null = whole lists")
        self.chunk_size = checks.integer(self.chunk_size, "eval.chunk_size", 1)
        self.item_chunk_size = checks.integer(self.item_chunk_size, "eval.item_chunk_size", 1)
        self.device = checks.device_name(self.device, "eval.device")
        checks.choice(self.search_precision, "eval.search_precision", SEARCH_PRECISIONS)
        positives = self.positives or []
        if not isinstance(positives, list):
            raise FusebenchError(f"eval.positives={positives!r} is not valid: give a list, e.g. eval.positives=[eccv,cxc] "
                                 f"(valid sets: {', '.join(POSITIVE_SETS)}).")
        self.positives = list(dict.fromkeys(checks.choice(name, "eval.positives", POSITIVE_SETS) for name in positives))


@dataclass
class CacheConfig:
    dir: str = "${paths.output_dir}/cache"
    dtype: str = "fp16"  # storage: fp16 | fp32
    chunk_rows: int = 1024  # rows per resumable chunk

    def __post_init__(self):
        self.dir = checks.text(self.dir, "embed.cache.dir", hint="a folder")
        checks.choice(self.dtype, "embed.cache.dtype", ("fp16", "fp32"))
        self.chunk_rows = checks.integer(self.chunk_rows, "embed.cache.chunk_rows", 1)


@dataclass
class EmbedConfig:
    """How real models (the kinds with an encoder backend) run and where embeddings are cached (the encoders' ``runtime``)."""

    device: str = "auto"  # auto (cuda, mps, cpu) | cpu | cuda | cuda:1 | mps
    precision: str = "auto"  # auto: bf16 autocast on cuda, fp32 elsewhere | fp32 | bf16 | fp16
    batch_size: int = 32  # images per forward pass
    text_batch_size: int = 256  # captions per forward pass
    num_workers: int = 4  # DataLoader processes decoding and preprocessing images
    on_bad_image: str = "fail"  # fail: stop, naming the file | skip: leave the image and its captions out
    cache: CacheConfig = field(default_factory=CacheConfig)

    def __post_init__(self):
        self.device = checks.device_name(self.device, "embed.device")  # spelling now, even if no real model runs
        checks.choice(self.precision, "embed.precision", PRECISIONS)
        self.batch_size = checks.integer(self.batch_size, "embed.batch_size", 1)
        self.text_batch_size = checks.integer(self.text_batch_size, "embed.text_batch_size", 1)
        self.num_workers = checks.integer(self.num_workers, "embed.num_workers", 0)
        checks.choice(self.on_bad_image, "embed.on_bad_image", ("fail", "skip"))

    @classmethod
    def with_defaults(cls, cache_dir: str, **changes) -> EmbedConfig:
        """For code outside Hydra (tests, benchmarks): the group's defaults, a cache folder, and ``changes`` by
        key (``batch_size=4``; the cache's keys as ``cache_dtype="fp32"``, ``chunk_rows=8``)."""
        cache = {"dir": cache_dir, **{key.removeprefix("cache_"): changes.pop(key)
                                      for key in ("cache_dtype", "chunk_rows") if key in changes}}
        return cls(**{**asdict(cls()), **changes, "cache": CacheConfig(**{**asdict(CacheConfig()), **cache})})

    def resolved_precision(self, device) -> str:
        """The precision on ``device`` (a torch.device): ``auto`` is bf16 on cuda, fp32 elsewhere."""
        if self.precision != "auto":
            return self.precision
        return "bf16" if device.type == "cuda" else "fp32"


# The dataset kinds (dataset.kind): one module each in fusebench.data.kinds, each with its keys' dataclass
# (stored below as schema_dataset_NAME); read here by that package's dotted name (the scan), not by an import up
DATASET_KINDS: Registry = Registry("fusebench.data.kinds", "dataset kind", "dataset.kind")
DatasetConfig = Any  # a dataset kind's params dataclass (fusebench.data.kinds.NAME)


def criterion_parts(criterion: str) -> tuple[str, int] | None:
    """('t2i', 1) for 't2i R@1'; None when it is not a direction and a recall@k."""
    parts = criterion.replace("R@", " ").split()
    if len(parts) != 2 or parts[0] not in TUNE_DIRECTIONS or not parts[1].isdigit() or int(parts[1]) < 1:
        return None
    return parts[0], int(parts[1])


@dataclass
class TuneConfig:
    enabled: bool = False  # tune=weights turns it on (fusebench.evaluation.tuning)
    split: str = "auto"  # auto: val for Karpathy datasets, seeded otherwise | a Karpathy split | seeded
    fraction: float = 0.2  # seeded: share of the images with captions held out for tuning
    seed: int = 0  # seeded: which images
    criterion: str = "t2i R@1"  # what the chosen setting maximises on the tuning split: t2i | i2t | mean, R@k
    weights: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0])  # models 2..M
    rrf_k: list[float] = field(default_factory=list)  # [] = fusion.params.rrf_k
    ddof: list[int] = field(default_factory=list)  # [] = fusion.params.ddof
    max_points: int = 500  # refuse a larger grid

    def __post_init__(self):
        self.enabled = checks.boolean(self.enabled, "tune.enabled")
        if not self.enabled:  # tune=none reads nothing else
            return
        self.split = checks.text(self.split, "tune.split", hint="auto, val (Karpathy) or seeded")
        parts = criterion_parts(checks.text(self.criterion, "tune.criterion", hint="e.g. 't2i R@1'"))
        if parts is None:
            raise FusebenchError(f"tune.criterion={self.criterion!r} is not valid: give a direction "
                                 f"({', '.join(TUNE_DIRECTIONS)}) and a recall, e.g. 't2i R@1' or 'mean R@5'.")
        self.criterion = f"{parts[0]} R@{parts[1]}"
        self.weights = self._values("weights", checks.weight)
        if not self.weights:
            raise FusebenchError("tune.weights=[] is not valid: give the weights to try for models 2..M, "
                                 "e.g. tune.weights=[0.5,1,2] (the first model stays at 1).")
        self.fraction = checks.number(self.fraction, "tune.fraction", 0, 1, open_low=True, open_high=True,
                                      hint="e.g. 0.2")
        self.seed = checks.integer(self.seed, "tune.seed", 0)
        self.rrf_k = self._values("rrf_k", lambda v, key: checks.number(v, key, 0, hint="rrf_k >= 0"))
        self.ddof = self._values("ddof", lambda v, key: checks.choice(v, key, (0, 1)))
        self.max_points = checks.integer(self.max_points, "tune.max_points", 1)

    def _values(self, key: str, read) -> list:
        raw = getattr(self, key)
        if not isinstance(raw, (list, tuple)):
            raise FusebenchError(f"tune.{key}={raw!r} is not valid: give a list (an empty list keeps the fusion's own).")
        return [read(v, f"tune.{key}") for v in raw]

    @property
    def direction(self) -> str:
        return criterion_parts(self.criterion)[0]

    @property
    def k(self) -> int:
        return criterion_parts(self.criterion)[1]


@dataclass
class NoLoggerConfig:
    kind: str = "none"  # logger=none: the run dir is the record


@dataclass
class WandbConfig:
    kind: str = "wandb"
    project: str = "fusebench"
    entity: str | None = None
    mode: str | None = None  # null: $WANDB_MODE, else offline | offline | online | disabled
    tags: list[str] = field(default_factory=list)
    init_timeout: float = 15.0  # seconds an online start may take before logging offline instead

    def __post_init__(self):
        checks.choice(self.mode, "logger.mode", ("offline", "online", "disabled"), allow_none=True)
        self.project = checks.text(self.project, "logger.project")
        self.entity = checks.text(self.entity, "logger.entity", allow_none=True)
        self.tags = checks.string_list(self.tags, "logger.tags")
        self.init_timeout = checks.number(self.init_timeout, "logger.init_timeout", 0, open_low=True,
                                          hint="seconds to wait for W&B to start")


LoggerConfig = NoLoggerConfig | WandbConfig
LOGGERS: dict[str, type] = {"none": NoLoggerConfig, "wandb": WandbConfig}  # logger.kind -> its keys


@dataclass
class PathsConfig:
    output_dir: str  # runs and the embedding cache go under it (FUSEBENCH_OUTPUT)
    data_root: str  # datasets are read from under it (FUSEBENCH_DATA)


@dataclass
class ReferenceConfig:
    dataset: str  # the article's dataset (coco5k, flickr1k)
    study: str  # its row (a conf/study/ job)

    def __post_init__(self):
        self.dataset = checks.text(self.dataset, "reference.dataset")
        self.study = checks.text(self.study, "reference.study")


def register() -> None:
    """Store every schema as a root config ``schema_GROUP`` (``schema_dataset_KIND`` for each dataset kind), which
    the YAML options start from (``defaults: [/schema_fusion@_here_, _self_]``). At the root, not inside the
    groups: a schema is not an option a user picks, so ``fusion=schema`` is unknown, ``--help`` does not list
    it and ``fusion=glob(*)`` does not match it."""
    from hydra.core.config_store import ConfigStore

    from fusebench.config.gallery import GalleryConfig  # lazy: cycle (config.gallery imports this one)
    from fusebench.config.search import SearchConfig  # lazy: cycle (config.search imports this one)

    store = ConfigStore.instance()
    for name, node in (("schema_fusion", FusionConfig), ("schema_eval", EvalConfig), ("schema_embed", EmbedConfig),
                       ("schema_logger", WandbConfig),
                       ("schema_tune", TuneConfig), ("schema_gallery", GalleryConfig),
                       ("schema_search", SearchConfig)):
        store.store(name=name, node=node)
    for kind in DATASET_KINDS.items():
        store.store(name=f"schema_dataset_{kind.name}", node=kind.params)
