"""A real model's gallery distractors embedded in shards, and read back as one gallery without loading it whole.

The distractors (``fusebench.data.distractor_sources.distractor_items``: the source's images in seeded order) are
cut into shards of ``gallery.shard_size``: shard ``i`` holds items ``i*s`` to ``min((i+1)*s, size) - 1``. Each shard
is one entry of the embedding cache (``EmbeddingCache.get_or_compute``: atomic, checksummed, resumable by chunks,
computed once under its lock), keyed by the model's weights fingerprint, library versions, precision, image
preprocessing and the shard's exact items (their ids and refs, digested); a shard of another model, preprocessing
or item list has another key, so it is never read for this one. Nested galleries share their shards when ``size``
is a multiple of ``shard_size`` (the last shard of a gallery is shorter otherwise, and keyed as such).

``embed_shard`` is one shard (one ``fusebench-embed`` job); ``shard_rows`` is a model's whole distractor gallery as
:class:`ShardRows` (computing here, with a progress bar, any shard not in the cache yet), read range by range from
the memory-mapped shard files. Images that fail to decode follow ``embed.on_bad_image``: ``fail`` stops naming the
file; ``skip`` records each by file in its shard's stats (``failed_images``) and leaves an all-NaN row, which
:func:`without_failed` drops from every model's gallery (counted). A shard with such rows is settled on every read
as a fresh computation would be: under ``fail`` a file still unreadable is the error, and a file that reads now
has its shard recomputed. Shards embedded with another precision (``embed.precision=auto``: bf16 on a GPU node,
fp32 on a CPU) are named in an error rather than embedded again. The gallery must be read with the
``gallery.shard_size`` it was embedded with (a shard's key holds its items).

The cache keys items by id, ref (path) and each file's size and mtime (a tar member by its tar's): a file or tar
replaced under the same name with another size or mtime gives its shard another key, so it is embedded again, never
read stale. That costs one stat per image file when a shard's key is made (a tar: one per tar). A file replaced
with the same size and mtime keeps the key; what catches it is the content record: each image's SHA-256, taken of
the bytes decoded when it is embedded, is stored with the shard (the entry's ``contents.json``, rows in order), and
``fusebench-cache verify`` (:func:`changed_images`) reads every image again and names the shards whose images
changed (``--remove`` removes them, so the next run embeds them again). A run does not read images to check them.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig
from fusebench.data.distractor_items import DistractorItems
from fusebench.data.distractor_sources import listing_digest
from fusebench.encoders.distractors import KeptRows, normalised
from fusebench.encoders.fingerprint import refs_fingerprint
from fusebench.encoders.images import BadImageError, open_rgb
from fusebench.encoders.real import RealRun, embed_images
from fusebench.runtime.progress import bar as progress_bar
from fusebench.stores.embeddings import CONTENTS, CompleteEntry
from fusebench.stores.entries import discard_entry, entry_lock, entry_meta

log = logging.getLogger(__name__)
SHARD_KIND = "shard"  # the ``kind`` of a shard entry (what fusebench-cache lists)
# test-only fault injection, for a process killed mid-shard: "SHARD:ROWS" makes the process SIGKILL itself in
# shard SHARD once it has embedded ROWS rows of it (after the cache saved the chunks they complete)
FAULT_ENV = "FUSEBENCH_FAULT_KILL_SHARD"


@dataclass(frozen=True)
class ShardPlan:
    """How a gallery's distractors (``items``, in seeded order) are cut into shards of ``shard_size``."""

    items: DistractorItems
    shard_size: int

    @property
    def n_shards(self) -> int:
        return -(-len(self.items) // self.shard_size)

    def bounds(self, index: int) -> tuple[int, int]:
        """Shard ``index``'s items: positions ``start:stop`` of the distractor order."""
        start = index * self.shard_size
        return start, min(start + self.shard_size, len(self.items))

    def part(self, index: int) -> DistractorItems:
        start, stop = self.bounds(index)
        return DistractorItems(self.items.ids[start:stop], self.items.refs[start:stop], self.items.source)


def check_shard(gallery: GalleryConfig) -> None:
    """``gallery.shard`` must name one of the gallery's shards: an error naming both numbers otherwise."""
    n = gallery.n_shards()
    if gallery.shard is not None and gallery.shard >= n:
        valid = f"0 to {n - 1}" if n else "none: gallery.size is 0"
        raise FusebenchError(f"gallery.shard={gallery.shard} but gallery.size={gallery.size:,} in shards of "
                             f"gallery.shard_size={gallery.shard_size:,} makes {n:,} shard(s) (valid: {valid}); "
                             "give a shard index below that, or gallery.shard=null for every shard.")


def shard_material(run: RealRun, part: DistractorItems) -> dict:
    """The key material of a shard's rows: the model's (weights, versions, precision, image preprocessing) and
    exactly which images, in order (their ids and refs, and each file's or tar's size and mtime)."""
    return {"kind": SHARD_KIND, **run.image_material(),
            "items": {"n": len(part), "ids_refs": listing_digest(part.ids, part.refs),
                      "files": refs_fingerprint(part.refs)}}


@dataclass
class ShardResult:
    """One model's shard as a job left it (what shard.json records)."""

    shard: int
    model: str
    key: str
    images: int  # rows of the shard
    failed_images: list[dict] = field(default_factory=list)  # {"row", "id", "ref"}: skipped, left out
    seconds: float = 0.0  # embedding time the shard took (summed over the processes that computed its chunks)
    device: str = ""
    images_per_s: float | None = None
    hit: bool = True  # found complete in the cache: this job computed nothing
    computed: int = 0  # rows this job embedded (0 on a hit; fewer than images when it resumed chunks)

    def to_json(self) -> dict:
        return asdict(self)


def _result(run: RealRun, index: int, entry: CompleteEntry, hit: bool, computed: int) -> ShardResult:
    stats = entry.meta.get("stats", {})
    seconds = float(stats.get("embed_seconds", 0.0))
    rows = int(entry.meta["shape"][0])
    return ShardResult(shard=index, model=run.name, key=entry.key, images=rows,
                       failed_images=list(stats.get("failed_images", [])), seconds=round(seconds, 3),
                       device=entry.meta.get("info", {}).get("device", str(run.device)),
                       images_per_s=round(rows / seconds, 2) if seconds > 0 else None, hit=hit, computed=computed)


def _kill_point(index: int) -> int | None:
    """Rows after which the test-only fault hook (``FAULT_ENV``) kills this process in shard ``index``."""
    value = os.environ.get(FAULT_ENV, "")
    shard, _, rows = value.partition(":")
    return int(rows) if value and int(shard) == index else None


def _pieces(rows: np.ndarray, block: np.ndarray, chunk_rows: int):
    """``(rows, block)`` cut where a cache chunk starts, so that each piece's stats belong to one chunk."""
    cuts = [i for i in range(1, len(rows)) if rows[i] % chunk_rows == 0]
    for lo, hi in zip([0, *cuts], [*cuts, len(rows)]):
        yield rows[lo:hi], block[lo:hi]


def _compute(run: RealRun, part: DistractorItems, index: int, counter: list[int], desc: str):
    """The cache's compute function for a shard: the shared image loop over the shard's refs, each piece with
    its stats (failed images by file, embedding seconds)."""
    kill_after = _kill_point(index)

    def compute(rows: np.ndarray):
        run.lazy.get()  # loading the model is not embedding time
        done, started, digests = 0, time.perf_counter(), []
        for block, _ in embed_images(run, part.refs, rows, desc, digests):
            block_rows = rows[done:done + len(block)]
            digest_of = dict(zip(block_rows.tolist(), digests[done:done + len(block)]))
            seconds = time.perf_counter() - started
            done += len(block)
            counter[0] += len(block)
            for piece_rows, piece in _pieces(block_rows, block, run.cache.chunk_rows):
                bad = piece_rows[np.isnan(piece).all(axis=1)]
                failed = [{"row": int(r), "id": part.ids[r], "ref": part.refs[r]} for r in bad]
                yield piece, {"skipped_images": len(failed), "failed_images": failed,
                              "embed_seconds": seconds * len(piece) / len(block),
                              CONTENTS: [[str(part.refs[r]), digest_of[int(r)]] for r in piece_rows]}
            if kill_after is not None and counter[0] >= kill_after:  # the cache has saved the chunks before
                os.kill(os.getpid(), signal.SIGKILL)
            started = time.perf_counter()

    return compute


def _unsettled(run: RealRun, index: int, start: int, entry: CompleteEntry) -> bool:
    """Whether a complete shard's failed images (skipped under ``skip``) must be embedded now: under ``fail`` a
    file still unreadable raises (as a fresh computation would), and one that reads now makes the shard stale."""
    for failed in entry.meta.get("stats", {}).get("failed_images", []):
        try:
            open_rgb(failed["ref"])
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad image, as in image_batches
            if run.runtime.on_bad_image == "fail":
                raise BadImageError(f"gallery shard {index}: distractor {start + failed['row']} ({failed['ref']}) "
                                    f"cannot be read: {err}. Fix or remove the file, or set embed.on_bad_image=skip "
                                    "to leave it out of the gallery.") from None
        else:
            return True
    return False


def _settled(run: RealRun, index: int, start: int, entry: CompleteEntry | None, material: dict,
             n: int) -> CompleteEntry | None:
    """``entry``, or None when an image it failed reads now (the entry is removed, to be computed again)."""
    if entry is None or not _unsettled(run, index, start, entry):
        return entry
    folder = entry.path.parent
    with entry_lock(folder, "cache"):
        if entry_meta(folder, entry.key, run.cache.keyed(material, n)[0])[0] is not None:
            discard_entry(folder, "cache", f"gallery shard {index}: an image it skipped as unreadable reads now")
    return None


def embed_shard(run: RealRun, plan: ShardPlan, index: int) -> tuple[ShardResult, CompleteEntry]:
    """Shard ``index`` of ``plan`` for ``run``'s model: from the cache when complete (nothing loaded), else
    embedded here (resuming the chunks a killed job left; a job embedding it elsewhere is waited for)."""
    part, (start, _) = plan.part(index), plan.bounds(index)
    material, n = shard_material(run, part), len(part)
    entry = _settled(run, index, start, run.cache.complete_entry(material, n), material, n)
    if entry is not None:
        return _result(run, index, entry, hit=True, computed=0), entry
    _check_precision(run, plan, [index])
    counter = [0]
    desc = f"{run.name} shard {index} of 0..{plan.n_shards - 1}"
    info = {"model": run.name, "shard": index, "device": str(run.device)}
    try:
        found = run.cache.get_or_compute(material, n, _compute(run, part, index, counter, desc), desc, info)
    except BadImageError as err:
        raise BadImageError(f"gallery shard {index}: {err}") from None
    entry = run.cache.complete_entry(material, n)
    if entry is None:  # removed by another process between the two (fusebench-cache remove): a bug otherwise
        raise RuntimeError(f"{desc}: the cache entry {found.key} vanished after it was written")
    if found.hit and _settled(run, index, start, entry, material, n) is None:  # another job made it, under skip
        return embed_shard(run, plan, index)
    return _result(run, index, entry, hit=found.hit, computed=counter[0]), entry


class ShardRows:
    """A model's distractor rows from its shard entries (``DistractorRows``): row ``i`` is distractor ``i``;
    ``read(start, stop)`` reads only the shards' rows it needs, memory-mapped, as float32 L2-normalised rows
    (``distractors.normalised``). ``failed``: positions of images that failed to decode (NaN rows here: the
    gallery drops them, :func:`without_failed`), with ``failed_refs`` their files."""

    def __init__(self, entries: list[CompleteEntry]):
        self.paths = [entry.path for entry in entries]
        self.keys = [entry.key for entry in entries]
        self.metas = [entry.meta for entry in entries]  # what each shard's embedding recorded (seconds, device)
        shapes = [tuple(entry.meta["shape"]) for entry in entries]
        widths = {shape[1] for shape in shapes if shape[0]}
        if len(widths) > 1:
            raise ValueError(f"shards of one model with different widths {sorted(widths)}: {self.keys}")
        self.dim = widths.pop() if widths else 0
        self.starts = np.concatenate([[0], np.cumsum([shape[0] for shape in shapes])]).astype(np.int64)
        self.n = int(self.starts[-1])
        failed = [(int(self.starts[i]) + f["row"], f["ref"]) for i, entry in enumerate(entries)
                  for f in entry.meta.get("stats", {}).get("failed_images", [])]
        self.failed = np.array([position for position, _ in failed], dtype=np.int64)
        self.failed_refs = [ref for _, ref in failed]

    @property
    def key(self) -> dict:
        return {"kind": "shards", "keys": self.keys, "n": self.n}

    def read(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, int(start)), min(int(stop), self.n)
        if stop <= start:
            return np.empty((0, self.dim), dtype=np.float32)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        for i in range(first, len(self.paths)):
            lo, hi = int(self.starts[i]), int(self.starts[i + 1])
            if lo >= stop:
                break
            rows = np.load(self.paths[i], mmap_mode="r", allow_pickle=False)
            pieces.append(np.asarray(rows[max(start, lo) - lo:min(stop, hi) - lo], dtype=np.float32))
        return normalised(np.concatenate(pieces) if len(pieces) > 1 else pieces[0])


def shard_rows(run: RealRun, plan: ShardPlan) -> ShardRows:
    """``run``'s model's rows of every shard of ``plan``, as one gallery; a shard not in the cache yet (no
    ``fusebench-embed`` job made it) is embedded here first, with a progress bar."""

    entries: list[CompleteEntry | None] = []
    for index in range(plan.n_shards):
        part, (start, _) = plan.part(index), plan.bounds(index)
        material = shard_material(run, part)
        entries.append(_settled(run, index, start, run.cache.complete_entry(material, len(part)), material, len(part)))
    missing = [i for i, entry in enumerate(entries) if entry is None]
    _check_precision(run, plan, missing)  # before any shard is embedded here
    if missing:
        log.info("%s: %d of %d gallery shards are not in the cache; embedding them here (fusebench-embed runs "
                 "them as parallel jobs)", run.name, len(missing), plan.n_shards)
        with progress_bar(total=len(missing), desc=f"{run.name} gallery shards", unit="shard") as bar:
            for index in missing:
                entries[index] = embed_shard(run, plan, index)[1]
                bar.update(1)
    return ShardRows(entries)


def _check_precision(run: RealRun, plan: ShardPlan, indices: list[int]) -> None:
    """Refuse to embed shards again only because ``embed.precision=auto`` resolves to another precision here than
    where they were embedded (bf16 on a GPU node, fp32 on this CPU): their key holds the precision."""
    if run.runtime.precision != "auto":
        return  # a precision asked for is what the user wants
    for index in indices:
        part = plan.part(index)
        for precision in ("bf16", "fp16", "fp32"):
            if precision == run.precision:
                continue
            material, key = run.cache.keyed({**shard_material(run, part), "precision": precision}, len(part))
            if entry_meta(run.cache.entry_dir(key), key, material)[0] is not None:
                raise FusebenchError(
                    f"models.{run.name}: gallery shard {index} is in the cache embedded with embed.precision="
                    f"{precision}, but embed.precision=auto is {run.precision} on {run.device}, so it would be "
                    f"embedded again here: set embed.precision={precision} to read the shards (or "
                    f"embed.precision={run.precision} to embed them again).")


def without_failed(rows: dict[str, ShardRows], items: DistractorItems) -> tuple[dict, DistractorItems, list[str]]:
    """Every model's gallery less the distractors any model could not read (their rows are NaN), and the items
    left, with the refs dropped (sorted by position). Nothing failed: the rows and items as they are."""
    failed = sorted({int(p): ref for r in rows.values() for p, ref in zip(r.failed, r.failed_refs)}.items())
    if not failed:
        return dict(rows), items, []
    drop = np.zeros(len(items), dtype=bool)
    drop[[position for position, _ in failed]] = True
    keep = np.flatnonzero(~drop)
    kept = DistractorItems([items.ids[i] for i in keep], [items.refs[i] for i in keep], items.source)
    return {name: KeptRows(r, keep) for name, r in rows.items()}, kept, [ref for _, ref in failed]


def embedding_cost(rows: ShardRows, dtype: str) -> dict:
    """What a model's shards cost to store and to embed: the cache's dtype and its bytes per value, and the
    images/s and device(s) of the embedding, from what each shard's computation recorded."""
    seconds = sum(float(meta.get("stats", {}).get("embed_seconds", 0.0)) for meta in rows.metas)
    devices = sorted({str(meta.get("info", {}).get("device", "")) for meta in rows.metas} - {""})
    return {"stored_dtype": dtype, "value_bytes": 2 if dtype == "fp16" else 4,
            "embed_device": ", ".join(devices) or None,
            "images_per_second": round(rows.n / seconds, 2) if seconds > 0 else None}


def cache_progress(run: RealRun, plan: ShardPlan) -> tuple[list[int], float, int]:
    """A quick look at which of ``plan``'s shards are complete in the cache for ``run``'s model (each entry's
    meta.json, proven this shard's: no checksum read, no lock, so a shard another job is computing is not waited
    for), with their recorded embedding seconds and image count (what an ETA is estimated from)."""
    done, seconds, images = [], 0.0, 0
    for index in range(plan.n_shards):
        part = plan.part(index)
        material, key = run.cache.keyed(shard_material(run, part), len(part))
        meta, _ = entry_meta(run.cache.entry_dir(key), key, material)
        if meta is not None:
            done.append(index)
            seconds += float(meta.get("stats", {}).get("embed_seconds", 0.0))
            images += len(part)
    return done, seconds, images
