"""``gallery=vectors``: distractor rows from embedding dumps in clip-retrieval's layout, read a tile at a time.

clip-retrieval's ``inference`` writes, per output partition ``i`` (zero-padded to the partition count's width):

    DUMP/img_emb/img_emb_{i}.npy          (rows, dim) float16 image embeddings (L2-normalised before the cast)
    DUMP/metadata/metadata_{i}.parquet    one row per embedding, row-aligned: image_path (a file path, or the
                                          webdataset __key__), caption, and with --enable_metadata the sample's
                                          JSON fields (img2dataset's url, key, ...)

A dump's rows are numbered through its shards in partition order. A gallery takes them in :func:`seeded_order`
over the dump's rows (the first ``gallery.size``: galleries nest), or, for a second model's dump, the rows holding
the reference dump's ids in that order (dumps of two models need not be row-aligned). Ids come from the metadata's
``key`` column, else ``image_path``, else ``url`` (the key names the column used); reading them needs pyarrow.

:class:`VectorDumpRows` reads ``read(start, stop)`` from the .npy shards by ``os.preadv`` (never whole, never
mapped): the rows asked for, sorted, each run of consecutive rows read by one call straight into the tile, so a
tile reads exactly its own bytes (mapped files would read ahead around every scattered row); then normalised as
the test rows are (:func:`distractors.normalised`). A zero or non-finite row is an error naming its shard, row
and id.

Its ``key`` fingerprints the files without reading them whole: per shard the .npy's name, size, mtime and the
SHA-256 of its first and last MiB, and the metadata's name, size, mtime and full SHA-256 (the metadata holds the
ids; ~100 MB a million rows); then the rows taken (their positions' digest). A full digest of the .npy files
(1.5 GB per million rows at d=768 fp16; 0.6 to 2 s of SHA-256 a GB on this 2-core machine, in every job) buys nothing the size and mtime do
not already catch: a rewritten dump has a new mtime (scripts/bench_gallery_sources.py measures both).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig
from fusebench.data.distractor_items import check_no_overlap, check_size, seeded_order
from fusebench.data.distractor_sources import check_unique_ids, listing_digest, parquet_module
from fusebench.encoders.distractors import DistractorRows, normalised
from fusebench.stores.files import array_digest, remembered_checksum

ID_COLUMNS = ("key", "image_path", "url")  # a dump's id column: the first of these its metadata has
PARTIAL_BYTES = 1 << 20  # the .npy bytes hashed at each end for the key
_SHARD = re.compile(r"img_emb_(\d+)\.npy")


def _read_into(fd: int, buffer: memoryview, offset: int) -> int:
    """Read ``len(buffer)`` bytes at ``offset`` into ``buffer`` (os.preadv where the system has it, several calls
    where one returns less: Linux reads at most ~2 GB a call); the bytes read, fewer only at the end of the file."""
    done = 0
    while done < len(buffer):
        if hasattr(os, "preadv"):
            got = os.preadv(fd, [buffer[done:]], offset + done)
        else:
            data = os.pread(fd, len(buffer) - done, offset + done)
            buffer[done:done + len(data)] = data
            got = len(data)
        if got == 0:
            break
        done += got
    return done


def read_sorted_rows(npy: Path, offset: int, dim: int, dtype: np.dtype, local: np.ndarray) -> np.ndarray:
    """Rows ``local`` (ascending) of the C-order (rows, ``dim``) ``dtype`` array whose data starts at byte ``offset``
    of ``npy``, each run of consecutive rows read by one system call straight into the result (no byte read that
    is not returned; never mapped)."""
    row_bytes = dim * dtype.itemsize
    out = np.empty((len(local), dim), dtype=dtype)
    if out.size == 0:
        return out
    view = memoryview(out).cast("B")
    cut = np.flatnonzero(np.diff(local) != 1) + 1
    fd = os.open(npy, os.O_RDONLY)
    try:
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(local)]):
            wanted = view[a * row_bytes:b * row_bytes]
            if _read_into(fd, wanted, offset + int(local[a]) * row_bytes) != len(wanted):
                raise OSError(f"{npy} ended early")
    finally:
        os.close(fd)
    return out


class DumpShard:
    """One ``img_emb_{i}.npy`` (its header read: rows, dim, dtype, where the data starts) and its metadata file."""

    def __init__(self, npy: Path, metadata: Path, start: int, where: str):
        self.npy, self.metadata, self.start = npy, metadata, start
        try:
            with npy.open("rb") as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(fh)
                self.offset = fh.tell()
        except (OSError, ValueError) as err:
            raise FusebenchError(f"{where}: {npy} is not a readable .npy file ({err}).") from None
        if len(shape) != 2 or fortran or dtype.kind != "f" or dtype.itemsize not in (2, 4):
            raise FusebenchError(f"{where}: {npy} holds a {'Fortran-order ' if fortran else ''}{dtype} array of shape "
                                 f"{shape}; a dump's shards must be 2-D float16 or float32 (rows, dim) arrays.")
        self.rows, self.dim = int(shape[0]), int(shape[1])
        self.dtype = dtype
        needed = self.offset + self.rows * self.dim * dtype.itemsize
        if npy.stat().st_size < needed:
            raise FusebenchError(f"{where}: {npy} is cut short ({npy.stat().st_size:,} bytes, its header needs "
                                 f"{needed:,}).")

    def read_sorted(self, local: np.ndarray) -> np.ndarray:
        """Rows ``local`` (ascending) of this shard (:func:`read_sorted_rows`)."""
        return read_sorted_rows(self.npy, self.offset, self.dim, self.dtype, local)

    def fingerprint(self) -> dict:
        npy, meta = self.npy.stat(), self.metadata.stat()
        digest = hashlib.sha256()
        with self.npy.open("rb") as fh:
            digest.update(fh.read(PARTIAL_BYTES))
            fh.seek(max(0, npy.st_size - PARTIAL_BYTES))
            digest.update(fh.read(PARTIAL_BYTES))
        return {"npy": self.npy.name, "bytes": npy.st_size, "mtime_ns": npy.st_mtime_ns, "ends_sha256": digest.hexdigest(),
                "metadata": self.metadata.name, "metadata_bytes": meta.st_size, "metadata_mtime_ns": meta.st_mtime_ns,
                "metadata_sha256": remembered_checksum(self.metadata, "sha256")}


class ClipRetrievalDump:
    """A clip-retrieval dump's shards, checked: each .npy has its metadata file with as many rows, every shard
    has one float16/float32 dtype and one width. ``where`` (the config key it came from) starts every error."""

    def __init__(self, folder: str, where: str):
        self.folder, self.where = Path(folder).expanduser(), where
        emb, meta = self.folder / "img_emb", self.folder / "metadata"
        layout = "a clip-retrieval dump folder holds img_emb/img_emb_{i}.npy and metadata/metadata_{i}.parquet"
        if not self.folder.is_dir():
            raise FusebenchError(f"{where}={folder!r}: no such folder ({layout}).")
        if not emb.is_dir() and self.folder.name == "img_emb":
            raise FusebenchError(f"{where}={folder!r} is the img_emb folder; give the dump folder above it ({layout}).")
        found = sorted(((int(m.group(1)), p) for p in (emb.iterdir() if emb.is_dir() else ())
                        if (m := _SHARD.fullmatch(p.name))), key=lambda x: x[0])
        if not found:
            raise FusebenchError(f"{where}={folder!r}: no img_emb/img_emb_*.npy ({layout}).")
        pq = parquet_module(f"{where}: the dump's metadata")
        self.shards, start = [], 0
        for index, npy in found:
            parquet = meta / f"metadata_{npy.stem.removeprefix('img_emb_')}.parquet"
            if not parquet.is_file():
                raise FusebenchError(f"{where}: {npy.name} has no metadata file {parquet} ({layout}, row-aligned).")
            shard = DumpShard(npy, parquet, start, where)
            rows, columns = self._metadata_header(pq, parquet)
            if rows != shard.rows:
                raise FusebenchError(f"{where}: shard {index}: {npy.name} has {shard.rows:,} rows but {parquet.name} "
                                     f"has {rows:,}; the metadata must be row-aligned with the embeddings.")
            if self.shards and (shard.dim, shard.dtype) != (self.shards[0].dim, self.shards[0].dtype):
                first = self.shards[0]
                raise FusebenchError(f"{where}: {npy.name} holds {shard.dtype} rows of dimension {shard.dim} but "
                                     f"{first.npy.name} {first.dtype} of dimension {first.dim}; one dump is one model.")
            wanted = (self.id_column,) if self.shards else ID_COLUMNS  # the first shard's id column, in every shard
            id_column = next((c for c in wanted if c in columns), None)
            if id_column is None:
                raise FusebenchError(f"{where}: {parquet.name} has no column {' or '.join(map(repr, wanted))} (its "
                                     f"columns: {', '.join(columns)}); distractors need ids, read from the first of "
                                     f"{', '.join(ID_COLUMNS)} the dump's metadata has.")
            self.id_column = id_column
            self.shards.append(shard)
            start += shard.rows
        self.n, self.dim, self.dtype = start, self.shards[0].dim, self.shards[0].dtype
        self.starts = np.array([s.start for s in self.shards] + [start], dtype=np.int64)
        self._ids: list[str] | None = None

    def _metadata_header(self, pq, parquet: Path) -> tuple[int, list[str]]:
        try:
            info = pq.ParquetFile(parquet)
            return int(info.metadata.num_rows), list(info.schema_arrow.names)
        except (OSError, ValueError) as err:
            raise FusebenchError(f"{self.where}: {parquet} is not a readable parquet file ({err}).") from None

    def locate(self, row: int) -> tuple[DumpShard, int]:
        shard = self.shards[int(np.searchsorted(self.starts, row, side="right")) - 1]
        return shard, row - shard.start

    def shard_ids(self, shard: DumpShard) -> list[str]:
        pq = parquet_module(f"{self.where}: the dump's metadata")
        values = pq.read_table(shard.metadata, columns=[self.id_column]).column(self.id_column).to_pylist()
        missing = next((r for r, v in enumerate(values) if v is None or v == ""), None)
        if missing is not None:
            raise FusebenchError(f"{self.where}: {shard.metadata.name} row {missing} has no {self.id_column!r}; every "
                                 "row needs an id.")
        return [str(v) for v in values]

    def ids(self) -> list[str]:
        """Every row's id, in the dump's order (unique: a repeated id is an error naming both rows)."""
        if self._ids is None:
            ids = [i for shard in self.shards for i in self.shard_ids(shard)]

            def where(row: int) -> str:
                shard, local = self.locate(row)
                return f"{self.where}: {shard.metadata.name} row {local}"

            check_unique_ids(ids, where)
            self._ids = ids
        return self._ids

    def key(self) -> dict:
        files = [shard.fingerprint() for shard in self.shards]
        text = json.dumps(files, sort_keys=True).encode()
        return {"kind": "clip-retrieval dump", "rows": self.n, "dim": self.dim, "dtype": self.dtype.str,
                "id_column": self.id_column, "shards": len(files), "files_sha256": hashlib.sha256(text).hexdigest()}

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Raw rows ``rows`` (any order) in the dump's dtype, read shard by shard in ascending order."""
        order = np.argsort(rows, kind="stable")
        ascending = rows[order]
        out = np.empty((len(rows), self.dim), dtype=self.dtype)
        cuts = np.searchsorted(ascending, self.starts)
        for shard, a, b in zip(self.shards, cuts[:-1], cuts[1:]):
            if b > a:
                out[order[a:b]] = shard.read_sorted(ascending[a:b] - shard.start)
        return out


