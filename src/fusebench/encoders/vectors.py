"""Model kind ``vectors``: embeddings the user already has, as .npy files in manifest order."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fusebench import FusebenchError


def _load_npy(path_value, key: str, name: str) -> tuple[np.ndarray, str]:
    if not path_value:
        raise FusebenchError(f"models.{name}.{key} is not set; kind 'vectors' needs image_embeddings and text_embeddings (.npy files).")
    path = Path(str(path_value)).expanduser()
    if not path.is_file():
        raise FusebenchError(f"models.{name}.{key}: file not found: {path}")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as err:
        raise FusebenchError(f"models.{name}.{key}: {path} is not a readable .npy array ({err}).") from None
    return array, str(path)


def vector_arrays(name: str, spec: Mapping) -> tuple[np.ndarray, np.ndarray, str, str]:
    """(image rows, text rows, image file, text file); checked against the corpus by the caller."""
    image, image_src = _load_npy(spec.get("image_embeddings"), "image_embeddings", name)
    text, text_src = _load_npy(spec.get("text_embeddings"), "text_embeddings", name)
    return image, text, image_src, text_src
