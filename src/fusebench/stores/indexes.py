"""The index store: FAISS indexes (``search=faiss_*``), built once per model x items x direction x index build
parameters and read back by every later job, so that a sweep over fusion settings or over the search-time
parameters (``nprobe``, ``efSearch``: not in the key) builds each index once.

    CACHE/indexes/ab/abcdef.../index.faiss   faiss.serialize_index bytes (built with its search-time parameters
                                             at FAISS's defaults: the bytes depend on the key alone)
    CACHE/indexes/ab/abcdef.../index.ivfdata an IVF index's inverted lists on disk (OnDiskInvertedLists, when
                                             search.max_memory_gb sends them there; index.faiss names this path)
    CACHE/indexes/ab/abcdef.../meta.json     key material, ntotal, d, bytes and CRC-32 of index.faiss (and of
                                             index.ivfdata, with its path)
    CACHE/indexes/ab/abcdef....lock          held while the entry is read or built (two jobs never both build it)

Key material (``index_material``): the items' digest (``stores.lists.shared_digests``), their count and width,
the direction, the index kind, the resolved build parameters (nlist, M, efConstruction, pq m, nbits, k-means
seed), the FAISS version and this store's format; over a gallery, the items' digest covers the test images and
the gallery's distractor key, with the training sample and ``on_disk`` beside the build parameters
(``backends.gallery_index``). Guarantees as for the list store (``stores.entries``): atomic
writes (meta.json last), a lock per entry, a checksum verified on every read (a block at a time, under the entry's
lock, before ``faiss.read_index`` reads the file: FAISS is never given unchecked bytes, and no copy of them sits
beside the index); an entry that is not provably the
one asked for, truncated, corrupt, of another format, without meta.json (a write killed midway) or whose index
reads back as another index (``ntotal``, ``d``, metric, class, build parameters: ``index_problem``) is reported,
removed and rebuilt, never read. An entry with lists on disk is built in its folder (the path is written into
index.faiss), so a build killed midway leaves a folder without meta.json: discarded and rebuilt; one whose folder
moved (another path than recorded) is rebuilt too. index.faiss is written by FAISS straight to its file (no
serialised copy in memory beside the index), and read back the same way. Listed and
removed by ``fusebench-cache`` (kind ``index``). faiss is imported
where an index is read or written, so that ``fusebench-cache`` starts (and lists) without it.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusebench.stores.entries import STORES, Store, data_file_size_problem, discard_entry
from fusebench.stores.files import atomic_save, clear_path

FORMAT = 1  # bump when the stored bytes change meaning; older entries then have another key (listed, removable)
STORE = "index store"
DATA = "index.faiss"
IVFDATA = "index.ivfdata"  # an IVF index's inverted lists on disk (OnDiskInvertedLists)
CRC_BLOCK = 1 << 26  # bytes read at a time for a checksum
# the FAISS class each index kind builds (what a read-back index must be; an IVF-PQ with search.refine_factor sits
# inside an IndexRefineFlat holding the full vectors, build parameter refine=flat)
KIND_CLASSES = {"flat": "IndexFlatIP", "ivf_flat": "IndexIVFFlat", "hnsw": "IndexHNSWFlat", "ivf_pq": "IndexIVFPQ",
                "ivf_pqfs": "IndexIVFPQFastScan"}


def index_material(items_digest: str, n: int, dim: int, direction: str, kind: str, build: dict,
                   faiss_version: str) -> dict:
    """Everything an index's bytes depend on: its store key's material. ``build``: the resolved BUILD
    parameters (FAISS names: nlist, M, efConstruction, m, width when padded, nbits, seed); search-time ones stay out."""
    return {"kind": "index", "format": FORMAT, "items": items_digest, "n": int(n), "dim": int(dim),
            "direction": direction, "index": kind, "build": dict(build), "faiss": faiss_version}


def index_problem(index, material: dict) -> str | None:
    """Why a read-back ``index`` is not the one ``material`` describes (count, width, metric, class, build
    parameters), or None."""
    import faiss

    expected = KIND_CLASSES[material["index"]]
    build = material["build"]
    outer = index = faiss.downcast_index(index)
    refined = isinstance(index, faiss.IndexRefineFlat)
    if refined != (build.get("refine") == "flat"):  # search.refine_factor: IndexRefineFlat(the index), full vectors
        return (f"holds a {type(index).__name__}, expected "
                + ("an IndexRefineFlat (search.refine_factor)" if not refined else f"a {expected} without re-ranking"))
    if refined:
        refine = faiss.downcast_index(index.refine_index)
        if (not isinstance(refine, faiss.IndexFlat) or refine.ntotal != material["n"] or refine.d != material["dim"]
                or refine.metric_type != faiss.METRIC_INNER_PRODUCT):
            return (f"holds re-ranking vectors ({type(refine).__name__}, {refine.ntotal} of width {refine.d}) that are "
                    f"not {material['n']} inner-product rows of width {material['dim']}")
        index = faiss.downcast_index(index.base_index)
    if "width" in build:  # zero-padded vectors: IndexPreTransform(RemapDimensionsTransform(dim, width)) -> the index
        padding = _padding_problem(faiss, index, material["dim"], build["width"])
        if padding:
            return padding
        index = faiss.downcast_index(index.index)
    found = type(index).__name__
    if found != expected:
        return f"holds a {found}, expected a {expected}"
    if outer.ntotal != material["n"] or outer.d != material["dim"]:
        return f"holds {outer.ntotal} vectors of width {outer.d}, expected {material['n']} of width {material['dim']}"
    if outer.metric_type != faiss.METRIC_INNER_PRODUCT:
        return f"metric {outer.metric_type}, expected inner product ({faiss.METRIC_INNER_PRODUCT})"
    found = {"nlist": getattr(index, "nlist", None), "M": index.hnsw.nb_neighbors(1) if expected == "IndexHNSWFlat"
             else None, "m": index.pq.M if hasattr(index, "pq") else None,
             "nbits": index.pq.nbits if hasattr(index, "pq") else None}
    wrong = [f"{name}={found[name]} (expected {build[name]})" for name in found if name in build and found[name] != build[name]]
    return f"built with {', '.join(wrong)}" if wrong else None


def _padding_problem(faiss, index, dim: int, width: int) -> str | None:
    """Why ``index`` is not one transform zero-padding ``dim`` coordinates to ``width`` over an index ``width`` wide."""
    if not isinstance(index, faiss.IndexPreTransform) or index.chain.size() != 1:
        return f"holds a {type(index).__name__}, expected padding from width {dim} to {width} (an IndexPreTransform)"
    remap = faiss.downcast_VectorTransform(index.chain.at(0))
    if (not isinstance(remap, faiss.RemapDimensionsTransform) or (remap.d_in, remap.d_out) != (dim, width)
            or index.index.d != width or faiss.vector_to_array(remap.map).tolist() != [*range(dim), *[-1] * (width - dim)]):
        return f"holds another transform than zero-padding from width {dim} to {width}"
    return None


@dataclass
class StoredIndex:
    index: object  # the faiss index (on the CPU)
    key: str | None  # the store key (None: no store)
    hit: bool  # read from the store, not built
    build_seconds: float | None  # building it (None on a hit)
    index_bytes: int  # its serialised size
    stored: bool  # it came from, or went to, the store


def serialize(index) -> np.ndarray:
    import faiss

    return faiss.serialize_index(index)


def build_unstored(build: Callable[[], object]) -> StoredIndex:
    """``build()`` without a store: timed, its serialised size measured."""
    started = time.perf_counter()
    index = build()
    seconds = time.perf_counter() - started
    return StoredIndex(index, None, False, seconds, int(serialize(index).nbytes), False)


@STORES.register
class IndexStore(Store):
    folder, name, kind, format, what = "indexes", STORE, "index", FORMAT, "the index"
    order = 4

    def get_or_build(self, material: dict, build: Callable[..., object], info: dict | None = None,
                     on_disk: bool = False) -> StoredIndex:
        """The index ``material`` describes: from the store, else ``build()``'s, stored. ``on_disk``: the index's
        inverted lists live in the entry, and ``build(path)`` puts them at ``path`` (the entry's index.ivfdata,
        made before anything else of the entry, which is complete only when meta.json is written last)."""
        with self.locked(material) as (key, folder):
            stored = self.read(folder, key, material, lambda meta: _checked_entry(folder, key, meta, material))
            if stored is not None:
                return stored
            started = time.perf_counter()
            if on_disk:
                clear_path(folder)
                folder.mkdir(parents=True)
                index = build(folder / IVFDATA)
            else:
                index = build()
            seconds = time.perf_counter() - started

            def write() -> dict:
                return self.write(folder, key, material, info or {},
                                  lambda folder: _save_index(folder, material, index, on_disk), fresh=not on_disk)

            if on_disk:  # its lists are in the entry's folder: nothing to go on with when it cannot be stored
                try:
                    meta = write()
                except OSError:
                    clear_path(folder)
                    raise
            else:  # a full disk or a read-only cache: keep the index, store nothing
                meta = self.store_or_keep(folder, write)
            if meta is None:
                return StoredIndex(index, key, False, seconds, int(serialize(index).nbytes), False)
            return StoredIndex(index, key, False, seconds, _entry_bytes(meta), True)

    def unfinished(self, folder: Path) -> None:
        if os.path.lexists(folder):  # a folder without meta.json: a write killed midway
            discard_entry(folder, STORE, "no meta.json (a write that never finished)")

    def describe(self, meta: dict) -> dict:
        material = meta.get("material") or {}
        return {**super().describe(meta), "shape": [meta.get("ntotal"), meta.get("d")],
                "dtype": f"{material.get('index')} {material.get('direction')}"}

    def data_files(self, meta: dict) -> dict[str, dict]:
        return {DATA: meta, **({IVFDATA: meta["ivfdata"]} if isinstance(meta.get("ivfdata"), dict) else {})}


def _entry_bytes(meta: dict) -> int:
    """The bytes an entry holds: index.faiss, and its lists on disk."""
    return int(meta["bytes"]) + (int(meta["ivfdata"]["bytes"]) if "ivfdata" in meta else 0)


def _checked_entry(folder: Path, key: str, meta: dict, material: dict) -> tuple[StoredIndex | None, str | None]:
    """The stored index when its files are intact and it reads back as ``material``'s index."""
    problem = data_file_size_problem(folder / DATA, meta["bytes"])
    if problem is None and "ivfdata" in meta:
        problem = _ivfdata_problem(folder, meta["ivfdata"])
    if problem is None:
        index, problem = _checked_index(folder / DATA, meta, material)
    return (None, problem) if problem else (StoredIndex(index, key, True, None, _entry_bytes(meta), True), None)