class VectorDumpRows:
    """The first ``size`` distractors of a dump: its rows in ``seeded_order(dump rows, seed)``, or, given ``ids``
    (the gallery's ids in order, from another model's dump), the rows holding those ids. ``folder``: the dump
    folder or an opened :class:`ClipRetrievalDump`."""

    def __init__(self, folder: str | ClipRetrievalDump, size: int, model_name: str, seed: int = 0,
                 ids: list[str] | None = None):
        self.dump = folder if isinstance(folder, ClipRetrievalDump) else ClipRetrievalDump(
            folder, f"gallery.vectors.{model_name}")
        if ids is None:
            check_size(size, self.dump.n, f"{self.dump.where}={str(self.dump.folder)!r}")
            self.rows = seeded_order(self.dump.n, seed)[:size]
        else:
            self.rows = rows_of_ids(self.dump, ids[:size])
        self.n, self.dim = int(len(self.rows)), self.dump.dim
        self._key = {**self.dump.key(), "n": self.n, "seed": None if ids is not None else int(seed),
                     "rows_sha256": array_digest(self.rows)}

    @property
    def key(self) -> dict:
        return self._key

    def read(self, start: int, stop: int) -> np.ndarray:
        positions = self.rows[start:stop]
        raw = self.dump.read_rows(positions)
        rows = normalised(raw)
        bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
        if bad.size:
            raise self._bad_row(int(positions[bad[0]]), raw[bad[0]])
        return rows

    def _bad_row(self, row: int, raw: np.ndarray) -> FusebenchError:
        shard, local = self.dump.locate(row)
        try:
            name = f", id {self.dump.shard_ids(shard)[local]!r}"
        except (FusebenchError, OSError, ValueError):
            name = ""
        what = "all zeros" if not np.any(raw) else "not finite (NaN or inf)"
        return FusebenchError(f"{self.dump.where}: {shard.npy} row {local} (dump row {row:,}{name}) is {what}; a "
                              "distractor's embedding must be a finite, non-zero vector: remove that row (and its "
                              "metadata row) from the dump.")


