"""Rank fusion over per-model top-k lists: one ``fuse`` (the ``fusion`` config is :mod:`fusebench.fusion.config`;
the normalisers that give each list's evidence are in :mod:`fusebench.fusion.normalisers`).

Inputs are per-model ranked lists for a batch of queries (``valid`` marks real entries; ``None`` means every
entry is real, as for whole score rows): ``ids`` (B, k) int64 with -1 padding and
``scores`` (B, k) float32, ordered best first. A normaliser maps one model's list to per-hit evidence;
``fuse`` adds the weighted evidence either per source object (item id) or per document (each model's hit
its own entry) and orders the result by fused score, ties kept in first-appearance order when the lists
are read model by model in config order, each from rank 1 down (``ties: first``), or smaller item id first
(``ties: id``, Milvus' rule: every entry is fused, then ordered and cut).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from fusebench.fusion import methods as registry
from fusebench.fusion.config import HOLDER_MEANS, FusionConfig
from fusebench.fusion.methods._ranks import absent_points
from fusebench.fusion.normalisers import RowAffine, _ranks, affine_evidence, map_scores
from fusebench.search import topk_kernels
from fusebench.search.exact import sort_desc_with_tiebreak, sort_rows
from fusebench.search.ranked import RankedLists


def method_rows(scores: torch.Tensor, valid: torch.Tensor | None, config: FusionConfig,
                moments: torch.Tensor | None = None) -> RowAffine:
    """The method's per-row affine map, with ``config.flat_score`` for flat lists where set (``moments``: whole
    rows' stored mean and sd, for the methods that use them)."""
    rows = registry.method(config.method).evidence(scores, valid, config, moments)
    return rows if config.flat_score is None else replace(rows, flat_value=float(config.flat_score))



