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

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from fusebench.fusion import methods as registry
from fusebench.fusion.combine import (
    mean_parts,
    mean_total,
    method_rows,
    plain_evidence,
    weighted_evidence,
)
from fusebench.fusion.config import HOLDER_MEANS, RANK_METHODS, FusionConfig
from fusebench.fusion.normalisers import RowAffine
from fusebench.search import row_kernels, topk_kernels
from fusebench.search.exact import descending_keys, sort_desc_with_tiebreak, sort_rows, topk_stable
from fusebench.search.model_lists import tiles
from fusebench.search.ranked import RankedLists

# (r0, r1, into=None) -> that block of a model's score rows (r1-r0, items); ``into``: a CPU array of at least
# r1-r0 rows to read or compute the block into (a buffer dense_fuse reuses), None: a fresh one
RowBlocks = Callable[..., torch.Tensor]


class RowAux(NamedTuple):
    """What the score store keeps beside a model's block of rows, when a job needs it: each row's order
    (RRF by source object) and each row's (mean, sd) (DBSF, z-score); None: computed from the rows."""

    order: torch.Tensor | None = None
    moments: torch.Tensor | None = None


NOTHING_STORED = RowAux()


@dataclass
class DenseSide:
    """One direction for the dense path: per model, its score rows by block (a stored matrix or a fresh
    similarity), and each query's correct items (t2i: the caption's image; i2t: the image's captions)."""

    rows: list[RowBlocks]
    n_items: int
    correct: torch.Tensor  # (nq, c) int64 item indices, -1 padding; at least one per query
    orders: list[RowBlocks] | None = None  # per model, its rows' stored order (RRF by source object, CPU)
    moments: list[RowBlocks] | None = None  # per model, its rows' stored (mean, sd) (DBSF, z-score; CPU)
    stored: bool = False  # rows are read from the score store: the next block is read while one is fused