def rows_of_ids(dump: ClipRetrievalDump, ids: list[str]) -> np.ndarray:
    """The dump rows holding ``ids``, in their order; an id the dump lacks is an error naming it."""
    position = {image_id: row for row, image_id in enumerate(dump.ids())}
    missing = [i for i in ids if i not in position]
    if missing:
        raise FusebenchError(f"{dump.where}={str(dump.folder)!r}: {len(missing):,} of the gallery's {len(ids):,} "
                             f"distractors are not in this dump (first: {missing[0]!r}); every model's dump must "
                             "hold the gallery's images (the first model's dump sets the gallery).")
    return np.array([position[i] for i in ids], dtype=np.int64)


def dump_ids(folder: str, seed: int, size: int | None = None, model_name: str = "") -> list[str]:
    """A dump's ids in the seeded order a gallery takes its rows in (the first ``size``; all when None)."""
    dump = ClipRetrievalDump(folder, f"gallery.vectors.{model_name}" if model_name else "dump")
    ids = dump.ids()
    return [ids[i] for i in seeded_order(dump.n, seed)[:size]]


def dump_rows(gallery: GalleryConfig, names: list[str], test_ids: list[str]
              ) -> tuple[dict[str, DistractorRows], list[str], dict, dict]:
    """Per model its rows of the gallery's first ``gallery.size`` distractors; their ids (the first model's dump
    sets them, in seeded order; the other dumps give the rows holding those ids); the source's description; and
    per model what storing its rows costs. Errors: a model without a dump, a size beyond the dump, a distractor
    with a test image's id."""
    missing = [name for name in names if name not in gallery.vectors]
    if missing:
        raise FusebenchError(f"gallery=vectors has no dump for model(s) {', '.join(missing)}: give "
                             f"gallery.vectors.{missing[0]}=/path/to/dump (a clip-retrieval dump folder).")
    dumps = {name: ClipRetrievalDump(gallery.vectors[name], f"gallery.vectors.{name}") for name in names}
    first = dumps[names[0]]
    where = f"gallery.vectors.{names[0]}={gallery.vectors[names[0]]!r}"
    check_size(gallery.size, first.n, where)
    every_id = first.ids()
    ids = [every_id[i] for i in seeded_order(first.n, gallery.seed)[: gallery.size]]
    check_no_overlap(test_ids, ids, where)
    rows: dict[str, DistractorRows] = {}
    for name, dump in dumps.items():  # a dump row-aligned with the first takes the same seeded rows
        aligned = dump is first or dump.ids() == every_id
        rows[name] = (VectorDumpRows(dump, gallery.size, name, gallery.seed) if aligned
                      else VectorDumpRows(dump, gallery.size, name, ids=ids))
    source = {"kind": "vectors", "dumps": {name: str(dumps[name].folder) for name in names}, "seed": gallery.seed,
              "id_column": first.id_column, "available": first.n, "listing": listing_digest(ids, [None] * len(ids))}
    costs = {name: {"stored_dtype": str(dump.dtype), "value_bytes": dump.dtype.itemsize} for name, dump in dumps.items()}
    return rows, ids, source, costs
