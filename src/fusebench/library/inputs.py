"""The library's argument checks: each argument is read once, at the entry of the function that takes it and
before any work, as a run reads its config (:mod:`fusebench.runtime.checks`): a bad one is one FusebenchError
naming it and what is valid. Plain arrays have no config key, so the key is the argument's name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fusebench import FusebenchError
from fusebench.runtime import checks


def plain(value):
    """A NumPy scalar as the Python number it holds (``np.int64(5)`` is the integer 5 to the checks)."""
    return value.item() if isinstance(value, np.generic) else value


def integer_array(value, key: str, ndim: int, minimum: int) -> np.ndarray:
    """``value`` as an int64 array of ``ndim`` dimensions, every entry at least ``minimum``."""
    array = np.asarray(value)
    if array.ndim != ndim or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise FusebenchError(f"{key} must be a {ndim}-D integer array; got shape {array.shape}, dtype {array.dtype}.")
    array = array.astype(np.int64)
    if array.size and array.min() < minimum:
        raise FusebenchError(f"{key} holds {int(array.min())}; valid: integers >= {minimum}.")
    return array


def caption_image(value, n_texts: int | None = None, n_images: int | None = None,
                  key: str = "caption_image") -> np.ndarray:
    """The image each text describes: a 1-D integer array of image indices, ``n_texts`` long and below
    ``n_images`` when those are known."""
    array = integer_array(value, key, 1, 0)
    if n_texts is not None and len(array) != n_texts:
        raise FusebenchError(f"{key} must hold one image index per text ({n_texts}); got {len(array)}.")
    if n_images is not None and len(array) and array.max() >= n_images:
        raise FusebenchError(f"{key} holds {int(array.min())}..{int(array.max())}, outside the images' indices "
                             f"0..{n_images - 1}.")
    return array


def ranks(value, key: str) -> np.ndarray:
    """One rank per query (1-based; 0: missed), at least one query."""
    array = integer_array(value, key, 1, 0)
    if array.size == 0:
        raise FusebenchError(f"{key} is empty; valid: one rank per query (integers >= 0), at least one.")
    return array


def ks(value, key: str = "ks") -> list[int]:
    """The recall cut-offs: a non-empty list of integers >= 1 (the run's ``eval.ks`` rule)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return checks.integer_list([plain(v) for v in value] if isinstance(value, (list, tuple)) else value, key)


def names(value) -> tuple[str, str]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(isinstance(v, str) and v for v in value):
        raise FusebenchError(f"names={value!r} is not valid; valid: two non-empty strings (retriever a's and b's).")
    return tuple(value)


def finite_scores(matrix: np.ndarray, key: str) -> None:
    """A score matrix holds no NaN or inf (the row named), as a run refuses non-finite embeddings."""
    bad = ~np.isfinite(matrix).all(axis=1)
    if bad.any():
        raise FusebenchError(f"{key} row {int(np.flatnonzero(bad)[0])} contains NaN or inf ({int(bad.sum())} bad rows "
                             "in all); every score must be finite.")


def rows(value, key: str) -> np.ndarray:
    """Embedding rows: a 2-D array of at least one row and one column (what else is valid: the run's check_matrix)."""
    array = np.asarray(value)
    if array.ndim != 2 or 0 in array.shape:
        raise FusebenchError(f"{key} must be a 2-D array of at least one row and one column; got shape {array.shape}.")
    return array


def list_arrays(ids, scores, key: str, n_items: int | None) -> None:
    """One model's ranked lists: ``ids`` (queries, L >= 1) integers in 0..n_items-1 (-1: padding), ``scores`` of the
    same shape, finite wherever the id is not padding, never NaN."""
    ids, scores = np.asarray(ids), np.asarray(scores)
    if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise FusebenchError(f"{key}.ids must be a 2-D integer array (queries, list length >= 1); got shape "
                             f"{ids.shape}, dtype {ids.dtype}.")
    if scores.shape != ids.shape or not np.issubdtype(scores.dtype, np.floating):
        raise FusebenchError(f"{key}.scores must be a float array of the ids' shape {ids.shape}; got shape "
                             f"{scores.shape}, dtype {scores.dtype}.")
    top = n_items if n_items is not None else np.iinfo(np.int64).max
    if ids.min() < -1 or ids.max() >= top:
        valid = f"0..{n_items - 1}" if n_items is not None else "item indices >= 0"
        raise FusebenchError(f"{key}.ids holds {int(ids.min())}..{int(ids.max())}; valid: {valid}, or -1 (padding).")
    if np.isnan(scores).any() or not np.isfinite(scores[ids >= 0]).all():
        raise FusebenchError(f"{key}.scores holds NaN or inf; valid: a finite score per item (-inf only as the "
                             "padding of id -1).")


def n_items(value, directions: Sequence[str]) -> dict[str, int]:
    """The items each direction ranks: None, or a mapping of directions to integers >= 1."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not set(value) <= set(directions):
        raise FusebenchError(f"n_items={value!r} is not valid; valid: None or a mapping of the lists' directions "
                             f"({', '.join(directions)}) to the number of items each ranks.")
    return {d: checks.integer(plain(v), f"n_items[{d!r}]", 1) for d, v in value.items()}


def weights(value, names_: list[str]) -> list[float] | None:
    """The models' weights, each by the run's rule (``checks.weight``), at least one above 0 (``checks.some_weight``);
    None: equal."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = sorted(set(map(str, value)) - set(names_))
        if unknown:
            raise FusebenchError(f"weights names {unknown}, which are not among the lists: {', '.join(names_)}.")
        given = {str(n): plain(w) for n, w in value.items()}
        raw = {f"weights[{n!r}]": given.get(n, 1.0) for n in names_}
    elif isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != len(names_):
            raise FusebenchError(f"weights holds {len(value)} values for {len(names_)} models' lists.")
        raw = {f"weights[{i}]": plain(w) for i, w in enumerate(value)}
    else:
        raise FusebenchError(f"weights={value!r} is not valid; valid: None, a list of one number per model, or a "
                             "mapping of model names to numbers.")
    checked = {key: checks.weight(w, key) for key, w in raw.items()}
    checks.some_weight(checked)
    return list(checked.values())
