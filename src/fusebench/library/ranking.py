"""Ranked lists from arrays: exact search (``search/``, as a run's list pass) and fusion of lists the caller
holds (``fusion/combine``, as a run's fused retriever with ``fusion.top_k`` set). Nothing is stored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from fusebench import DIRECTIONS, FusebenchError
from fusebench.encoders.base import check_matrix
from fusebench.encoders.devices import resolve_device
from fusebench.fusion import methods as registry
from fusebench.fusion.combine import fuse_in_blocks
from fusebench.fusion.config import FusionConfig, moved_keys
from fusebench.library import inputs
from fusebench.runtime import checks
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


def search(texts, images, k: int, caption_image=None, *, device: str = "cpu", chunk_size: int = 4096,
           item_chunk_size: int = 16384) -> dict[str, Lists]:
    """Each text's top ``k`` images (``t2i``) and each image's top ``k`` texts (``i2t``) by cosine similarity,
    exact, as a run searches one model (rows L2-normalised by the run's check, then the tiled pass of
    :func:`~fusebench.search.model_lists.compute_model_lists`; ``chunk_size``, ``item_chunk_size``: the tile, as
    ``eval.chunk_size`` and ``eval.item_chunk_size``). ``caption_image`` (texts,): the image each text describes;
    given, the i2t queries are the images that have a text and every list carries exact ranks (in the whole
    ranking, as ranks/ holds them); else i2t covers every image (a second pass, images as queries) with no ranks."""
    k = checks.integer(inputs.plain(k), "k", 1, "the list length")
    tiles = {"device": resolve_device(str(device) if isinstance(device, torch.device) else device, "device"),
             "chunk_size": checks.integer(inputs.plain(chunk_size), "chunk_size", 1, "texts per tile"),
             "item_chunk_size": checks.integer(inputs.plain(item_chunk_size), "item_chunk_size", 1, "items per tile")}
    texts, images = inputs.rows(texts, "texts"), inputs.rows(images, "images")
    texts = check_matrix(texts, texts.shape[0], "text rows", "texts", "texts")
    images = check_matrix(images, images.shape[0], "image rows", "images", "images")
    if texts.shape[1] != images.shape[1]:
        raise FusebenchError(f"texts have {texts.shape[1]} dims and images {images.shape[1]}: both must come from one "
                             "model's shared space.")
    truth = None if caption_image is None else inputs.caption_image(caption_image, len(texts), len(images))
    if truth is not None:
        found = compute_model_lists(texts, images, truth, k, **tiles)
        return {d: Lists.of(found[d]) for d in DIRECTIONS}
    none = np.empty(0, dtype=np.int64)  # no positives: no i2t queries in the pass, no ranks
    t2i = compute_model_lists(texts, images, none, k, ranks=False, **tiles)["t2i"]
    i2t = compute_model_lists(images, texts, none, k, ranks=False, **tiles)["t2i"]
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


def _checked_lists(names: list[str], entries: list[dict[str, Lists]], n_items: dict[str, int], caption_image
                   ) -> np.ndarray | None:
    """Every model's lists by :func:`inputs.list_arrays`, the same queries in a direction across models, and
    ``caption_image`` (one image per t2i query; i2t: one query per image it names); the latter as an array."""
    for d in entries[0]:
        for name, entry in zip(names, entries):
            inputs.list_arrays(entry[d].ids, entry[d].scores, f"lists[{name!r}][{d!r}]", n_items.get(d))
        counts = {name: len(entry[d].ids) for name, entry in zip(names, entries)}
        if len(set(counts.values())) > 1:
            raise FusebenchError(f"lists: the models' {d} lists hold different numbers of queries: {counts}.")
    if caption_image is None:
        return None
    queries = {d: len(entries[0][d].ids) for d in entries[0]}
    truth = inputs.caption_image(caption_image, queries.get("t2i"), n_items.get("t2i"))
    if "i2t" in queries and queries["i2t"] != len(np.unique(truth)):
        raise FusebenchError(f"caption_image names {len(np.unique(truth))} images, but the i2t lists hold "
                             f"{queries['i2t']} queries (one per image that has a text).")
    return truth


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
    n_items = inputs.n_items(n_items, list(entries[0]))
    config = fusion_config(method, fuse_on, top_k, final_top_k, settings)
    weights = inputs.weights(weights, names)
    caption_image = _checked_lists(names, entries, n_items, caption_image)
    out = {}
    for d in entries[0]:
        per_model = [e[d] for e in entries]
        widths = {np.asarray(p.ids).shape[1] for p in per_model}
        k = min(widths) if top_k is None else min(top_k, min(widths))
        ids = [torch.as_tensor(np.asarray(p.ids)[:, :k], dtype=torch.int64).clone() for p in per_model]
        scores = [torch.as_tensor(np.asarray(p.scores)[:, :k], dtype=torch.float32).clone() for p in per_model]
        wanted = final_top_k if final_top_k is not None else top_k
        available = len(ids) * k if fuse_on == "document" else n_items.get(d, sum(t.shape[1] for t in ids))
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