def _group_by_id(all_ids: torch.Tensor):
    """Per row, the entries sorted by (id, position): (ids, positions, first-of-its-id mask, padding slot id).
    Each model's list holds an id at most once, so an id's entries are at most ``n_models`` apart."""
    width = all_ids.shape[1]
    shift = max(1, (width - 1).bit_length())
    n_slots = int(all_ids.max()) + 2 if all_ids.numel() else 1  # the last slot holds padding
    dtype = torch.int32 if n_slots << shift < 2**31 else torch.int64  # int32 keys sort twice as fast
    slot = all_ids.to(dtype)
    slot.masked_fill_(slot < 0, n_slots - 1)
    keys = sort_rows((slot << shift) | torch.arange(width, device=all_ids.device, dtype=dtype))
    ids, positions = keys >> shift, (keys & ((1 << shift) - 1)).long()
    first = torch.ones_like(ids, dtype=torch.bool)
    first[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return ids, positions, first, n_slots - 1


def _group_reduce(ids: torch.Tensor, parts: torch.Tensor, n_models: int, op: str) -> torch.Tensor:
    """Each id's parts reduced (``sum`` in position order, ``max``, ``or``) at its first entry."""
    total = parts.clone()
    for step in range(1, n_models):
        apart = ids[:, step:] != ids[:, :-step]
        if op == "max":
            total[:, :-step] = torch.maximum(total[:, :-step], parts[:, step:].masked_fill(apart, float("-inf")))
        elif op == "or":
            total[:, :-step] |= parts[:, step:].masked_fill(apart, 0)
        else:
            total[:, :-step] += parts[:, step:].masked_fill(apart, 0.0)
    return total


def _popcount(bits: torch.Tensor, n_models: int) -> torch.Tensor:
    return sum((bits >> m) & 1 for m in range(n_models))


def mean_parts(value: torch.Tensor, weight, combine: str) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenSearch's geometric and harmonic means, per entry: what the numerator and the denominator add
    (w ln e and w, or w / e and w); an entry whose evidence e is <= 0 adds to neither. ``weight``: a number
    or a tensor like ``value``."""
    counted = value > 0
    safe = torch.where(counted, value, torch.ones_like(value))
    part = weight * torch.log(safe) if combine == "geometric" else weight / safe
    return part.masked_fill_(~counted, 0.0), torch.where(counted, weight, 0.0).to(value.dtype)


def mean_total(num: torch.Tensor, den: torch.Tensor, combine: str) -> torch.Tensor:
    """The mean from the summed parts: exp(num / den) (geometric) or den / num (harmonic); 0 with no parts."""
    if combine == "geometric":
        return torch.where(den > 0, torch.exp(num / den.clamp(min=1e-30)), 0.0)
    return torch.where(num > 0, den / num.clamp(min=1e-30), 0.0)


def _combine_by_id(ids, gather, weighted, plain, entry_weights, bits, n_models, config: FusionConfig):
    """Per id (at its first entry in the sorted layout): the evidence combined as ``config.combine`` says,
    and the bitmask of the lists holding it. ``gather`` puts an entry tensor in the sorted layout."""
    contributors = _group_reduce(ids, gather(bits), n_models, "or")
    combine = config.combine
    if combine == "max":
        return _group_reduce(ids, gather(weighted), n_models, "max"), contributors
    if combine in HOLDER_MEANS:  # weighted means over the lists holding it with evidence > 0
        part, part_weight = mean_parts(gather(plain), gather(entry_weights), combine)
        return mean_total(_group_reduce(ids, part, n_models, "sum"), _group_reduce(ids, part_weight, n_models, "sum"),
                          combine), contributors
    total = _group_reduce(ids, gather(weighted), n_models, "sum")
    if combine == "mnz":  # times the number of lists that hold the id
        total *= _popcount(contributors, n_models).to(total.dtype)
    return total, contributors


def weighted_evidence(scores: torch.Tensor, valid: torch.Tensor | None, config: FusionConfig,
                      weight: float, offset: int = 0, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """One model's evidence for its list, times its weight; with ``rrf_weighting: rank`` (Qdrant) RRF divides
    the rank by the weight instead: 1 / (rank / w + rrf_k), and a weight <= 0 gives 0. ``offset``: ranks
    start after it (``rrf_ranks: concatenated``); ``candidates``: Borda's n per row."""
    if config.own_params().get("rrf_weighting") == "rank":
        return _rank_weighted_rrf(scores, config, weight, offset)
    return plain_evidence(scores, valid, config, offset, candidates) * weight


def _rank_offset(config: FusionConfig, offset: int) -> int:
    """Where a list's ranks start: after the lists before it (``rrf_ranks: concatenated``), else at 1."""
    return offset if config.rrf_ranks == "concatenated" else 0


def _rank_weighted_rrf(scores: torch.Tensor, config: FusionConfig, weight: float, offset: int) -> torch.Tensor:
    offset = _rank_offset(config, offset)
    if weight <= 0:
        return torch.zeros_like(scores)
    return (1.0 / (_ranks(scores, offset) / weight + config.params["rrf_k"])).expand_as(scores).clone()


def plain_evidence(scores: torch.Tensor, valid: torch.Tensor | None, config: FusionConfig, offset: int = 0,
                   candidates: torch.Tensor | None = None) -> torch.Tensor:
    """One model's unweighted evidence, by its method's kind (:mod:`fusebench.fusion.methods`): a rank method's
    evidence at each list position; else the engine's score map, then the method's affine map (its flat value as
    configured) or its general score map; then the floor."""
    spec = registry.method(config.method)
    if valid is not None and scores.device.type == "cpu" and bool(valid.all()):
        valid = None  # full lists (the usual case): whole-row statistics, one numba pass per moment
    if spec.kind == "rank":  # Borda-like points count candidates, never the lists before (rrf_ranks)
        ranks = _ranks(scores, 0 if spec.candidates else _rank_offset(config, offset))[None, :]  # (1, k)
        evidence = spec.evidence(ranks, config, candidates).expand_as(scores).clone()
    elif spec.kind == "affine":
        mapped = map_scores(scores, config.score_map)
        evidence = affine_evidence(mapped, method_rows(mapped, valid, config))
    else:
        evidence = spec.evidence(map_scores(scores, config.score_map), valid, config)
    if config.floor is not None:
        evidence = torch.where(evidence <= 0, torch.tensor(float(config.floor), dtype=evidence.dtype), evidence)
    return evidence


_KERNEL_COMBINES = {"sum": topk_kernels.COMBINE_SUM, "max": topk_kernels.COMBINE_MAX, "mnz": topk_kernels.COMBINE_MNZ}


def _kernel_combines(config: FusionConfig, all_ids: torch.Tensor) -> bool:
    return (all_ids.device.type == "cpu" and config.combine in _KERNEL_COMBINES
            and not registry.method(config.method).candidates and all_ids.numel() > 0)


def _weighted_lists(ids, scores, weights, offsets, config: FusionConfig) -> torch.Tensor:
    """Every model's weighted evidence, side by side in model order (B, sum of the list lengths)."""
    return torch.cat([weighted_evidence(s.to(torch.float32), i >= 0, config, w, offset=o)
                      for i, s, w, o in zip(ids, scores, weights, offsets)], dim=1)


def _fuse_by_id_kernel(all_ids, ids, scores, weights, offsets, config, final_k) -> RankedLists:
    """source_object fusion by :func:`fusebench.search.topk_kernels.fuse_by_id` (the same rule as the torch path below)."""
    evidence = _weighted_lists(ids, scores, weights, offsets, config)
    rows = all_ids.shape[0]
    out_ids = np.full((rows, final_k), -1, dtype=np.int64)
    out_scores = np.full((rows, final_k), -np.inf, dtype=np.float32)
    out_bits = np.zeros((rows, final_k), dtype=np.int64)
    column_bits = np.concatenate([np.full(t.shape[1], 1 << m, dtype=np.int64) for m, t in enumerate(ids)])
    topk_kernels.fuse_by_id(all_ids.contiguous().numpy(), evidence.contiguous().numpy(), column_bits,
                       int(all_ids.max()) + 1, final_k, _KERNEL_COMBINES[config.combine], out_ids, out_scores, out_bits)
    return RankedLists(ids=torch.from_numpy(out_ids), scores=torch.from_numpy(out_scores),
                       contributors=torch.from_numpy(out_bits))


def ties_by_id(fused: RankedLists, final_k: int) -> RankedLists:
    """``fused`` (every entry, best first) ordered by fused score with equal scores by smaller item id, cut to
    ``final_k``: Milvus' order (``internal/util/function/rerank/util.go`` ``newIDScores``). Padding stays last."""
    ids, scores = fused.ids.numpy(), fused.scores.numpy()
    order = torch.from_numpy(np.lexsort((ids, -scores.astype(np.float64)), axis=1)[:, :final_k])
    return RankedLists(ids=fused.ids.gather(1, order), scores=fused.scores.gather(1, order),
                       contributors=fused.contributors.gather(1, order))


def fuse(ids: list[torch.Tensor], scores: list[torch.Tensor], config: FusionConfig, final_k: int,
         weights: list[float] | None = None) -> RankedLists:
    """Fuse per-model ranked lists for one batch of queries into one list of length ``final_k`` with
    ``config``'s method, key and the method's own settings (``params``) (``weights``: per model, None = equal)."""
    method, fuse_on, n_models = config.method, config.fuse_on, len(ids)
    if config.ties == "id":
        every = fuse(ids, scores, replace(config, ties="first"), sum(t.shape[1] for t in ids), weights)
        return ties_by_id(every, final_k)
    counts = registry.method(method).candidates  # FusionConfig checked the method and the key
    weights = [1.0] * n_models if weights is None else list(weights)
    all_ids = torch.cat(ids, dim=1)
    offsets = [sum(t.shape[1] for t in ids[:m]) for m in range(n_models)]
    if fuse_on == "source_object" and _kernel_combines(config, all_ids):  # the common case on the CPU: numba
        return _fuse_by_id_kernel(all_ids, ids, scores, weights, offsets, config, final_k)
    bits = torch.cat([torch.full_like(i, 1 << m) for m, i in enumerate(ids)], dim=1)
    if fuse_on == "document":
        fused = _weighted_lists(ids, scores, weights, offsets, config).masked_fill(all_ids < 0, float("-inf"))
        out_scores, out_positions = sort_desc_with_tiebreak(fused)
    else:
        sorted_ids, positions, first, pad = _group_by_id(all_ids)
        candidates = (first & (sorted_ids != pad)).sum(dim=1, keepdim=True) if counts else None
        plain = torch.cat([plain_evidence(s.to(torch.float32), i >= 0, config, o, candidates)
                           for i, s, o in zip(ids, scores, offsets)], dim=1)
        entry_weights = torch.cat([torch.full_like(s, w, dtype=torch.float32) for s, w in zip(scores, weights)], dim=1)
        rank_weighted = config.own_params().get("rrf_weighting") == "rank"  # the weight divides the rank (Qdrant)
        weighted = _weighted_lists(ids, scores, weights, offsets, config) if rank_weighted else plain * entry_weights
        total, by_id = _combine_by_id(sorted_ids, lambda t: t.gather(1, positions), weighted, plain, entry_weights,
                                      bits, n_models, config)
        if counts:  # the points of the lists that lack the id
            for m, (i, w) in enumerate(zip(ids, weights)):
                total += ((by_id >> m) & 1 == 0).to(total.dtype) * (w * absent_points(i >= 0, candidates))
        if config.combine == "mean":  # OpenSearch's arithmetic mean: a list lacking the id counts as 0
            total /= sum(weights) if sum(weights) > 0 else 1.0
        total = total.masked_fill_(~first | (sorted_ids == pad), float("-inf"))
        out_scores, out_positions = sort_desc_with_tiebreak(total, positions)
        bits = torch.zeros_like(bits).scatter_(1, positions, by_id)
    out_scores, out_positions = out_scores[:, :final_k], out_positions[:, :final_k]
    pad_out = out_scores == float("-inf")
    return RankedLists(ids=all_ids.gather(1, out_positions).masked_fill_(pad_out, -1), scores=out_scores,
                      contributors=bits.gather(1, out_positions).masked_fill_(pad_out, 0))


def fuse_in_blocks(ids: list[torch.Tensor], scores: list[torch.Tensor], config: FusionConfig, final_k: int,
                   weights: list[float] | None = None, max_entries: int = 1 << 20) -> RankedLists:
    """``fuse`` over row blocks of at most ``max_entries`` list entries (about 40 bytes each while a block is
    fused: ~40 MB). Each block is a few parallel steps (torch's and numba's threads), so blocks are large: on a
    machine another process keeps busy, COCO's 25,010 x 2 x 100 entries took 2.5-11 s in 2^17-entry blocks and
    0.3-2 s in 2^20-entry ones (0.1 s either way on an idle one); fusion is row by row, so the result is the same."""
    rows = ids[0].shape[0]
    width = sum(t.shape[1] for t in ids)
    step = max(1, max_entries // width)
    blocks = [fuse([t[r:r + step] for t in ids], [t[r:r + step] for t in scores], config, final_k, weights)
              for r in range(0, rows, step)]
    if len(blocks) == 1:
        return blocks[0]
    return RankedLists(**{f: torch.cat([getattr(b, f) for b in blocks]) for f in ("ids", "scores", "contributors")})
