"""The ``gallery`` config group: distractor images added to a dataset's gallery, keeping its test protocol.

The queries stay exactly the test split's (COCO 5k keeps its 25,010 captions and its guard); ``size`` distractor
images, taken in a seeded order from a source, are appended after the test images. They carry no captions, so
they ask no i2t query; t2i queries search them. The first ``size`` items of one ``(source, seed)`` are the same
for every size, so galleries nest (the first 10k distractors are in the first 100k) and runs at different sizes
compare query by query. Distractors that are near-duplicates of a test image (cosine above ``near_duplicate``
under any model of the run) are dropped and counted in the record.

Sources (``kind``): ``none`` (the test split alone, the default), ``sim`` (simulated per model, dataset=sim),
``folder`` (an image folder, recursively), ``webdataset`` (tar shards as img2dataset writes them), ``paths`` (a
.parquet, .jsonl or .txt list of image paths), ``vectors`` (per-model embedding dumps in clip-retrieval's layout:
``img_emb/img_emb_*.npy`` with row-aligned ``metadata/metadata_*.parquet``).
Light on purpose: no numpy, torch or PIL.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from fusebench import FusebenchError
from fusebench.runtime import checks

GALLERY_KINDS = ("none", "sim", "folder", "webdataset", "paths", "vectors")
FILE_KINDS = ("folder", "webdataset", "paths")  # image files a real model embeds (in shards, fusebench-embed)
# The settings each kind reads (one no chosen kind reads must keep its default: refused otherwise, checks.unread)
SLICE_KEYS = ("slices", "slice")  # the exact search cut into slices, one job each (docs/galleries.md)
GALLERY_READS = {"none": (), "sim": ("size", "seed", "near_duplicate", "sim", *SLICE_KEYS),
                 **{kind: ("size", "seed", "source", "near_duplicate", "shard_size", "shard", *SLICE_KEYS)
                    for kind in FILE_KINDS},
                 "vectors": ("size", "seed", "vectors", "near_duplicate", *SLICE_KEYS)}
# what a manifest run's gallery is with gallery=none (docs/galleries.md, "A manifest's caption-less lines")
MANIFEST_LINES = "the manifest's lines without captions (its gallery)"
NEAR_DUPLICATE = 0.94  # default image-image cosine threshold: clip-retrieval's dedup (docs/galleries.md)


@dataclass
class SimDistractorConfig:
    """How ``gallery=sim`` draws distractors (docs/galleries.md): each distractor's latent is a fresh draw, pulled
    towards a random test image's latent by ``closeness`` for a ``hard_fraction`` of them (web collections hold
    some photos of the same kinds of scene); the others keep only ``relevance`` of their embedding on what captions
    describe (most web images are about something else), the rest in directions no caption has. Every model sees
    each distractor through its own noise and projection. The defaults make the sim pair lose t2i R@1 with gallery
    size at a rate chosen to resemble real web distractors (docs/galleries.md has the calibration)."""

    hard_fraction: float = 0.01  # share of distractors that resemble some test image
    closeness: float = 0.8  # how far a hard distractor's latent is pulled towards its test image's (0..1)
    relevance: float = 0.8  # the others: share of their embedding on what captions describe (0..1]; 1 = in-domain

    def __post_init__(self):
        self.hard_fraction = checks.number(self.hard_fraction, "gallery.sim.hard_fraction", 0, 1)
        self.closeness = checks.number(self.closeness, "gallery.sim.closeness", 0, 1, open_high=True)
        self.relevance = checks.number(self.relevance, "gallery.sim.relevance", 0, 1, open_low=True)


@dataclass
class GalleryConfig:
    kind: str = "none"  # none | sim | folder | webdataset | paths | vectors
    size: int = 0  # distractors added: the first `size` of the source in seeded order; 0 = the test split alone
    seed: int = 0  # the source's order (a seeded permutation): one seed, nested galleries
    source: str | None = None  # folder | webdataset: a folder of .tar shards or a glob | paths: a .parquet/.jsonl/.txt
    vectors: dict[str, str] = field(default_factory=dict)  # kind vectors: model name -> clip-retrieval dump folder
    near_duplicate: float | None = NEAR_DUPLICATE  # drop distractors this close (cosine) to a test image; null = keep
    shard_size: int = 10000  # images per embedding shard (one cache entry, one fusebench-embed job)
    shard: int | None = None  # fusebench-embed: the one shard this job embeds; null = every shard `size` needs
    slices: int | None = None  # exact search in this many slices of whole tiles, merged; null = one process searches it
    slice: int | None = None  # the one slice this job searches and stores (0..slices-1); null = merge every slice
    sim: SimDistractorConfig = field(default_factory=SimDistractorConfig)
    # the run's dataset.kind, for the messages (an init-only value: no field, no config key)
    dataset_kind: InitVar[str] = ""

    def __post_init__(self, dataset_kind: str = ""):
        checks.choice(self.kind, "gallery.kind", GALLERY_KINDS)
        self.size = checks.integer(self.size, "gallery.size", 0, "distractor images to add; 0 = none")
        self.seed = checks.integer(self.seed, "gallery.seed", 0)
        self.source = checks.text(self.source, "gallery.source", allow_none=True)
        self.vectors = {str(k): checks.text(v, f"gallery.vectors.{k}") for k, v in
                        checks.mapping(self.vectors or {}, "gallery.vectors").items()}
        if self.near_duplicate is not None:
            self.near_duplicate = checks.number(self.near_duplicate, "gallery.near_duplicate", -1, 1,
                                                hint="a cosine; null keeps every distractor")
        self.shard_size = checks.integer(self.shard_size, "gallery.shard_size", 1)
        self.shard = checks.optional_integer(self.shard, "gallery.shard", 0, "null = every shard")
        self.slices = checks.optional_integer(self.slices, "gallery.slices", 1,
                                              "slices of the exact search, one job each; null = one process")
        self.slice = checks.optional_integer(self.slice, "gallery.slice", 0, "the slice this job searches; null = "
                                             "merge every slice")
        if self.slice is not None and self.slices is None:
            raise FusebenchError(f"gallery.slice={self.slice} needs gallery.slices=N (the number of slices the "
                                 "gallery's search is cut into, the same in every slice job and in the merge run).")
        if self.slice is not None and self.slice >= self.slices:
            raise FusebenchError(f"gallery.slice={self.slice} but gallery.slices={self.slices}: valid gallery.slice "
                                 f"is 0..{self.slices - 1} (or null for the run that merges them).")
        if isinstance(self.sim, dict):
            self.sim = checks.typed(SimDistractorConfig, self.sim, "gallery.sim", every_key=False)
        manifest = self.kind == "none" and dataset_kind == "manifest"
        if manifest and self.size:
            raise FusebenchError(f"gallery.size={self.size} is not read with dataset=manifest and gallery=none: the "
                                 f"run's distractors are {MANIFEST_LINES}, every one of them (their number is set by "
                                 "the manifest, not by gallery.size), and gallery=none adds none of its own; leave "
                                 "gallery.size unset (0), or add distractors from another source with gallery=folder "
                                 "| webdataset | paths | vectors and gallery.size=N.")
        if self.kind == "none" and self.size:
            raise FusebenchError(f"gallery.size={self.size} needs a source: pick one with gallery=sim | folder | "
                                 "webdataset | paths | vectors (gallery=none is the test split alone).")
        checks.unread(self, "gallery", "kind", GALLERY_READS, {
            "none": f" and dataset=manifest (the run's distractors are {MANIFEST_LINES}, every one kept: no "
                    "near-duplicate is dropped, none is sampled, and gallery=none adds none of its own)"
                    if manifest else " (the test split alone)", "sim": " (it simulates its distractors)",
            "vectors": " (it reads the dumps of gallery.vectors)"}.get(self.kind, ""))
        if self.kind in FILE_KINDS and not self.source:
            raise FusebenchError(f"gallery={self.kind} needs gallery.source=... (the {self.kind} to read).")
        if self.kind == "vectors" and not self.vectors:
            raise FusebenchError("gallery=vectors needs gallery.vectors.MODEL=/path/to/dump for every model "
                                 "(a clip-retrieval dump folder: img_emb/*.npy and metadata/*.parquet).")

    @property
    def active(self) -> bool:
        """True when the run adds distractors."""
        return self.kind != "none" and self.size > 0

    def n_shards(self) -> int:
        """Embedding shards the first ``size`` distractors span."""
        return -(-self.size // self.shard_size)
