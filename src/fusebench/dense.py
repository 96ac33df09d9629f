"""Fusion over whole rankings (``fusion.top_k: null``) in bounded memory, one block of queries at a time.

With every item in every model's list, fusion is a dense operation on a block of score rows: each model's
row is normalised over all items (RRF by each item's full rank), weighted, then added per item
(``source_object``) or kept as separate entries (``document``). The result is what the list path gives
on full lists, including its tie rule: fused score descending, then first appearance reading the lists
model by model, each from rank 1 (for ``source_object`` with full lists that is model 0's order; for
``document``, the model, then the entry's rank in it). Only the first ``keep`` entries of each fused list
are materialised; the rank of the first correct entry is counted exactly over the whole fused ranking
(0 when it falls beyond ``final_k``). Rows per block are chosen so that a block stays under a fixed
number of bytes, whatever the corpus size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fusebench.fusion import EVIDENCE, FusionConfig, FusedLists
from fusebench.lists import full_rows, tiles
from fusebench.search import descending_keys, sort_desc_with_tiebreak, sort_rows, topk_stable


@dataclass
class DenseSide:
    """One direction for the dense path: per model, query and item embeddings on the device, and which
    items are correct for each query (t2i: the caption's image; i2t: the image's captions)."""

    queries: list[torch.Tensor]
    items: list[torch.Tensor]
    query_owner: torch.Tensor  # (nq,) the image each query is about
    item_owner: torch.Tensor  # (N,) the image each item is (t2i: arange) or describes (i2t: caption_image)


def full_ranks(scores: torch.Tensor) -> torch.Tensor:
    """1-based rank of every entry of each row under the stable descending order (int64)."""
    keys = torch.arange(scores.shape[1], device=scores.device).expand_as(scores)
    order = sort_rows(descending_keys(scores, keys)) & 0xFFFFFFFF
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(1, scores.shape[1] + 1, device=scores.device).expand_as(order).contiguous())
    return ranks


def first_correct(scores: torch.Tensor, tiebreak: torch.Tensor | None, correct: torch.Tensor):
    """Per row, the correct entry that comes first under (score desc, tiebreak desc, index asc):
    (its score, its tiebreak value, its index)."""
    neg = torch.tensor(float("-inf"), device=scores.device)
    best = torch.where(correct, scores, neg).amax(dim=1, keepdim=True)
    chosen = correct & (scores == best)
    if tiebreak is not None:
        best_tb = torch.where(chosen, tiebreak, neg).amax(dim=1, keepdim=True)
        chosen &= tiebreak == best_tb
    else:
        best_tb = None
    cols = torch.arange(scores.shape[1], device=scores.device)
    index = torch.where(chosen, cols, scores.shape[1]).amin(dim=1, keepdim=True)
    return best, best_tb, index


def count_ahead(scores: torch.Tensor, tiebreak: torch.Tensor | None, best, best_tb, index) -> torch.Tensor:
    """Entries of each row that come before (best, best_tb, index) under (score desc, tiebreak desc, index asc)."""
    cols = torch.arange(scores.shape[1], device=scores.device)
    tied = scores == best
    later = cols < index
    if tiebreak is not None:
        later = (tiebreak > best_tb) | ((tiebreak == best_tb) & later)
    return ((scores > best) | (tied & later)).sum(dim=1)


def _model_evidence(scores: torch.Tensor, method: str, weight: float, config: FusionConfig):
    """Each item's weighted evidence over the whole row, and the item ranks when RRF needed them."""
    if method == "rrf":
        ranks = full_ranks(scores)
        return (1.0 / (config.rrf_k + ranks.to(torch.float32))) * weight, ranks
    valid = torch.ones_like(scores, dtype=torch.bool)
    return EVIDENCE[method](scores, valid, rrf_k=config.rrf_k, ddof=config.ddof) * weight, None


def _source_object_block(scores, evidence, model0_ranks, correct, keep, n_models):
    fused = evidence[0].clone()
    for extra in evidence[1:]:
        fused += extra
    # ties: first appearance = position in model 0's full list, i.e. model 0's score desc, then index asc
    best, best_s0, index = first_correct(fused, scores[0], correct)
    ranks = 1 + count_ahead(fused, scores[0], best, best_s0, index)
    values, ids = topk_stable(fused, min(keep + 1, fused.shape[1]))
    tie_rows = torch.nonzero((values[:, 1:] == values[:, :-1]).any(dim=1)).flatten()
    values, ids = values[:, :keep].clone(), ids[:, :keep].clone()
    if tie_rows.numel():
        sub_ranks = model0_ranks[tie_rows] if model0_ranks is not None else full_ranks(scores[0][tie_rows])
        sub_values, position = sort_desc_with_tiebreak(fused[tie_rows], sub_ranks - 1)
        order = torch.empty_like(sub_ranks)
        order.scatter_(1, sub_ranks - 1, torch.arange(fused.shape[1], device=fused.device).expand_as(sub_ranks).contiguous())
        values[tie_rows] = sub_values[:, :keep]
        ids[tie_rows] = order.gather(1, position[:, :keep])
    contributors = torch.full_like(ids, (1 << n_models) - 1)
    return FusedLists(ids, values, contributors), ranks


