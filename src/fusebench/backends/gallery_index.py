"""A FAISS index over a gallery (``search=faiss_* gallery=...``): the test split's images, then every distractor
kept, in the gallery's index order (item i of the index is t2i item i of the exact path; ``topk/gallery_items.jsonl``
names it), streamed from the gallery's rows (:class:`~fusebench.search.gallery_search.GalleryTiles`: sim blocks,
embedding shards, clip-retrieval dumps), never held whole beside the index:

* **training** (IVF): on a seeded sample of the rows (:func:`train_sample`: sorted positions drawn by
  ``numpy.random.default_rng(search.seed)``; every row when the gallery is smaller than what k-means uses), read
  tile by tile;
* **adding**: one tile of ``item_chunk`` rows at a time, in index order;
* **memory** (``search.max_memory_gb``, :func:`memory_plan`): the index's own structure (the quantizer and the
  training sample; flat: every vector; HNSW: vectors and graph) must fit, else one line naming what it needs; IVF
  codes past the rest of the budget go to FAISS's ``OnDiskInvertedLists`` in the index store's entry (as FAISS's own
  on-disk IVF demo, ``demos/demo_ondisk_ivf.py``), memory-mapped when searched; ``ivf_pqfs``'s blocked fast-scan
  lists stay in memory (4-bit codes: about m / 2 + 8 bytes an item).

The store key (:func:`gallery_digest`) is the test images' digest with the gallery's distractor key (the source, its
seed, its size and the near-duplicates dropped: ``DistractorRows.key``, the key the exact path's list store uses),
plus the training sample and whether the lists are on disk. i2t over a gallery stays exact (distractors ask no i2t
query): :mod:`.faiss_index` takes those lists from the exact path.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.config.search import IVF_INDEXES, PQ_INDEXES
from fusebench.search.gallery_search import GalleryTiles

TRAIN_POINTS = 256  # rows a k-means centroid trains on at most (FAISS's max_points_per_centroid default)
TRAIN_CAP = 262_144  # rows in the training sample at most (k-means' cost; at least 39 a centroid always)
MIN_POINTS = 39  # rows a centroid needs at least (FAISS's min_points_per_centroid)
GB = 1e9  # search.max_memory_gb's unit (bytes)
IVFDATA = "index.ivfdata"  # the on-disk inverted lists' file in the store entry
IN_MEMORY_LISTS = ("ivf_pqfs",)  # IVF kinds whose lists FAISS cannot put on disk (fast-scan's blocked lists)


def train_size(kind: str, n: int, build: dict) -> int:
    """The training sample's rows: what FAISS's k-means would use (256 a centroid, the IVF quantizer's and IVF-PQ's
    codebooks'), capped at ``TRAIN_CAP`` but never below 39 a centroid, and at most every row; 0 for an index
    that trains nothing (flat, HNSW)."""
    if kind not in IVF_INDEXES:
        return 0
    centroids = max(build["nlist"], 2 ** build.get("nbits", 0) if kind in PQ_INDEXES else 0)
    return min(n, max(MIN_POINTS * centroids, min(TRAIN_POINTS * centroids, TRAIN_CAP)))


def train_sample(n: int, size: int, seed: int) -> np.ndarray:
    """Sorted positions of ``size`` of ``n`` rows drawn without replacement (``default_rng(seed)``); all when
    ``size >= n``."""
    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False)).astype(np.int64)


def read_rows(tiles: GalleryTiles, positions: np.ndarray, update: Callable[[int], None] | None = None) -> np.ndarray:
    """The gallery rows at the ascending ``positions``, read tile by tile (one tile and the result in memory);
    ``update(rows)`` after each tile (a progress bar over the gallery's rows: a tile without a sampled row is
    passed over, not read)."""
    out = np.empty((len(positions), tiles.image.shape[1]), dtype=np.float32)
    for t, (c0, c1) in enumerate(tiles.tiles):
        lo, hi = np.searchsorted(positions, [c0, c1])
        if hi > lo:
            out[lo:hi] = tiles.rows(t)[positions[lo:hi] - c0]
        tiles.release(t)
        if update is not None:
            update(c1 - c0)
    return out


def gallery_digest(image_digest: str, distractors_key: dict) -> str:
    """The items' digest of a gallery index: the test images' rows and the distractor rows' own key."""
    text = json.dumps({"test": image_digest, "distractors": distractors_key}, sort_keys=True, separators=(",", ":"))
    return "gallery:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class MemoryPlan:
    structure_bytes: int  # what must sit in memory while building and searching (the index's own structure)
    codes_bytes: int  # the inverted lists' codes and ids (IVF), or 0
    on_disk: bool  # the inverted lists go to OnDiskInvertedLists


def code_bytes(kind: str, dim: int, build: dict) -> int:
    """Bytes of one vector's code in an inverted list (ids aside)."""
    if kind in PQ_INDEXES:
        return math.ceil(build["m"] * build["nbits"] / 8)
    return 4 * dim


def memory_plan(kind: str, n: int, dim: int, build: dict, chunk: int, max_gb: float | None) -> MemoryPlan:
    """What an index of ``n`` vectors needs in memory, and whether its lists go to disk under ``max_gb`` (None:
    never). Refused in one line when the structure alone does not fit."""
    tile = 4 * dim * min(chunk, n)  # the tile being added
    if kind == "flat":
        structure, codes = 4 * dim * n, 0
    elif kind == "hnsw":  # the vectors and level 0's 2M links a node (upper levels add about 1/M of that)
        structure, codes = n * (4 * dim + 4 * 2 * build["M"] + 8), 0
    else:
        width = build.get("width", dim)
        pq = 4 * width * 2 ** build["nbits"] if kind in PQ_INDEXES else 0  # the PQ codebooks
        refine = 4 * dim * n if build.get("refine") == "flat" else 0  # IndexRefineFlat's full vectors, in memory
        structure = (4 * width * build["nlist"] + pq + 4 * dim * train_size(kind, n, build) + 8 * build["nlist"]
                     + refine)
        codes = n * (code_bytes(kind, dim, build) + 8)
        if kind in IN_MEMORY_LISTS:  # its lists cannot go to disk: part of the structure
            structure, codes = structure + codes, 0
    if max_gb is None:
        return MemoryPlan(structure + tile, codes, False)
    limit = max_gb * GB
    if structure + tile > limit:
        need = math.ceil((structure + tile) / GB * 1000) / 1000
        what = {"flat": "every vector (a flat index keeps no part on disk)",
                "hnsw": "its vectors and graph (HNSW keeps no part on disk)",
                "ivf_pqfs": "its quantizer, codebooks, training sample, codes (fast-scan lists stay in memory) and "
                            "one tile of rows"}.get(
            kind, "its quantizer, codebooks, training sample and one tile of rows"
            + (", and the full vectors search.refine_factor re-ranks by" if build.get("refine") else ""))
        raise FusebenchError(f"search.max_memory_gb={max_gb:g} is less than the {need:g} GB a {kind} index of "
                             f"{n:,} vectors of width {dim} needs in memory for {what}: valid search.max_memory_gb "
                             f">= {need:g}" + (", or search.index=ivf_flat | ivf_pq (their lists go to disk)"
                                              if kind in ("flat", "hnsw", *IN_MEMORY_LISTS)
                                              else ", or a smaller search.nlist") + ".")
    return MemoryPlan(structure + tile, codes, structure + tile + codes > limit)


def ivf_part(faiss, index):
    """The IndexIVF inside ``index``: through an IndexRefineFlat (search.refine_factor) by hand, then FAISS's
    extract_index_ivf (an IndexPreTransform when padded); older FAISS releases do not unwrap IndexRefine."""
    outer = faiss.downcast_index(index)
    if isinstance(outer, faiss.IndexRefine):
        index = outer.base_index
    return faiss.extract_index_ivf(index)


def build_streamed(faiss, index, kind: str, tiles: GalleryTiles, sample: np.ndarray, ivfdata: Path | None,
                   update, read_update: Callable[[int], None] | None = None) -> object:
    """``index`` (empty, of ``kind``: :func:`fusebench.backends.faiss_index.new_index`) trained on the rows at
    ``sample`` and filled tile by tile; its inverted lists in ``ivfdata`` (OnDiskInvertedLists) when given.
    ``update(rows)`` after each tile added; ``read_update(rows)`` after each tile of the training sample's read."""
    if not index.is_trained:
        index.train(read_rows(tiles, sample, read_update))
    growing = ivfdata.with_name(ivfdata.name + ".build") if ivfdata is not None else None
    if growing is not None:
        # filled here first: FAISS doubles a list's slot as it grows (up to 4x the codes on disk); sized once for
        # every list at twice its share, so the file is resized (and FAISS prints a line) a few times, not per list
        _on_disk_lists(faiss, index, growing, 2 * tiles.n)
    for t in range(len(tiles.tiles)):
        rows = tiles.rows(t)
        index.add(np.ascontiguousarray(rows, dtype=np.float32))
        tiles.release(t)
        update(len(rows))
    if growing is not None:  # copied list by list into a file of exactly the codes' size (FAISS's merge_from)
        built = ivf_part(faiss, index).invlists
        _on_disk_lists(faiss, index, ivfdata, 0, built)
        growing.unlink()
    return index


def _on_disk_lists(faiss, index, path: Path, entries: int, source=None) -> None:
    """Give ``index``'s IVF part OnDiskInvertedLists at ``path`` (sized for ``entries`` codes), holding ``source``'s
    entries when given; the index owns them (and frees the lists it held)."""
    ivf = ivf_part(faiss, index)
    lists = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(path))
    if entries:
        lists.update_totsize(entries * (ivf.code_size + 8) + 2 * ivf.nlist * (ivf.code_size + 8))
    if source is not None:
        lists.merge_from_1(source, False)
    ivf.replace_invlists(lists, True)
    lists.this.disown()
