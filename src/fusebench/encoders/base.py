"""What every backend returns, and the checks every embedding passes before evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusebench import FusebenchError


@dataclass
class ModelEmbeddings:
    """L2-normalised float32 embeddings in corpus order: ``image`` (N, d) and ``text`` (Q, d)."""

    name: str
    image: np.ndarray
    text: np.ndarray
    spec: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # real models: cache keys and hits, preprocessing, versions, stats

    @property
    def dim(self) -> int:
        return int(self.image.shape[1])


def _first_bad_row(array: np.ndarray, mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_matrix(array: np.ndarray, rows: int, what: str, source: str, rows_meaning: str) -> np.ndarray:
    """Validate one embedding matrix and return it L2-normalised as float32 (rows are 0-based in messages)."""
    if array.ndim != 2:
        raise FusebenchError(f"{source}: {what} must be a 2-D array (rows x dim), got shape {array.shape}.")
    if array.shape[0] != rows:
        raise FusebenchError(
            f"{source}: {what} has {array.shape[0]} rows but the corpus has {rows} {rows_meaning}; "
            f"rows must follow the manifest order, one per {rows_meaning.rstrip('s')}."
        )
    if array.dtype.kind not in "fiu":
        raise FusebenchError(f"{source}: {what} must be numeric, got dtype {array.dtype}.")
    array = np.asarray(array, dtype=np.float32)
    finite = np.isfinite(array).all(axis=1)
    if not finite.all():
        row = _first_bad_row(array, ~finite)
        raise FusebenchError(
            f"{source}: {what} row {row} contains NaN or inf ({int((~finite).sum())} bad rows in all); "
            "every embedding must be finite."
        )
    norms = np.linalg.norm(array, axis=1)
    zero = norms == 0
    if zero.any():
        row = _first_bad_row(array, zero)
        raise FusebenchError(
            f"{source}: {what} row {row} is all zeros ({int(zero.sum())} zero rows in all); "
            "a zero vector has no direction, so its cosine similarity is undefined."
        )
    return array / norms[:, None].astype(np.float32)


def check_embeddings(name: str, image: np.ndarray, text: np.ndarray, n_images: int, n_captions: int,
                     image_source: str, text_source: str, spec: dict | None = None) -> ModelEmbeddings:
    image = check_matrix(image, n_images, "image embeddings", image_source, "images")
    text = check_matrix(text, n_captions, "text embeddings", text_source, "captions")
    if image.shape[1] != text.shape[1]:
        raise FusebenchError(
            f"model {name!r}: image embeddings have dimension {image.shape[1]} ({image_source}) but text embeddings "
            f"have {text.shape[1]} ({text_source}); both must come from the same model's shared space."
        )
    return ModelEmbeddings(name=name, image=image, text=text, spec=dict(spec or {}))