def _save_index(folder: Path, material: dict, index, on_disk: bool) -> dict:
    """Write index.faiss (and sync the lists on disk); what meta.json records of them."""
    import faiss

    data_path = folder / DATA
    atomic_save(data_path, lambda tmp: _write_index_synced(faiss, index, tmp))
    fields = {"ntotal": material["n"], "d": material["dim"], "bytes": data_path.stat().st_size,
              "crc32": file_crc32(data_path)}
    if on_disk:
        lists = folder / IVFDATA
        with lists.open("rb+") as fh:  # the memory-mapped lists, on disk before meta.json says complete
            os.fsync(fh.fileno())
        fields["ivfdata"] = {"path": str(lists), "bytes": lists.stat().st_size, "crc32": file_crc32(lists)}
    return fields


def _write_index_synced(faiss, index, path: Path) -> None:
    faiss.write_index(index, str(path))  # the bytes faiss.serialize_index gives, without a copy in memory
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def file_crc32(path: Path) -> str:
    """CRC-32 of a file, read a block at a time."""
    crc = 0
    with path.open("rb") as fh:
        while block := fh.read(CRC_BLOCK):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _ivfdata_problem(folder: Path, record: dict) -> str | None:
    """Why an entry's on-disk inverted lists cannot be read: another path than the one index.faiss names (the
    entry moved), a size or checksum other than recorded."""
    path = folder / IVFDATA
    if record.get("path") != str(path):
        return f"{IVFDATA} was written at {record.get('path')}, not here (index.faiss names that path)"
    problem = data_file_size_problem(path, record["bytes"])
    if problem is None and file_crc32(path) != record.get("crc32"):
        problem = f"{IVFDATA} does not match its recorded checksum"
    return problem


def _checked_index(path: Path, meta: dict, material: dict) -> tuple[object | None, str | None]:
    """The index in ``path`` when its bytes match meta.json's size and CRC-32 and it reads back as ``material``'s
    index; else (None, why). The checksum is read a block at a time, then FAISS reads the file itself into the
    index (no copy of its bytes beside the index: a 1M-row IVF-Flat is 1 GB); the entry's lock is held across
    both, so the bytes FAISS reads are the ones checked, and a damaged file never reaches FAISS's reader (it could
    crash on one)."""
    import faiss

    size = path.stat().st_size
    if size != meta["bytes"]:
        return None, f"{DATA} has {size} bytes, expected {meta['bytes']} (truncated?)"
    if file_crc32(path) != meta.get("crc32"):
        return None, f"{DATA} does not match its recorded checksum"
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as err:  # FAISS's reader raises RuntimeError on bytes it cannot parse
        return None, f"FAISS cannot read {DATA} ({str(err).strip().splitlines()[0] if str(err).strip() else err})"
    problem = index_problem(index, material)
    return (None, f"{DATA} {problem}") if problem else (index, None)
