"""Whole score matrices for fusion over whole rankings (``fusion.top_k: null``), stored once per model.

The dense path needs every score of every query, so without this store each such job recomputes both
similarity passes. When a model's two matrices (t2i: captions x images; i2t: images with captions x
captions) fit under ``eval.lists.max_scores_mb``, they are computed once, under the entry's lock: the t2i
matrix by the similarity matmul, the i2t matrix as its transpose (read back from the t2i file a slab at a
time, so a caption-image pair has one score in both directions, as in the list pass, and no second matmul
is done). Every later dense job reads them back block by block into a bounded buffer (plain reads: the file
is never mapped, so memory stays at one block). Same key, guarantees and layout as the list store
(``CACHE/scores/ab/KEY/{t2i,i2t}.npy`` + ``meta.json``): atomic, locked, checksummed (verified once per
process), rebuilt when corrupt, of another format or not provably the entry asked for (``entries.entry_meta``),
listed and removed by ``fusebench-cache``. A matrix stored beside them (row orders, moments) that is damaged
(a directory where it belongs included) is reported and computed again; a file where a folder belongs (the
entry's, ``scores/ab/`` or ``scores/`` itself) is reported and removed (``entries.store_folders``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fusebench import DIRECTIONS
from fusebench.stores.entries import STORES, Store, clear_non_file, data_file_problem, entry_lock, read_meta
from fusebench.stores.files import Crc32Writer, atomic_save, atomic_write_text, remember_checksum

if TYPE_CHECKING:  # torch and the numba kernels are imported where a matrix is read, so that fusebench-cache starts fast
    import torch

log = logging.getLogger(__name__)
FORMAT = 4  # 4: t2i in the list pass's row tiles (eval.chunk_size rows; 3: tile_bytes' worth); 3: i2t is the
# transpose of t2i (2 computed it by a second matmul); 2: CRC-32 (1 had SHA-256);
# an entry of another format has another key: never read (fusebench-cache lists and removes it)
SCORE_DTYPE = np.dtype(np.float32)


class StoredRows:
    """Row blocks of a stored (rows x items) matrix (float32 scores, or a uint16/int32 row order), read into
    fresh buffers without mapping the file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with self.path.open("rb") as fh:
            version = np.lib.format.read_magic(fh)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(fh)
            self.offset = fh.tell()
        if fortran or dtype not in (np.float32, np.uint16, np.int32) or len(shape) != 2:
            raise ValueError(f"{self.path.name} is not a C-order float32, uint16 or int32 matrix")
        self.shape, self.dtype = shape, dtype

    def __call__(self, r0: int, r1: int, into: np.ndarray | None = None) -> torch.Tensor:
        """Rows r0..r1, in a fresh array or in the first rows of ``into`` (a reused buffer)."""
        import torch

        out = np.empty((r1 - r0, self.shape[1]), dtype=self.dtype) if into is None else into[: r1 - r0]
        with self.path.open("rb") as fh:
            fh.seek(self.offset + r0 * self.shape[1] * self.dtype.itemsize)
            if fh.readinto(memoryview(out).cast("B")) != out.nbytes:
                raise OSError(f"{self.path} ended early")
        return torch.from_numpy(out)


