"""Ranks, recall and paired comparisons from arrays: the evaluation code a run records its metrics with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fusebench import DIRECTIONS, FusebenchError
from fusebench.config.schema import BootstrapConfig
from fusebench.evaluation.comparisons import compare as compare_ranks
from fusebench.evaluation.metrics import recall_at_k
from fusebench.evaluation.record import Comparison
from fusebench.library import inputs
from fusebench.library.ranking import Lists, _list_ranks
from fusebench.runtime import checks
from fusebench.search.exact import column_target_ranks, target_ranks

_DEFAULTS = BootstrapConfig()  # the run's defaults (eval.bootstrap)


def ranks(lists_or_scores, caption_image, direction: str = "t2i"):
    """Each query's 1-based rank of its first positive (0: not in its list), from ``caption_image`` (texts,): the
    image each text describes (t2i: that image is the positive; i2t: the queries are the images that have a text,
    in index order, and any of their texts is a positive). ``lists_or_scores``: a :class:`Lists` or an ids array
    (rank within the list, as a fused retriever's), a score matrix (exact rank in the whole ranking, ties to the
    smaller index: t2i (texts, images), i2t (images, texts), every image's row), or a mapping of directions to
    either (then a mapping of ranks)."""
    if isinstance(lists_or_scores, Mapping):
        return {d: ranks(v, caption_image, d) for d, v in lists_or_scores.items()}
    direction = checks.choice(direction, "direction", DIRECTIONS)
    truth = inputs.caption_image(caption_image)
    values = lists_or_scores.ids if isinstance(lists_or_scores, Lists) else np.asarray(lists_or_scores)
    values = np.asarray(values)
    if values.ndim != 2:
        raise FusebenchError(f"lists_or_scores must be Lists, an ids array or a score matrix (2-D); got shape "
                             f"{values.shape}.")
    if isinstance(lists_or_scores, Lists) or np.issubdtype(values.dtype, np.integer):
        queries = len(truth) if direction == "t2i" else len(np.unique(truth))
        ids = inputs.integer_array(values, "lists_or_scores (ids)", 2, -1)
        if len(ids) != queries:
            raise FusebenchError(f"lists_or_scores holds the lists of {len(ids)} queries; valid: one per {direction} "
                                 f"query ({queries}: {'the texts' if direction == 't2i' else 'the images with a text'}).")
        return _list_ranks(torch.as_tensor(ids), direction, truth)
    if not np.issubdtype(values.dtype, np.floating):
        raise FusebenchError(f"lists_or_scores must be integer ids or float scores; got dtype {values.dtype}.")
    inputs.finite_scores(values, "lists_or_scores")
    scores = torch.as_tensor(np.ascontiguousarray(values, dtype=np.float32))
    cap_img = torch.as_tensor(truth)
    if direction == "t2i":
        if scores.shape[0] != len(truth) or truth.max(initial=-1) >= scores.shape[1]:
            raise FusebenchError(f"a t2i score matrix holds one row per text ({len(truth)}) and one column per image; "
                                 f"got shape {tuple(scores.shape)}.")
        return target_ranks(scores, cap_img).numpy()
    if scores.shape[1] != len(truth) or truth.max(initial=-1) >= scores.shape[0]:
        raise FusebenchError(f"an i2t score matrix holds one row per image and one column per text ({len(truth)}); "
                             f"got shape {tuple(scores.shape)}.")
    query_images = torch.unique(cap_img)
    return column_target_ranks(scores[query_images].T, cap_img, query_images).numpy()


def recall(ranks, ks: Sequence[int] = (1, 5, 10)) -> dict[int, float]:
    """Recall@k in percent (the queries whose first positive ranks within k) for each ``k``, as metrics.json's."""
    values = inputs.ranks(ranks, "ranks")
    return {k: recall_at_k(values, k) for k in inputs.ks(ks)}


def compare(ranks_a, ranks_b, k: int = 1, *, draws: int = _DEFAULTS.draws, level: float = _DEFAULTS.level,
            seed: int = _DEFAULTS.seed, clusters=None, direction: str = "t2i", names: tuple[str, str] = ("a", "b")
            ) -> Comparison:
    """Retriever a against retriever b on the same queries at recall@``k``, as a run compares fusion with each
    model: ``gain`` (points of recall, a minus b), ``ci_low``/``ci_high`` (the paired bootstrap's interval over
    queries, ``draws`` and ``level``, from ``seed``), ``cluster_ci_low``/``cluster_ci_high`` (over ``clusters``,
    each query's group: a run passes the image each query is about; None: every query its own), ``wins`` and
    ``losses`` (queries only one finds), ``p_value`` (McNemar's exact test)."""
    a, b = inputs.ranks(ranks_a, "ranks_a"), inputs.ranks(ranks_b, "ranks_b")
    if a.shape != b.shape:
        raise FusebenchError(f"ranks_a and ranks_b must be 1-D arrays over the same queries; got shapes {a.shape} and "
                             f"{b.shape}.")
    k = checks.integer(inputs.plain(k), "k", 1, "the recall cut-off")
    names = inputs.names(names)
    groups = np.arange(a.size) if clusters is None else np.asarray(clusters)
    if groups.shape != a.shape:
        raise FusebenchError(f"clusters must hold one group per query ({a.size}); got shape {groups.shape}.")
    direction = checks.choice(direction, "direction", DIRECTIONS)
    BootstrapConfig(draws=draws, seed=seed, level=level)  # the run's checks of eval.bootstrap
    (row,) = compare_ranks(names[0], names[1], {direction: a}, {direction: b}, {direction: groups}, [k],
                           draws, level, seed, directions=(direction,))
    return row
