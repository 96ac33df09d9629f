"""Rank fusion over per-model top-k lists: small, named, pure normalisers and one ``fuse``.

Inputs are per-model ranked lists for a batch of queries: ``ids`` (B, k) int64 with -1 padding and
``scores`` (B, k) float32, ordered best first. Every normaliser maps one model's list to per-hit evidence;
``fuse`` adds the weighted evidence either per source object (item id) or per document (each model's hit
its own entry) and orders the result by fused score, ties kept in first-appearance order when the lists
are read model by model in config order, each from rank 1 down.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusebench import FusebenchError

METHODS = ("none", "rrf", "dbsf", "sum", "minmax", "zscore")
FUSE_ON = ("document", "source_object")


@dataclass(frozen=True)
class FusionConfig:
    method: str = "dbsf"
    fuse_on: str = "source_object"
    top_k: int | None = 100  # per model; None = all items
    final_top_k: int | None = None  # after fusion; None = top_k
    rrf_k: float = 60.0
    ddof: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise FusebenchError(f"fusion.method={self.method!r} is not a fusion method; valid: {', '.join(METHODS)}.")
        if self.fuse_on not in FUSE_ON:
            raise FusebenchError(f"fusion.fuse_on={self.fuse_on!r} is not valid; valid: {', '.join(FUSE_ON)}.")
        for key in ("top_k", "final_top_k"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise FusebenchError(f"fusion.{key}={value!r} must be a positive integer or null (null = all items).")
        if self.ddof not in (0, 1):
            raise FusebenchError(f"fusion.ddof={self.ddof!r}: use 0 (population sd) or 1 (sample sd, as Qdrant).")
        if self.rrf_k < 0:
            raise FusebenchError(f"fusion.rrf_k={self.rrf_k!r} must be >= 0 (the usual value is 60).")

    def per_model_k(self, n_items: int) -> int:
        return n_items if self.top_k is None else min(self.top_k, n_items)

    def final_k(self, n_items: int, n_models: int) -> int:
        """Length of the fused list: final_top_k, else top_k; never more than the entries that exist."""
        wanted = self.final_top_k if self.final_top_k is not None else self.top_k
        available = n_models * self.per_model_k(n_items) if self.fuse_on == "document" else n_items
        return available if wanted is None else min(wanted, available)

    def check_ks(self, ks: list[int]) -> None:
        """Recall@k needs lists at least k long."""
        largest = max(ks)
        for key in ("top_k", "final_top_k"):
            value = getattr(self, key)
            if value is not None and value < largest:
                raise FusebenchError(
                    f"fusion.{key}={value} is below the largest eval.ks ({largest}); recall@{largest} needs lists "
                    f"of at least {largest} items: raise fusion.{key} or drop k={largest} from eval.ks."
                )


def _row_mean_std(scores: torch.Tensor, valid: torch.Tensor, ddof: int) -> tuple[torch.Tensor, torch.Tensor]:
    count = valid.sum(dim=1, keepdim=True).to(scores.dtype)
    zeroed = torch.where(valid, scores, torch.zeros_like(scores))
    mean = zeroed.sum(dim=1, keepdim=True) / count.clamp(min=1)
    sq = torch.where(valid, (scores - mean) ** 2, torch.zeros_like(scores)).sum(dim=1, keepdim=True)
    denom = count - ddof
    std = torch.where(denom > 0, torch.sqrt(sq / denom.clamp(min=1)), torch.zeros_like(sq))
    return mean, std


def rrf_evidence(scores: torch.Tensor, valid: torch.Tensor, rrf_k: float = 60.0, **_) -> torch.Tensor:
    """1 / (rrf_k + rank), rank 1-based by list position."""
    rank = torch.arange(1, scores.shape[1] + 1, device=scores.device, dtype=scores.dtype)
    return (1.0 / (rrf_k + rank)).expand_as(scores).clone()


def dbsf_evidence(scores: torch.Tensor, valid: torch.Tensor, ddof: int = 0, **_) -> torch.Tensor:
    """Distribution-based score fusion: (s - (mean - 3 sd)) / (6 sd) over this list; 0.5 where sd = 0. No clipping."""
    mean, std = _row_mean_std(scores, valid, ddof)
    low = mean - 3 * std
    return torch.where(std > 0, (scores - low) / (6 * std).clamp(min=torch.finfo(scores.dtype).tiny),
                       torch.full_like(scores, 0.5))


def minmax_evidence(scores: torch.Tensor, valid: torch.Tensor, **_) -> torch.Tensor:
    """(s - min) / (max - min) over this list; 0.5 where max = min."""
    big = torch.finfo(scores.dtype).max
    low = torch.where(valid, scores, torch.full_like(scores, big)).amin(dim=1, keepdim=True)
    high = torch.where(valid, scores, torch.full_like(scores, -big)).amax(dim=1, keepdim=True)
    span = high - low
    return torch.where(span > 0, (scores - low) / span.clamp(min=torch.finfo(scores.dtype).tiny),
                       torch.full_like(scores, 0.5))


def zscore_evidence(scores: torch.Tensor, valid: torch.Tensor, ddof: int = 0, **_) -> torch.Tensor:
    """(s - mean) / sd over this list; 0 where sd = 0."""
    mean, std = _row_mean_std(scores, valid, ddof)
    return torch.where(std > 0, (scores - mean) / std.clamp(min=torch.finfo(scores.dtype).tiny),
                       torch.zeros_like(scores))


def sum_evidence(scores: torch.Tensor, valid: torch.Tensor, **_) -> torch.Tensor:
    """The raw cosine score (CombSUM)."""
    return scores.clone()


EVIDENCE = {
    "rrf": rrf_evidence,
    "dbsf": dbsf_evidence,
    "minmax": minmax_evidence,
    "zscore": zscore_evidence,
    "sum": sum_evidence,
}


@dataclass
class FusedLists:
    ids: torch.Tensor  # (B, L) int64, -1 padding
    scores: torch.Tensor  # (B, L) float32, -inf padding
    contributors: torch.Tensor  # (B, L) int64 bitmask of the models whose lists hold this entry


def _group_by_id(ids: torch.Tensor, evidence: torch.Tensor, bits: torch.Tensor, valid: torch.Tensor):
    """Per row, sum evidence of equal ids; return one entry per distinct id, in first-appearance order."""
    rows, width = ids.shape
    sentinel = torch.iinfo(torch.int64).max
    keyed = torch.where(valid, ids, torch.full_like(ids, sentinel))
    sorted_ids, perm = torch.sort(keyed, dim=1, stable=True)
    starts = torch.ones_like(sorted_ids, dtype=torch.bool)
    starts[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    segment = torch.cumsum(starts.to(torch.int64), dim=1) - 1
    # scatter_add visits positions in order, so each id's evidence is summed model by model, as in config order
    total = torch.zeros_like(evidence).scatter_add_(1, segment, evidence.gather(1, perm))
    first = torch.full_like(perm, width).scatter_reduce_(1, segment, perm, reduce="amin")
    owners = torch.zeros_like(bits).scatter_add_(1, segment, bits.gather(1, perm))
    seg_ids = torch.full_like(sorted_ids, -1).scatter_(1, segment, sorted_ids)
    real = (seg_ids != -1) & (seg_ids != sentinel)
    first = torch.where(real, first, torch.full_like(first, width))
    order = torch.argsort(first, dim=1, stable=True)
    take = lambda t: t.gather(1, order)  # noqa: E731
    real = take(real)
    return (torch.where(real, take(seg_ids), torch.full_like(seg_ids, -1)),
            torch.where(real, take(total), torch.full_like(total, float("-inf"))),
            torch.where(real, take(owners), torch.zeros_like(owners)))


def fuse(ids: list[torch.Tensor], scores: list[torch.Tensor], method: str, fuse_on: str, final_k: int,
         weights: list[float] | None = None, rrf_k: float = 60.0, ddof: int = 0) -> FusedLists:
    """Fuse per-model ranked lists for one batch of queries into one list of length ``final_k``."""
    if method not in EVIDENCE:
        raise FusebenchError(f"fusion method {method!r} cannot fuse; valid: {', '.join(EVIDENCE)}.")
    if fuse_on not in FUSE_ON:
        raise FusebenchError(f"fuse_on={fuse_on!r} is not valid; valid: {', '.join(FUSE_ON)}.")
    weights = [1.0] * len(ids) if weights is None else list(weights)
    parts, bits = [], []
    for m, (model_ids, model_scores, weight) in enumerate(zip(ids, scores, weights)):
        valid = model_ids >= 0
        evidence = EVIDENCE[method](model_scores.to(torch.float32), valid, rrf_k=rrf_k, ddof=ddof) * weight
        parts.append(torch.where(valid, evidence, torch.full_like(evidence, float("-inf"))))
        bits.append(torch.full_like(model_ids, 1 << m))
    all_ids = torch.cat(ids, dim=1)
    all_ev = torch.cat(parts, dim=1)
    all_bits = torch.cat(bits, dim=1)
    valid = all_ids >= 0
    if fuse_on == "source_object":
        all_ids, all_ev, all_bits = _group_by_id(all_ids, torch.where(valid, all_ev, torch.zeros_like(all_ev)),
                                                 all_bits, valid)
    else:
        all_bits = torch.where(valid, all_bits, torch.zeros_like(all_bits))
    order = torch.sort(all_ev, dim=1, descending=True, stable=True).indices[:, :final_k]
    out_ids = all_ids.gather(1, order)
    out_scores = all_ev.gather(1, order)
    pad = out_scores == float("-inf")
    return FusedLists(ids=torch.where(pad, torch.full_like(out_ids, -1), out_ids), scores=out_scores,
                      contributors=torch.where(pad, torch.zeros_like(out_ids), all_bits.gather(1, order)))


def fuse_in_blocks(ids: list[torch.Tensor], scores: list[torch.Tensor], config: FusionConfig, final_k: int,
                   weights: list[float] | None = None, max_entries: int = 1 << 22) -> FusedLists:
    """``fuse`` over row blocks so that long lists (top_k = all) never need more than ``max_entries`` at once."""
    rows = ids[0].shape[0]
    width = sum(t.shape[1] for t in ids)
    step = max(1, max_entries // max(width, 1))
    blocks = [fuse([t[r:r + step] for t in ids], [t[r:r + step] for t in scores], config.method, config.fuse_on,
                   final_k, weights, config.rrf_k, config.ddof) for r in range(0, rows, step)]
    if len(blocks) == 1:
        return blocks[0]
    return FusedLists(*(torch.cat([getattr(b, f) for b in blocks]) for f in ("ids", "scores", "contributors")))
