"""Model kind ``vectors``: embeddings the user already has, as .npy files in manifest order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.data.input_files import not_a_directory
from fusebench.encoders.base import _check_shape
from fusebench.stores.entries import UNREADABLE

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
