"""Ranked lists from arrays: exact search (``search/``, as a run's list pass) and fusion of lists the caller
holds (``fusion/combine``, as a run's fused retriever with ``fusion.top_k`` set). Nothing is stored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from fusebench import DIRECTIONS, FusebenchError
from fusebench.encoders.base import check_matrix
from fusebench.fusion import methods as registry
from fusebench.fusion.combine import fuse_in_blocks
from fusebench.fusion.config import FusionConfig, moved_keys
from fusebench.search.model_lists import compute_model_lists
from fusebench.search.ranked import RankedLists, i2t_list_ranks, t2i_list_ranks


@dataclass(frozen=True)
class Lists:
    """One retriever's ranked lists in one direction, as plain arrays: ``ids`` (queries, L) item indices best
    first (-1 padding), ``scores`` (queries, L) float32 (-inf padding), ``ranks`` (queries,) the 1-based rank of
    each query's first positive (0: missed; None: no positives given), ``contributors`` (fused lists) the bitmask of
    the models whose lists hold each entry. t2i queries are the texts; i2t queries the images that have a caption
    (every image when no ``caption_image`` is given), in index order: a run's topk/ and ranks/ files hold the same."""

    ids: np.ndarray
    scores: np.ndarray
    ranks: np.ndarray | None = None
    contributors: np.ndarray | None = None

    @classmethod
    def of(cls, ranked: RankedLists) -> Lists:
        arrays = {f.name: getattr(ranked, f.name) for f in fields(cls)}
        return cls(**{k: None if v is None else np.asarray(v.numpy() if torch.is_tensor(v) else v)
                      for k, v in arrays.items()})


def _caption_image(caption_image, n_texts: int, n_images: int | None) -> np.ndarray | None:
    if caption_image is None:
        return None
    array = np.asarray(caption_image)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer) or len(array) != n_texts:
        raise FusebenchError(f"caption_image must be a 1-D integer array, one image index per text ({n_texts}); got "
                             f"shape {array.shape}, dtype {array.dtype}.")
    if n_images is not None and len(array) and (array.min() < 0 or array.max() >= n_images):
        raise FusebenchError(f"caption_image holds {int(array.min())}..{int(array.max())}, outside the images' "
                             f"indices 0..{n_images - 1}.")
    return array.astype(np.int64)


def search(texts, images, k: int, caption_image=None, *, device: str = "cpu", chunk_size: int = 4096,
           item_chunk_size: int = 16384) -> dict[str, Lists]:
    """Each text's top ``k`` images (``t2i``) and each image's top ``k`` texts (``i2t``) by cosine similarity,
    exact, as a run searches one model (rows L2-normalised by the run's check, then the tiled pass of
    :func:`~fusebench.search.model_lists.compute_model_lists`; ``chunk_size``, ``item_chunk_size``: the tile, as
    ``eval.chunk_size`` and ``eval.item_chunk_size``). ``caption_image`` (texts,): the image each text describes;
    given, the i2t queries are the images that have a text and every list carries exact ranks (in the whole
    ranking, as ranks/ holds them); else i2t covers every image (a second pass, images as queries) with no ranks."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise FusebenchError(f"k={k!r} must be a positive integer (the list length).")
    texts, images = np.asarray(texts), np.asarray(images)
    n_texts = texts.shape[0] if texts.ndim else 0
    n_images = images.shape[0] if images.ndim else 0
    texts = check_matrix(texts, n_texts, "text rows", "texts", "texts")
    images = check_matrix(images, n_images, "image rows", "images", "images")
    if texts.shape[1] != images.shape[1]:
        raise FusebenchError(f"texts have {texts.shape[1]} dims and images {images.shape[1]}: both must come from one "
                             "model's shared space.")
    truth = _caption_image(caption_image, n_texts, n_images)
    tiles = {"device": device, "chunk_size": chunk_size, "item_chunk_size": item_chunk_size}
    if truth is not None:
        found = compute_model_lists(texts, images, truth, int(k), **tiles)
        return {d: Lists.of(found[d]) for d in DIRECTIONS}
    none = np.empty(0, dtype=np.int64)  # no positives: no i2t queries in the pass, no ranks
    t2i = compute_model_lists(texts, images, none, int(k), ranks=False, **tiles)["t2i"]
    i2t = compute_model_lists(images, texts, none, int(k), ranks=False, **tiles)["t2i"]
    return {"t2i": Lists.of(t2i), "i2t": Lists.of(i2t)}


def fusion_config(method: str, fuse_on: str, top_k: int | None, final_top_k: int | None, settings: dict) -> FusionConfig:
    """The typed fusion settings of one :func:`fuse` call: ``settings`` named like ``FusionConfig``'s fields go
    there, any other is the method's own (``fusion.params``); every check of the config group applies."""
    if method == "none":
        raise FusebenchError("method='none' fuses nothing: name a fusion method; valid: "
                             f"{', '.join(registry.names())}.")
    registry.method(method)  # a wrong name: the registry's one message, listing the valid ones
    own = {f.name for f in fields(FusionConfig)} - {"method", "fuse_on", "top_k", "final_top_k", "params", "preset",
                                                     *moved_keys()}  # rrf_k, ddof, rrf_weighting: the method's own
    plain = {key: value for key, value in settings.items() if key in own}
    params = {key: value for key, value in settings.items() if key not in own}
    return FusionConfig(method=method, fuse_on=fuse_on, top_k=top_k, final_top_k=final_top_k, params=params, **plain)


