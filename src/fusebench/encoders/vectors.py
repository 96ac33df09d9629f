"""Model kind ``vectors``: embeddings the user already has, as .npy files in manifest order.

A manifest's caption-less lines are a gallery's distractors (:func:`fusebench.app.gallery_stage.manifest_split`):
:class:`ManifestRows` reads their rows of a model's image .npy a tile at a time, as a clip-retrieval dump is read
(``vector_dumps.read_sorted_rows``: never whole, never mapped), normalised and checked as the test rows are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.data.input_files import not_a_directory
from fusebench.encoders.base import _check_shape
from fusebench.encoders.rownorm import l2_normalise_rows
from fusebench.encoders.vector_dumps import read_sorted_rows
from fusebench.stores.entries import UNREADABLE
from fusebench.stores.files import array_digest, remembered_checksum

NPY_MAGIC = b"\x93NUMPY"


def _load_npy(path_value: str, key: str, name: str) -> tuple[np.ndarray, str]:
    path = Path(path_value).expanduser()
    not_a_directory(path, f"models.{name}.{key}", "a .npy file written by numpy.save")
    if not path.is_file():
        raise FusebenchError(f"models.{name}.{key}: file not found: {path}")
    problem = npy_problem(path)
    if problem is None:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except UNREADABLE as err:
            problem = f"is not a readable .npy array ({type(err).__name__}: {err})"
    if problem:
        raise FusebenchError(f"models.{name}.{key}: {path} {problem}; write the rows with numpy.save "
                             "(a 2-D float array, one row per image or caption in manifest order).")
    return array, str(path)


def npy_problem(path: Path) -> str | None:
    """What makes ``path`` plainly not a .npy file (empty, no NumPy header), before numpy reads it."""
    with path.open("rb") as fh:
        head = fh.read(6)
    if not head:
        return "is empty (0 bytes)"
    if head != NPY_MAGIC:
        return "is not a .npy file (it does not start with NumPy's header)"
    return None


def vector_arrays(name: str, image_embeddings: str, text_embeddings: str, counts: tuple[int, int] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, str, str]:
    """Model ``name``'s (image rows, text rows, image file, text file) from its two .npy files, memory-mapped:
    nothing but the files' headers is read here. The headers are checked against each other (the same width)
    and, given the corpus's ``counts`` (images, captions), against it (rows, 2-D, numeric), so a wrong file
    fails before its rows are read; the rows themselves are checked by the caller (``check_embeddings``)."""
    image, image_src = _load_npy(image_embeddings, "image_embeddings", name)
    text, text_src = _load_npy(text_embeddings, "text_embeddings", name)
    if counts is not None:
        _check_shape(image, counts[0], "image embeddings", image_src, "images")
        _check_shape(text, counts[1], "text embeddings", text_src, "captions")
    if image.ndim == text.ndim == 2 and image.shape[1] != text.shape[1]:
        raise FusebenchError(
            f"model {name!r}: image embeddings have dimension {image.shape[1]} ({image_src}, models.{name}."
            f"image_embeddings) but text embeddings have {text.shape[1]} ({text_src}, models.{name}.text_embeddings), "
            "as the .npy headers say; both must come from the same model's shared space.")
    return image, text, image_src, text_src


def checked_rows(raw: np.ndarray, rows: np.ndarray, source: str) -> np.ndarray:
    """``raw`` (rows ``rows`` of the image .npy ``source``) L2-normalised as float32 exactly as
    :func:`fusebench.encoders.base.check_matrix` normalises them; a NaN, inf or zero row is its one-line error,
    naming the row of the .npy (the manifest's image index)."""
    out, norms, finite = l2_normalise_rows(raw)
    if not finite.all():
        row = int(rows[np.flatnonzero(~finite)[0]])
        raise FusebenchError(f"{source}: image embeddings row {row} contains NaN or inf; every embedding must be "
                             "finite.")
    if (norms == 0).any():
        row = int(rows[np.flatnonzero(norms == 0)[0]])
        raise FusebenchError(f"{source}: image embeddings row {row} is all zeros; a zero vector has no direction, so "
                             "its cosine similarity is undefined.")
    return out


class ManifestRows:
    """The rows ``rows`` (ascending manifest image indices: its caption-less lines) of the image .npy at ``path``,
    as distractor rows (:class:`fusebench.encoders.distractors.DistractorRows`). Its ``key`` is the file's full
    SHA-256 (hashed once per process for an unchanged file), its dtype and shape, and the rows taken."""

    def __init__(self, path: str | Path, rows: np.ndarray):
        self.path, self.rows = Path(path), np.asarray(rows, dtype=np.int64)
        with self.path.open("rb") as fh:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            self.shape, self.fortran, self.dtype = read(fh)
            self.offset = fh.tell()
        self.n, self.dim = int(self.rows.size), int(self.shape[1])
        self._key: dict | None = None

    @property
    def key(self) -> dict:
        if self._key is None:
            self._key = {"kind": "manifest npy rows", "sha256": remembered_checksum(self.path, "sha256"),
                         "dtype": self.dtype.str, "shape": list(self.shape), "fortran": bool(self.fortran),
                         "n": self.n, "rows_sha256": array_digest(self.rows)}
        return self._key

    def raw(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of those taken, as the file holds them."""
        positions = self.rows[start:stop]
        if self.fortran:  # rare: a column-major file's rows are not contiguous; the mapped rows, copied
            return np.array(np.load(self.path, mmap_mode="r", allow_pickle=False)[positions])

        return read_sorted_rows(self.path, self.offset, self.dim, self.dtype, positions)

    def read(self, start: int, stop: int) -> np.ndarray:
        return checked_rows(self.raw(start, stop), self.rows[start:stop], str(self.path))