def transposed_rows(reader: StoredRows, columns: np.ndarray, tile_bytes: int) -> Iterator[np.ndarray]:
    """The rows of the stored matrix's transpose for ``columns`` (in their order), in blocks of about
    ``tile_bytes``, each assembled from the stored rows read a quarter tile at a time into one reused buffer
    (memory: a block and a slab; the stored file is read once per block)."""
    from fusebench.search import row_kernels  # lazy: heavy (numpy, numba)
    from fusebench.search.model_lists import tiles  # lazy: heavy (torch, numpy, numba)

    n_rows, n_cols = reader.shape
    step = max(1, tile_bytes // (4 * n_rows))
    slab = np.empty((max(1, min(n_rows, tile_bytes // (16 * n_cols))), n_cols), dtype=reader.dtype)
    for q0, q1 in tiles(len(columns), step):
        block, wanted = np.empty((q1 - q0, n_rows), dtype=reader.dtype), np.asarray(columns[q0:q1], dtype=np.int64)
        for r0, r1 in tiles(n_rows, len(slab)):
            row_kernels.gather_transposed(reader(r0, r1, into=slab).numpy(), wanted, block, r0)
        yield block


def order_dtype(n_items: int) -> np.dtype:
    """The narrowest dtype for a row order's column indices: uint16 up to 65,536 items (COCO, Flickr)."""
    return np.dtype(np.uint16) if n_items <= 1 << 16 else np.dtype(np.int32)


def _write_blocks(path: Path, shape: tuple[int, int], blocks: Iterator[torch.Tensor | np.ndarray],
                  dtype: np.dtype = SCORE_DTYPE) -> str:
    """Write the .npy from its row blocks; return its CRC-32 (computed on the way out)."""
    with path.open("wb") as raw:
        fh = Crc32Writer(raw)
        np.lib.format.write_array_header_1_0(fh, {"descr": dtype.str, "fortran_order": False, "shape": shape})
        written = 0
        for block in blocks:
            block = block if isinstance(block, np.ndarray) else block.cpu().numpy()  # a torch tensor
            fh.write(memoryview(np.ascontiguousarray(block, dtype=dtype)).cast("B"))  # no copy when already so
            written += block.shape[0]
        if written != shape[0]:
            raise RuntimeError(f"{path.name}: wrote {written} rows, expected {shape[0]}")
    return fh.hex


def _save_matrix(path: Path, shape: tuple[int, int], blocks: Iterator, dtype: np.dtype = SCORE_DTYPE) -> dict:
    """Write a matrix from its row blocks, atomically; its entry in meta.json (size and CRC-32)."""
    crc = []
    atomic_save(path, lambda tmp: crc.append(_write_blocks(tmp, shape, blocks, dtype)))
    remember_checksum(path, "crc32", crc[0])  # computed from the bytes written: not read back
    return {"bytes": path.stat().st_size, "crc32": crc[0]}


@STORES.register
class ScoreStore(Store):
    folder, name, kind, format, what = "scores", "score store", "scores", FORMAT, "the score matrices"
    order = 2

    def get_or_compute(self, material: dict, shapes: dict[str, tuple[int, int]],
                       t2i_blocks: Callable[[], Iterator[torch.Tensor]], query_images: np.ndarray, tile_bytes: int,
                       info: dict | None = None) -> tuple[dict[str, StoredRows], bool]:
        """Readers of both matrices, and whether they were already stored. When they must be computed,
        ``t2i_blocks()`` yields the t2i matrix's row blocks in order, and the i2t matrix is its transpose for
        the columns ``query_images`` (the images with captions), built in blocks of about ``tile_bytes``."""
        material = {**material, "kind": "scores", "format": FORMAT}
        with self.locked(material) as (key, folder):
            readers = self.read(folder, key, material, lambda meta: _checked_readers(folder, meta, shapes))
            if readers is not None:
                return readers, True

            def save(folder: Path) -> dict:
                files = {"t2i": _save_matrix(folder / "t2i.npy", shapes["t2i"], t2i_blocks())}
                t2i = StoredRows(folder / "t2i.npy")
                files["i2t"] = _save_matrix(folder / "i2t.npy", shapes["i2t"],
                                            transposed_rows(t2i, query_images, tile_bytes))
                return {"files": files, "shapes": {d: list(shapes[d]) for d in DIRECTIONS}}

            self.write(folder, key, material, info or {}, save)  # an OSError fails the job: no matrices without it
            return {d: StoredRows(folder / f"{d}.npy") for d in DIRECTIONS}, False

    def row_orders(self, reader: StoredRows, tile_bytes: int) -> StoredRows:
        """The order of every row of a stored score matrix (column indices best first, ties by index), sorted
        once when a job first needs it (RRF by source object over whole rankings) and stored in the same
        entry as ``{direction}_order.npy``."""
        from fusebench.search import row_kernels  # lazy: heavy (numpy, numba)

        dtype = order_dtype(reader.shape[1])
        return self._derived(reader, "order", lambda block: row_kernels.row_order(block, dtype), reader.shape, dtype,
                             4 + dtype.itemsize, tile_bytes)

    def row_moments(self, reader: StoredRows, ddof: int, tile_bytes: int) -> StoredRows:
        """Every row's mean and standard deviation (``ddof``) as DBSF and z-score use them (float64 sums rounded
        once to float32: the very values ``row_kernels.row_mean_std`` gives), computed once when a job first needs
        them and stored as ``{direction}_moments_ddof{ddof}.npy`` (rows x 2)."""
        from fusebench.search import row_kernels  # lazy: heavy (numpy, numba)

        return self._derived(reader, f"moments_ddof{ddof}",
                             lambda block: np.stack(row_kernels.row_mean_std(block, ddof), axis=1),
                             (reader.shape[0], 2), SCORE_DTYPE, 4, tile_bytes)

    def _derived(self, reader: StoredRows, what: str, compute: Callable[[np.ndarray], np.ndarray],
                 shape: tuple[int, int], dtype: np.dtype, bytes_per_entry: int, tile_bytes: int) -> StoredRows:
        """A matrix derived row by row from a stored score matrix, computed once and stored in the same entry
        (``{direction}_{what}.npy``, with its size and CRC-32 in meta.json): verified once per process,
        computed again when damaged. ``tile_bytes`` bounds the memory of the computation (rows at a time)."""
        from fusebench.search.model_lists import tiles  # lazy: heavy (torch, numpy, numba)

        folder, name = reader.path.parent, f"{reader.path.stem}_{what}"
        path = folder / f"{name}.npy"
        with entry_lock(folder, "score store"):
            meta = read_meta(folder / "meta.json")
            recorded = meta["files"].get(name)
            if recorded is not None:
                problem = data_file_problem(path, recorded, once_per_process=True)
                if problem is None:
                    return StoredRows(path)
                log.warning("score store: %s is damaged (%s); computing it again", path, problem)
            clear_non_file(path, None if recorded is not None else "score store")  # a directory there: no write could succeed
            step = max(1, tile_bytes // (bytes_per_entry * reader.shape[1]))
            blocks = (compute(reader(r0, r1).numpy()) for r0, r1 in tiles(reader.shape[0], step))
            meta["files"][name] = _save_matrix(path, shape, blocks, dtype)
            atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))
        return StoredRows(path)

    def describe(self, meta: dict) -> dict:
        return {**super().describe(meta), "shape": (meta.get("shapes") or {}).get("t2i")}

    def data_files(self, meta: dict) -> dict[str, dict]:
        return {f"{name}.npy": file for name, file in meta["files"].items()}


def _checked_readers(folder: Path, meta: dict, shapes: dict[str, tuple[int, int]]
                     ) -> tuple[dict[str, StoredRows] | None, str | None]:
    """Readers of the entry's two matrices when both files are intact (verified once per process) and of
    ``shapes``."""
    readers = {}
    for d in DIRECTIONS:
        path = folder / f"{d}.npy"
        problem = data_file_problem(path, meta["files"][d], once_per_process=True)
        if problem is not None:
            return None, problem
        readers[d] = StoredRows(path)
        if tuple(readers[d].shape) != tuple(shapes[d]):
            return None, f"{d}.npy has shape {readers[d].shape}, expected {shapes[d]}"
    return readers, None
