"""Model kind ``vectors``: embeddings the user already has, as .npy files in manifest order."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.cache import UNREADABLE

NPY_MAGIC = b"\x93NUMPY"


def _load_npy(path_value, key: str, name: str) -> tuple[np.ndarray, str]:
    if not path_value:
        raise FusebenchError(f"models.{name}.{key} is not set; kind 'vectors' needs image_embeddings and text_embeddings (.npy files).")
    path = Path(str(path_value)).expanduser()
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


def vector_arrays(name: str, spec: Mapping) -> tuple[np.ndarray, np.ndarray, str, str]:
    """(image rows, text rows, image file, text file); checked against the corpus by the caller."""
    image, image_src = _load_npy(spec.get("image_embeddings"), "image_embeddings", name)
    text, text_src = _load_npy(spec.get("text_embeddings"), "text_embeddings", name)
    return image, text, image_src, text_src
