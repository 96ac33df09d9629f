"""The config groups' schemas: every key a user can set, its type and its default, in one place.

Registered with Hydra's ConfigStore as ``schema_GROUP`` (``schema_fusion`` is :class:`FusionConfig`), and
each YAML option of those groups starts from it (``defaults: [/schema_fusion@_here_, _self_]``), so the YAML files only
say what differs and Hydra checks every value's type while composing (``eval.bootstrap.draws=abc`` is an
error naming the key before any work). Code reads composed configs and has no fallbacks of its own; a
missing key is an error, not a silent default. Model specs (``conf/models/*.yaml``) are free-form per
model kind and checked by their encoders.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BootstrapSchema:
    draws: int = 2000  # paired bootstrap resamples per comparison
    seed: int = 0
    level: float = 0.95  # central percentile interval


@dataclass
class ListsSchema:
    store: bool = True  # keep each model's ranked lists in the list store (embed.cache.dir/lists), reuse them
    depth: int = 100  # list length stored per query and model; a job asking for more stores deeper lists
    max_scores_mb: int = 2048  # fusion.top_k=null: store whole score matrices up to this size (MB), 0 = never


@dataclass
class EvalSchema:
    ks: list[int] = field(default_factory=lambda: [1, 5, 10])  # recall@k, both directions
    bootstrap: BootstrapSchema = field(default_factory=BootstrapSchema)
    device: str = "auto"  # auto | cpu | cuda | cuda:1 | mps
    chunk_size: int = 4096  # query rows per similarity block
    item_chunk_size: int = 16384  # item columns per similarity block (memory: chunk_size x item_chunk_size)
    save_topk: int | None = 25  # positions saved per list in topk/*.npz; null = whole list
    lists: ListsSchema = field(default_factory=ListsSchema)
    positives: list[str] = field(default_factory=list)  # extra positives (COCO 5k): eccv, cxc (fusebench.evaluation.positives)


@dataclass
class CacheSchema:
    dir: str = "${paths.output_dir}/cache"
    dtype: str = "fp16"  # storage: fp16 | fp32
    chunk_rows: int = 1024  # rows per resumable chunk


@dataclass
class EmbedSchema:
    device: str = "auto"  # auto (cuda, mps, cpu) | cpu | cuda | cuda:1 | mps
    precision: str = "auto"  # auto: bf16 autocast on cuda, fp32 elsewhere | fp32 | bf16 | fp16
    batch_size: int = 32  # images per forward pass
    text_batch_size: int = 256  # captions per forward pass
    num_workers: int = 4  # DataLoader processes decoding and preprocessing images
    on_bad_image: str = "fail"  # fail: stop, naming the file | skip: leave the image and its captions out
    cache: CacheSchema = field(default_factory=CacheSchema)


@dataclass
class SimDatasetSchema:
    name: str = "sim"
    kind: str = "sim"
    n_images: int = 5000
    n_captions: int = 25010
    latent_dim: int = 64
    caption_noise: float = 1.3  # what each caption adds or misses on its own
    shared_caption_noise: float = 1.36  # what all captions of an image miss alike
    seed: int = 0


@dataclass
class TuneSchema:
    enabled: bool = False  # tune=weights turns it on (fusebench.evaluation.tuning)
    split: str = "auto"  # auto: val for Karpathy datasets, seeded otherwise | a Karpathy split | seeded
    fraction: float = 0.2  # seeded: share of the images with captions held out for tuning
    seed: int = 0  # seeded: which images
    criterion: str = "t2i R@1"  # what the chosen setting maximises on the tuning split: t2i | i2t | mean, R@k
    weights: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0])  # models 2..M
    rrf_k: list[float] = field(default_factory=list)  # [] = fusion.rrf_k
    ddof: list[int] = field(default_factory=list)  # [] = fusion.ddof
    max_points: int = 500  # refuse a larger grid


@dataclass
class WandbSchema:
    kind: str = "wandb"
    project: str = "fusebench"
    entity: str | None = None
    mode: str | None = None  # null: $WANDB_MODE, else offline | offline | online | disabled
    tags: list[str] = field(default_factory=list)
    init_timeout: float = 15.0  # seconds an online start may take before logging offline instead


def register() -> None:
    """Store every schema as a root config ``schema_GROUP`` (``schema_dataset_sim`` for the sim dataset), which
    the YAML options start from (``defaults: [/schema_fusion@_here_, _self_]``). At the root, not inside the
    groups: a schema is not an option a user picks, so ``fusion=schema`` is unknown, ``--help`` does not list
    it and ``fusion=glob(*)`` does not match it."""
    from hydra.core.config_store import ConfigStore

    from fusebench.fusion.combine import FusionConfig

    store = ConfigStore.instance()
    for name, node in (("schema_fusion", FusionConfig), ("schema_eval", EvalSchema), ("schema_embed", EmbedSchema),
                       ("schema_dataset_sim", SimDatasetSchema), ("schema_logger", WandbSchema),
                       ("schema_tune", TuneSchema)):
        store.store(name=name, node=node)