def _by_direction(lists) -> tuple[list[str], list[dict[str, Lists]]]:
    """The models' names and, per model, its lists by direction (a bare :class:`Lists`: direction ``t2i``)."""
    if isinstance(lists, Mapping):
        names, entries = [str(n) for n in lists], list(lists.values())
    elif isinstance(lists, Sequence) and not isinstance(lists, (str, bytes)):
        names, entries = [str(i) for i in range(len(lists))], list(lists)
    else:
        raise FusebenchError(f"lists must map each model to its ranked lists (or be a list of them); got "
                             f"{type(lists).__name__}.")
    if len(entries) < 2:
        raise FusebenchError(f"fusion needs the lists of at least two models; got {len(entries)}.")
    out = []
    for name, entry in zip(names, entries):
        entry = {"t2i": entry} if isinstance(entry, Lists) else entry
        if not isinstance(entry, Mapping) or not entry or not set(entry) <= set(DIRECTIONS) or not all(
                isinstance(v, Lists) for v in entry.values()):
            raise FusebenchError(f"lists[{name!r}] must be a Lists or a mapping of directions ({', '.join(DIRECTIONS)})"
                                 f" to Lists (what fusebench.library.search returns).")
        out.append(dict(entry))
    if any(set(e) != set(out[0]) for e in out):
        raise FusebenchError(f"the models' lists cover different directions: {[sorted(e) for e in out]}.")
    return names, out


def _weights(weights, names: list[str]) -> list[float] | None:
    if weights is None:
        return None
    if isinstance(weights, Mapping):
        unknown = sorted(set(map(str, weights)) - set(names))
        if unknown:
            raise FusebenchError(f"weights names {unknown}, which are not among the lists: {', '.join(names)}.")
        return [float(weights.get(n, 1.0)) for n in names]
    weights = list(weights)
    if len(weights) != len(names):
        raise FusebenchError(f"weights holds {len(weights)} values for {len(names)} models' lists.")
    return [float(w) for w in weights]


def fuse(lists, method: str = "dbsf", *, weights=None, fuse_on: str = "source_object", top_k: int | None = None,
         final_top_k: int | None = None, caption_image=None, n_items: Mapping[str, int] | None = None,
         **settings) -> dict[str, Lists]:
    """The fused lists of several models' ranked lists (``lists``: model name -> what :func:`search` returns, or a
    list of those; a bare :class:`Lists` is one t2i direction), per direction, as a run's fused retriever is made
    with ``fusion.top_k`` set: each model's lists cut to ``top_k`` (None: as given), fused by ``method`` (a
    registered fusion method) with ``weights`` (per model, a list or a name -> weight mapping; None: equal) and
    ``fuse_on``; ``settings``: the config group's other settings (``rrf_k``, ``ddof``, ``combine``, ``ties``, ...)
    and the method's own (``phi`` for rbc), checked by the same rules. The fused list is ``final_top_k`` long
    (None: ``top_k``, or every entry), never longer than ``n_items[direction]`` (the items a direction ranks, as
    the run caps it). ``caption_image``: the image each text describes; given, each fused list carries its ranks."""
    names, entries = _by_direction(lists)
    config = fusion_config(method, fuse_on, top_k, final_top_k, settings)
    weights = _weights(weights, names)
    out = {}
    for d in entries[0]:
        per_model = [e[d] for e in entries]
        widths = {p.ids.shape[1] for p in per_model}
        k = min(widths) if top_k is None else min(top_k, min(widths))
        ids = [torch.as_tensor(np.asarray(p.ids)[:, :k], dtype=torch.int64).clone() for p in per_model]
        scores = [torch.as_tensor(np.asarray(p.scores)[:, :k], dtype=torch.float32).clone() for p in per_model]
        if len({t.shape[0] for t in ids}) > 1:
            raise FusebenchError(f"the models' {d} lists hold different numbers of queries: "
                                 f"{dict(zip(names, (t.shape[0] for t in ids)))}.")
        wanted = final_top_k if final_top_k is not None else top_k
        available = len(ids) * k if fuse_on == "document" else (n_items or {}).get(d, sum(t.shape[1] for t in ids))
        fused = fuse_in_blocks(ids, scores, config, available if wanted is None else min(wanted, available), weights)
        out[d] = Lists.of(fused.with_ranks(_list_ranks(fused.ids, d, caption_image)))
    return out


def _list_ranks(ids: torch.Tensor, direction: str, caption_image) -> np.ndarray | None:
    """Each query's rank of its first positive within its list (0: missed); None without ``caption_image``."""
    if caption_image is None:
        return None
    truth = torch.as_tensor(np.asarray(caption_image, dtype=np.int64))
    if direction == "t2i":
        return t2i_list_ranks(ids, truth)
    return i2t_list_ranks(ids, torch.unique(truth), truth)