def correct_items(caption_image: np.ndarray, query_images: np.ndarray) -> np.ndarray:
    """(query images, most captions of one image) caption indices per i2t query, -1 padded."""
    order = np.argsort(caption_image, kind="stable")
    counts = np.bincount(caption_image, minlength=int(query_images.max()) + 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    group = np.searchsorted(query_images, caption_image[order])
    out = np.full((len(query_images), int(counts.max())), -1, dtype=np.int64)
    out[group, np.arange(len(order)) - starts[caption_image[order]]] = order
    return out


def full_ranks(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the 1-based rank of every entry under the stable descending order, and that order (int64)."""
    if scores.device.type == "cpu":
        ranks, order = row_kernels.stable_ranks(scores.contiguous().numpy())
        return torch.from_numpy(ranks), torch.from_numpy(order)
    keys = torch.arange(scores.shape[1], device=scores.device).expand_as(scores)
    order = sort_rows(descending_keys(scores, keys)) & 0xFFFFFFFF
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(1, scores.shape[1] + 1, device=scores.device).expand_as(order).contiguous())
    return ranks, order


def first_correct(values: torch.Tensor, tiebreak: torch.Tensor | None, correct: torch.Tensor):
    """Per row, the correct entry that comes first under (value desc, tiebreak desc, index asc): its value,
    its tiebreak (0 without one) and its index, each (B,)."""
    real = correct >= 0
    index = correct.clamp(min=0)
    neg = torch.tensor(float("-inf"), device=values.device)
    picked = values.gather(1, index).masked_fill(~real, float("-inf"))
    best = picked.amax(dim=1, keepdim=True)
    chosen = real & (picked == best)
    best_tb = torch.zeros_like(best)
    if tiebreak is not None:
        tb = tiebreak.gather(1, index)
        best_tb = torch.where(chosen, tb, neg).amax(dim=1, keepdim=True)
        chosen &= tb == best_tb
    first = torch.where(chosen, correct, values.shape[1]).amin(dim=1)
    return best[:, 0], best_tb[:, 0], first


def count_ahead(values: torch.Tensor, tiebreak: torch.Tensor | None, best, best_tb, index) -> torch.Tensor:
    """Entries of each row before (best, best_tb, index) under (value desc, tiebreak desc, index asc)."""
    if values.device.type == "cpu":
        tb = tiebreak if tiebreak is not None else values
        return torch.from_numpy(row_kernels.count_ahead(values.numpy(), tb.contiguous().numpy(), tiebreak is not None,
                                                    best.numpy(), best_tb.numpy(), index.numpy()))
    cols = torch.arange(values.shape[1], device=values.device)
    later = cols[None, :] < index[:, None]
    if tiebreak is not None:
        later = (tiebreak > best_tb[:, None]) | ((tiebreak == best_tb[:, None]) & later)
    return ((values > best[:, None]) | ((values == best[:, None]) & later)).sum(dim=1)


def _evidence(scores: torch.Tensor, method: str, weight: float, config: FusionConfig,
              out: torch.Tensor | None = None, offset: int = 0, aux: RowAux = NOTHING_STORED,
              into: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each item's weighted evidence over the whole row (added into ``out`` when given), and the row's order
    when RRF needed it (sorted here unless ``aux.order``, the stored one, is given; ``aux.moments`` likewise
    for the rows' mean and sd). On the CPU a score normaliser's element-wise step is one numba pass; an
    engine's score map or floor takes the plain torch path. ``offset``: where this model's ranks start.
    ``into``: where a fresh result is written on the numba paths (a buffer of the scores' shape reused from
    block to block), instead of a new array."""
    if method in RANK_METHODS and scores.device.type == "cpu":  # scatter each rank's evidence, no rank tensor
        order = row_kernels.row_order(scores.contiguous().numpy()) if aux.order is None else aux.order.numpy()
        accumulate = out is not None
        out = _fresh(scores, into) if out is None else out
        by_rank = _rank_evidence(scores.shape[1], weight, config, scores.device, offset)
        row_kernels.scatter_by_order(order, by_rank.numpy(), out.numpy(), accumulate)
        return out, torch.from_numpy(order)
    if method in RANK_METHODS:
        ranks, order = full_ranks(scores)
        evidence = _rank_evidence(scores.shape[1], weight, config, scores.device, offset)[ranks - 1]
        return (evidence if out is None else out.add_(evidence)), order
    if not _numba_affine(scores, config):
        evidence = plain_evidence(scores, None, config) * weight
        return (evidence if out is None else out.add_(evidence)), None
    rows = method_rows(scores, None, config, aux.moments)
    accumulate = out is not None
    out = _fresh(scores, into) if out is None else out
    row_kernels.affine_evidence(scores.numpy(), rows.low[:, 0].contiguous().numpy(), rows.scale[:, 0].contiguous().numpy(),
                            rows.flat[:, 0].contiguous().numpy(), rows.flat_value, weight, out.numpy(), accumulate)
    return out, None


def _fresh(like: torch.Tensor, into: torch.Tensor | None) -> torch.Tensor:
    """``into`` when given (a reused buffer of ``like``'s shape and dtype), else a new tensor like ``like``."""
    return torch.empty_like(like) if into is None else into


def _numba_affine(scores: torch.Tensor, config: FusionConfig) -> bool:
    """A plain score normaliser on the CPU: its evidence is one numba pass (an engine's score map or floor,
    or another device, takes the torch path)."""
    return (scores.device.type == "cpu" and config.score_map == "none" and config.floor is None
            and registry.method(config.method).kind == "affine")


def _weighted_mean(scores, weights, config: FusionConfig, aux):
    """OpenSearch's geometric or harmonic mean of each item's evidence over the lists where it is > 0 (whole
    rankings: every list holds every item), and model 0's order when RRF needed it."""
    num = den = order0 = None
    n_items = scores[0].shape[1]
    for m, (s, w) in enumerate(zip(scores, weights)):
        e, order = _evidence(s, config.method, 1.0, config, offset=m * n_items, aux=aux[m])
        order0 = order if m == 0 else order0
        part, part_weight = mean_parts(e, w, config.combine)
        num, den = (part, part_weight) if num is None else (num + part, den + part_weight)
    return mean_total(num, den, config.combine), order0


def _top(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` entries of each row under (value desc, index asc): numba heaps on the CPU."""
    if values.device.type != "cpu":
        return topk_stable(values, k)
    heaps = topk_kernels.Heaps(values.shape[0], min(k, values.shape[1]))
    heaps.offer_rows(values.contiguous().numpy(), 0)
    top_values, top_ids = heaps.lists()
    return torch.from_numpy(top_values), torch.from_numpy(top_ids)


def _top_in_order(values: torch.Tensor, order: torch.Tensor, k: int, into: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` entries of each row under (value desc, position in ``order`` asc): values and ids. On
    the CPU ``order`` may be a stored uint16 one, read as it is (numba gathers into ``into`` when given, a
    reused buffer of ``values``' shape; torch wants int64)."""
    if values.device.type != "cpu":
        top_values, position = _top(values.gather(1, order), k)
        return top_values, order.gather(1, position)
    o = order.numpy()
    gathered = row_kernels.gather_rows(values.numpy(), o, _fresh(values, into).numpy())
    top_values, position = _top(torch.from_numpy(gathered), k)
    return top_values, torch.from_numpy(np.take_along_axis(o, position.numpy(), 1).astype(np.int64))


def _source_object_block(scores, weights, config, correct, keep, aux, scratch=None):
    n_items = scores[0].shape[1]
    scratch = scratch or _no_scratch
    if config.combine in HOLDER_MEANS:
        fused, order0 = _weighted_mean(scores, weights, config, aux)
    else:
        fused, order0 = _evidence(scores[0], config.method, weights[0], config, aux=aux[0],
                                  into=scratch("fused", scores[0]))
        for m, (s, w) in enumerate(zip(scores[1:], weights[1:]), start=1):
            if config.combine == "max":
                fused = torch.maximum(fused, _evidence(s, config.method, w, config, offset=m * n_items,
                                                       aux=aux[m])[0])
            else:
                _evidence(s, config.method, w, config, out=fused, offset=m * n_items, aux=aux[m])
        if config.combine == "mnz":  # whole rankings: every list holds every image
            fused *= len(scores)
        if config.combine == "mean":  # OpenSearch's arithmetic mean over every list
            fused /= sum(weights) if sum(weights) > 0 else 1.0
    # ties: first appearance = position in model 0's full list, i.e. model 0's score desc, then index asc
    best, best_s0, index = first_correct(fused, scores[0], correct)
    ranks = 1 + count_ahead(fused, scores[0], best, best_s0, index)
    keep = min(keep, fused.shape[1])
    if order0 is not None:  # model 0's order is known (RRF): a stable top-k in that order is the tie rule
        values, ids = _top_in_order(fused, order0, keep, scratch("gathered", fused))
    else:  # ties are rare: order by index first, then re-rank the rows that have ties in their head
        values, ids = _top(fused, min(keep + 1, fused.shape[1]))
        tie_rows = torch.nonzero((values[:, 1:] == values[:, :-1]).any(dim=1)).flatten()
        values, ids = values[:, :keep].clone(), ids[:, :keep].clone()
        if tie_rows.numel():
            order = full_ranks(scores[0][tie_rows])[1]
            values[tie_rows], position = _top(fused[tie_rows].gather(1, order), keep)
            ids[tie_rows] = order.gather(1, position)
    contributors = torch.full_like(ids, (1 << len(scores)) - 1)
    return RankedLists(ids=ids, scores=values, contributors=contributors), ranks


def _no_scratch(_name: str, _like: torch.Tensor) -> None:
    return None


def _rank_evidence(n_items: int, weight: float, config: FusionConfig, device, offset: int = 0) -> torch.Tensor:
    """RRF evidence of the entry at each rank 1..n (computed as the list path computes it)."""
    ranks = torch.zeros(1, n_items, device=device)
    return weighted_evidence(ranks, None, config, weight, offset=offset)[0]


def _count_in_descending(ev: torch.Tensor, e: torch.Tensor):
    """For a non-increasing 1-D ``ev``: per value of ``e``, entries above it and entries equal to it."""
    ascending = ev.flip(0).contiguous()
    low = torch.searchsorted(ascending, e.contiguous(), right=False)
    high = torch.searchsorted(ascending, e.contiguous(), right=True)
    return ev.numel() - high, high - low


def _affine_at(values: torch.Tensor, rows: RowAffine, weight: float) -> torch.Tensor:
    """The weighted evidence of some of each row's scores (``values``: (B, L)), rounded exactly as
    ``row_kernels.affine_evidence`` rounds it for the whole row."""
    w = torch.tensor(weight, dtype=torch.float32)
    return torch.where(rows.flat, torch.tensor(rows.flat_value, dtype=torch.float32) * w,
                       (values - rows.low) / rows.scale * w)


def _winner(first_evidence: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query, the model whose first correct entry has the most evidence (the first such: the lower model
    wins ties) and that evidence."""
    e = torch.stack(first_evidence, dim=1)
    winner = torch.argmax(e, dim=1)
    return winner, e.gather(1, winner[:, None])[:, 0]


def _equal_evidence_tiebreak(winner: torch.Tensor, m: int, s_best: torch.Tensor) -> torch.Tensor:
    """Model m's tiebreak among entries with the winner's evidence: all of an earlier model's come first
    (-inf), the winner's own entries by score and index (``s_best``), none of a later model's (+inf)."""
    inf = torch.full_like(s_best, float("inf"))
    return torch.where(winner > m, -inf, torch.where(winner == m, s_best, inf))


def _merge_heads(ids: list[torch.Tensor], values: list[torch.Tensor], keep: int) -> RankedLists:
    """The fused list's head: each model's own top entries (ids, evidence) merged by evidence, then model,
    then rank (evidence is monotone in a model's score, so its top entries are its best evidence)."""
    bits = [torch.full_like(top, 1 << m) for m, top in enumerate(ids)]
    all_ids, all_values, all_bits = torch.cat(ids, 1), torch.cat(values, 1), torch.cat(bits, 1)
    out_values, position = sort_desc_with_tiebreak(all_values.contiguous())
    position = position[:, :keep]
    return RankedLists(ids=all_ids.gather(1, position), scores=out_values[:, :keep],
                       contributors=all_bits.gather(1, position))


def _document_block_affine(scores, weights, config, correct, keep, aux, scratch=None):
    """Document fusion of a score normaliser on the CPU without any evidence matrix: each model's first
    correct entry's evidence from its score, then one numba pass per model that counts the entries ahead of
    the winner and keeps the model's own top list (the fused head: evidence is monotone in the score)."""
    n_items = scores[0].shape[1]
    rows = [method_rows(s, None, config, a.moments) for s, a in zip(scores, aux)]
    firsts = [first_correct(s, None, correct) for s in scores]  # (score, _, index) of each model's first correct
    winner, e_star = _winner([_affine_at(f[0][:, None], r, w)[:, 0] for f, r, w in zip(firsts, rows, weights)])
    ahead = torch.zeros_like(winner)
    ids, values = [], []
    for m, ((s_best, _, index), r, w) in enumerate(zip(firsts, rows, weights)):
        tb = _equal_evidence_tiebreak(winner, m, s_best)
        heaps = topk_kernels.Heaps(len(s_best), min(keep, n_items))
        ahead += torch.from_numpy(row_kernels.affine_count_top(
            scores[m].contiguous().numpy(), r.low[:, 0].contiguous().numpy(), r.scale[:, 0].contiguous().numpy(),
            r.flat[:, 0].contiguous().numpy(), r.flat_value, w, e_star.numpy(), tb.numpy(),
            torch.where(winner == m, index, 0).numpy(), heaps.vals, heaps.ids, heaps.counts))
        top_scores, top = (torch.from_numpy(a) for a in heaps.lists())
        ids.append(top)
        values.append(_affine_at(top_scores, r, w))
    return _merge_heads(ids, values, keep), 1 + ahead


def _document_block(scores, weights, config, correct, keep, aux, scratch=None):
    if config.method not in RANK_METHODS and _numba_affine(scores[0], config):
        return _document_block_affine(scores, weights, config, correct, keep, aux)
    n_models, n_items = len(scores), scores[0].shape[1]
    rrf = config.method in RANK_METHODS  # evidence depends on the rank alone: count it, never materialise it
    evidence = [None if rrf else _evidence(s, config.method, w, config, aux=a)[0]
                for s, w, a in zip(scores, weights, aux)]
    rank_ev = [_rank_evidence(n_items, w, config, scores[0].device, m * n_items) for m, w in enumerate(weights)] \
        if rrf else None
    firsts = []  # each model's first correct item by its own order: (score, index, rank (RRF only), evidence)
    for m in range(n_models):
        s_best, _, index = first_correct(scores[m], None, correct)
        if rrf:  # its evidence is its rank's: count the rank
            rank = 1 + count_ahead(scores[m], None, s_best, torch.zeros_like(s_best), index)
            firsts.append((s_best, index, rank, rank_ev[m][rank - 1]))
        else:
            firsts.append((s_best, index, None, evidence[m].gather(1, index[:, None])[:, 0]))
    winner, e_star = _winner([f[3] for f in firsts])
    ahead = torch.zeros_like(winner)
    for m, (s_best, index, rank, _) in enumerate(firsts):
        if rrf:
            above, equal = _count_in_descending(rank_ev[m], e_star)
            before = (torch.minimum(above + equal, rank - 1) - above).clamp(min=0)
            ahead += above + torch.where(winner > m, equal, torch.where(winner == m, before, 0))
        else:
            tb = _equal_evidence_tiebreak(winner, m, s_best)
            ahead += count_ahead(evidence[m], scores[m], e_star, tb, torch.where(winner == m, index, 0))
    ids = [_top(s, min(keep, n_items))[1] for s in scores]
    values = [rank_ev[m][: top.shape[1]].expand_as(top) if rrf else evidence[m].gather(1, top) for m, top in enumerate(ids)]
    return _merge_heads(ids, values, keep), 1 + ahead


def _read_ahead(load: Callable, ranges: list[tuple[int, int]], ahead: bool) -> Iterator:
    """``((r0, r1), load(r0, r1, i))`` for the i-th range; with ``ahead``, the next range is loaded on a second
    thread while the caller works on the current one (stored rows: file reads release the GIL, so the reading
    of a dense job overlaps its fusion instead of adding to it). Fresh rows are computed in turn, never two at
    once. Either way, range i is loaded only once the caller is done with range i - 2 (its buffers may be
    reused: at most two ranges are held at once)."""
    if not ahead or len(ranges) < 2:
        yield from ((r, load(*r, i)) for i, r in enumerate(ranges))
        return
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(load, *ranges[0], 0)
        for i, r in enumerate(ranges):
            current = pending.result()
            if i + 1 < len(ranges):
                pending = pool.submit(load, *ranges[i + 1], i + 1)
            yield r, current


class BlockBuffers:
    """Block buffers reused from block to block: with read-ahead, two sets by block parity (block i is read
    into the arrays block i - 2 was read into), else one (block i into block i - 1's). Fresh 256 MB arrays
    page-fault on every block: ~2x the time of a read from the page cache into a reused one. A set's arrays
    are the ones its first read returned (CPU only: other devices read afresh). The block's work arrays
    (``scratch``) are reused too: a fresh 53 MB array written once took 15.7 ms, a reused one 1.7 ms."""

    def __init__(self, ahead: bool):
        self.sets: tuple[dict, ...] = ({}, {}) if ahead else ({},)
        self.work: dict[str, torch.Tensor] = {}  # work arrays of the block being fused (``scratch``)

    def scratch(self, name: str, like: torch.Tensor) -> torch.Tensor | None:
        """A work array of ``like``'s shape and dtype for the block being fused, reused from block to block (the
        first block's are the largest; CPU only: None elsewhere, a fresh one is made)."""
        if like.device.type != "cpu":
            return None
        kept = self.work.get(name)
        if kept is None or kept.dtype != like.dtype or kept.shape[1:] != like.shape[1:] or len(kept) < len(like):
            kept = self.work[name] = torch.empty_like(like)
        return kept[: len(like)]

    def read(self, rows: RowBlocks, r0: int, r1: int, i: int, key: tuple) -> torch.Tensor:
        buffers = self.sets[i % len(self.sets)]
        block = rows(r0, r1, into=buffers.get(key))
        if key not in buffers and block.device.type == "cpu":
            buffers[key] = block.numpy()
        return block


def dense_fuse(side: DenseSide, weights: list[float], config: FusionConfig, keep: int, final_k: int,
               budget_bytes: int,
               progress: Callable[[int], None] | None = None) -> tuple[RankedLists, np.ndarray]:
    """Fused lists (first ``keep`` entries) and exact ranks of the first correct entry for every query."""
    n_models, n_queries, n_items = len(side.rows), side.correct.shape[0], side.n_items
    per_row = n_items * n_models * ((24 if config.method in RANK_METHODS else 12)  # scores, evidence, ranks
                                    + (8 if side.stored else 0))  # the next block's scores and order, read ahead
    block = max(1, min(n_queries, budget_bytes // per_row))
    uses_orders = side.orders is not None and config.method in RANK_METHODS and config.fuse_on == "source_object"
    uses_moments = side.moments is not None and registry.method(config.method).moments
    keep = min(keep, final_k)
    outs, ranks = [], []

    buffers = BlockBuffers(side.stored)

    def load(r0: int, r1: int, i: int) -> tuple[list, list[RowAux]]:
        def read(rows: RowBlocks, key: tuple) -> torch.Tensor:
            return buffers.read(rows, r0, r1, i, key)
        return ([read(rows, ("scores", m)) for m, rows in enumerate(side.rows)],
                [RowAux(read(side.orders[m], ("order", m)) if uses_orders else None,
                        read(side.moments[m], ("moments", m)) if uses_moments else None) for m in range(n_models)])

    for (r0, r1), (scores, aux) in _read_ahead(load, tiles(n_queries, block), side.stored):
        block_fn = _source_object_block if config.fuse_on == "source_object" else _document_block
        fused, block_ranks = block_fn(scores, weights, config, side.correct[r0:r1], keep, aux, buffers.scratch)
        block_ranks = torch.where(block_ranks <= final_k, block_ranks, 0)
        outs.append(RankedLists(ids=fused.ids.cpu(), scores=fused.scores.cpu(), contributors=fused.contributors.cpu()))
        ranks.append(block_ranks.cpu().numpy())
        if progress is not None:
            progress(r1 - r0)
    fused = RankedLists(**{f: torch.cat([getattr(o, f) for o in outs]) for f in ("ids", "scores", "contributors")})
    return fused, np.concatenate(ranks).astype(np.int64)