def _document_block(scores, evidence, correct, keep):
    n_models, n_items = len(scores), scores[0].shape[1]
    # each model's first correct item (by its own order) and that entry's evidence
    chosen = []
    for m in range(n_models):
        s_best, _, index = first_correct(scores[m], None, correct)
        rank = 1 + count_ahead(scores[m], None, s_best, None, index)
        chosen.append((s_best, index, rank, evidence[m].gather(1, index.clamp(max=n_items - 1))))
    e_best = torch.stack([c[3][:, 0] for c in chosen], dim=1)  # (B, M)
    winner = torch.argmax(e_best, dim=1)  # first maximum: the lowest model wins ties (earlier position)
    e_star = e_best.gather(1, winner[:, None])
    ahead = torch.zeros(e_star.shape[0], dtype=torch.int64, device=e_star.device)
    for m in range(n_models):
        greater = (evidence[m] > e_star).sum(dim=1)
        equal = evidence[m] == e_star
        s_best, index, _, _ = chosen[m]
        before_in_m = equal & ((scores[m] > s_best) | ((scores[m] == s_best) & (torch.arange(n_items, device=e_star.device) < index)))
        ahead += greater + torch.where(winner > m, equal.sum(dim=1),
                                       torch.where(winner == m, before_in_m.sum(dim=1), 0))
    ranks = 1 + ahead
    # the fused list's head: a merge of each model's own top-keep entries (evidence is monotone in score)
    ids, values, bits = [], [], []
    for m in range(n_models):
        _, top = topk_stable(scores[m], min(keep, n_items))
        ids.append(top)
        values.append(evidence[m].gather(1, top))
        bits.append(torch.full_like(top, 1 << m))
    all_ids, all_values, all_bits = torch.cat(ids, 1), torch.cat(values, 1), torch.cat(bits, 1)
    out_values, position = sort_desc_with_tiebreak(all_values)
    position = position[:, :keep]
    return FusedLists(all_ids.gather(1, position), out_values[:, :keep], all_bits.gather(1, position)), ranks


def dense_fuse(side: DenseSide, weights: list[float], config: FusionConfig, keep: int, final_k: int,
               budget_bytes: int, item_chunk: int,
               progress: Callable[[int], None] | None = None) -> tuple[FusedLists, np.ndarray]:
    """Fused lists (first ``keep`` entries) and exact ranks of the first correct entry for every query."""
    n_models, n_queries, n_items = len(side.items), side.queries[0].shape[0], side.items[0].shape[0]
    per_row = n_items * (n_models * (24 if config.method == "rrf" else 8) + 16)
    block = max(1, min(n_queries, budget_bytes // per_row))
    keep = min(keep, final_k)
    outs, ranks = [], []
    for r0, r1 in tiles(n_queries, block):
        rows = slice(r0, r1)
        correct = side.item_owner[None, :] == side.query_owner[rows, None]
        scores, evidence, model_ranks = [], [], []
        for m in range(n_models):
            s = full_rows(side.queries[m][rows], side.items[m], item_chunk,
                          torch.empty(r1 - r0, n_items, device=side.items[m].device))
            e, r = _model_evidence(s, config.method, weights[m], config)
            scores.append(s)
            evidence.append(e)
            model_ranks.append(r)
        if config.fuse_on == "source_object":
            fused, block_ranks = _source_object_block(scores, evidence, model_ranks[0], correct, keep, n_models)
        else:
            fused, block_ranks = _document_block(scores, evidence, correct, keep)
        block_ranks = torch.where(block_ranks <= final_k, block_ranks, 0)
        outs.append(FusedLists(fused.ids.cpu(), fused.scores.cpu(), fused.contributors.cpu()))
        ranks.append(block_ranks.cpu().numpy())
        if progress is not None:
            progress(r1 - r0)
    fused = FusedLists(*(torch.cat([getattr(o, f) for o in outs]) for f in ("ids", "scores", "contributors")))
    return fused, np.concatenate(ranks).astype(np.int64)

