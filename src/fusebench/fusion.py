"""Rank fusion over per-model top-k lists: small, named, pure normalisers and one ``fuse``.

Inputs are per-model ranked lists for a batch of queries (``valid`` marks real entries; ``None`` means every
entry is real, as for whole score rows): ``ids`` (B, k) int64 with -1 padding and
``scores`` (B, k) float32, ordered best first. Every normaliser maps one model's list to per-hit evidence;
``fuse`` adds the weighted evidence either per source object (item id) or per document (each model's hit
its own entry) and orders the result by fused score, ties kept in first-appearance order when the lists
are read model by model in config order, each from rank 1 down.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusebench import FusebenchError, checks
from fusebench.kernels import row_mean_std
from fusebench.topk import sort_desc_with_tiebreak, sort_rows

METHODS = ("none", "rrf", "dbsf", "sum", "minmax", "zscore", "isr")
FUSE_ON = ("document", "source_object")
RRF_WEIGHTINGS = ("multiply", "rank")
COMBINES = ("sum", "max", "mnz")  # how an image's evidence from several lists adds up (source_object)
RANK_METHODS = ("rrf", "isr")  # evidence from the rank alone


@dataclass
class FusionConfig:
    """The ``fusion`` config group's schema and defaults (registered with Hydra by :mod:`fusebench.schema`)."""

    method: str = "dbsf"  # none | rrf | dbsf | sum | minmax | zscore
    fuse_on: str = "source_object"  # source_object: one entry per image; document: each model's hit its own entry
    top_k: int | None = 100  # per-model list length; null = all items
    final_top_k: int | None = None  # fused list length; null = top_k
    rrf_k: float = 60.0  # rrf only: 1 / (rrf_k + rank)
    ddof: int = 0  # dbsf/zscore sd: 0 population, 1 sample (Qdrant)
    rrf_weighting: str = "multiply"  # rrf only: multiply: w / (rrf_k + rank) | rank: 1 / (rank / w + rrf_k) (Qdrant)
    combine: str = "sum"  # source_object: sum (CombSUM) | max (CombMAX) | mnz (sum x lists holding it, CombMNZ)
    preset: str | None = None  # the engine preset this is (conf/fusion/ENGINE_METHOD.yaml), for labels

    def __post_init__(self):
        checks.choice(self.method, "fusion.method", METHODS)
        checks.choice(self.fuse_on, "fusion.fuse_on", FUSE_ON)
        for key in ("top_k", "final_top_k"):
            checks.optional_integer(getattr(self, key), f"fusion.{key}", 1, "null = all items")
        if isinstance(self.ddof, bool) or self.ddof not in (0, 1):
            raise FusebenchError(f"fusion.ddof={self.ddof!r} is not valid: use 0 (population sd) or 1 (sample sd, as Qdrant).")
        checks.number(self.rrf_k, "fusion.rrf_k", 0, hint="rrf only: 1 / (rrf_k + rank); the usual value is 60")
        checks.choice(self.rrf_weighting, "fusion.rrf_weighting", RRF_WEIGHTINGS)
        checks.choice(self.combine, "fusion.combine", COMBINES)
        checks.text(self.preset, "fusion.preset", allow_none=True)

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


def _row_mean_std(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation (``ddof`` 0 or 1) of each row's valid entries (``None``: all); sd 0 when
    undefined. Accumulated in float64 and rounded once to float32, so a row's statistics do not depend on
    the order of its entries (a ranked list and the unsorted row it came from give the same values)."""
    if valid is None and scores.device.type == "cpu":
        mean, std = row_mean_std(scores.contiguous().numpy(), ddof)  # whole rows: one pass per moment
        return torch.from_numpy(mean)[:, None], torch.from_numpy(std)[:, None]
    if valid is None:
        valid = torch.ones_like(scores, dtype=torch.bool)
    wide = scores.to(torch.float64)
    count = valid.sum(dim=1, keepdim=True).to(torch.float64)
    mean = wide.masked_fill(~valid, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)
    sq = ((wide - mean) ** 2).masked_fill_(~valid, 0.0).sum(dim=1, keepdim=True)
    denom = count - ddof
    std = torch.sqrt(sq / denom.clamp(min=1)).masked_fill_(denom <= 0, 0.0)
    return mean.to(scores.dtype), std.to(scores.dtype)


def isr_evidence(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> torch.Tensor:
    """Inverse square rank (Mourao et al. 2015): 1 / rank^2, rank 1-based by list position."""
    rank = torch.arange(1, scores.shape[1] + 1, device=scores.device, dtype=scores.dtype)
    return (1.0 / rank**2).expand_as(scores).clone()


def rrf_evidence(scores: torch.Tensor, valid: torch.Tensor, rrf_k: float, **_) -> torch.Tensor:
    """1 / (rrf_k + rank), rank 1-based by list position."""
    rank = torch.arange(1, scores.shape[1] + 1, device=scores.device, dtype=scores.dtype)
    return (1.0 / (rrf_k + rank)).expand_as(scores).clone()


@dataclass
class RowAffine:
    """A score normaliser's per-row parameters: evidence = (s - low) / scale, or ``flat_value`` on flat rows."""

    low: torch.Tensor  # (B, 1)
    scale: torch.Tensor  # (B, 1), 1 on flat rows
    flat: torch.Tensor  # (B, 1) bool
    flat_value: float


def dbsf_rows(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, **_) -> RowAffine:
    """Distribution-based score fusion: (s - (mean - 3 sd)) / (6 sd) over this list; 0.5 where sd = 0. No clipping."""
    mean, std = _row_mean_std(scores, valid, ddof)
    flat = std <= 0
    return RowAffine(mean - 3 * std, (6 * std).masked_fill_(flat, 1.0), flat, 0.5)


def minmax_rows(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> RowAffine:
    """(s - min) / (max - min) over this list; 0.5 where max = min."""
    if valid is None:
        low, high = scores.amin(dim=1, keepdim=True), scores.amax(dim=1, keepdim=True)
    else:
        big = torch.finfo(scores.dtype).max
        low = torch.where(valid, scores, torch.full_like(scores, big)).amin(dim=1, keepdim=True)
        high = torch.where(valid, scores, torch.full_like(scores, -big)).amax(dim=1, keepdim=True)
    span = high - low
    flat = span <= 0
    return RowAffine(low, span.masked_fill(flat, 1.0), flat, 0.5)


def zscore_rows(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, **_) -> RowAffine:
    """(s - mean) / sd over this list; 0 where sd = 0."""
    mean, std = _row_mean_std(scores, valid, ddof)
    flat = std <= 0
    return RowAffine(mean, std.masked_fill(flat, 1.0), flat, 0.0)


def sum_rows(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> RowAffine:
    """The raw cosine score (CombSUM): (s - 0) / 1."""
    zeros = torch.zeros(scores.shape[0], 1, dtype=scores.dtype, device=scores.device)
    return RowAffine(zeros, torch.ones_like(zeros), torch.zeros_like(zeros, dtype=torch.bool), 0.0)


AFFINE = {"dbsf": dbsf_rows, "minmax": minmax_rows, "zscore": zscore_rows, "sum": sum_rows}


def affine_evidence(scores: torch.Tensor, rows: RowAffine) -> torch.Tensor:
    return ((scores - rows.low) / rows.scale).masked_fill_(rows.flat, rows.flat_value)


def dbsf_evidence(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, **_) -> torch.Tensor:
    return affine_evidence(scores, dbsf_rows(scores, valid, ddof))


def minmax_evidence(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> torch.Tensor:
    return affine_evidence(scores, minmax_rows(scores, valid))


def zscore_evidence(scores: torch.Tensor, valid: torch.Tensor | None, ddof: int, **_) -> torch.Tensor:
    return affine_evidence(scores, zscore_rows(scores, valid, ddof))


def sum_evidence(scores: torch.Tensor, valid: torch.Tensor | None, **_) -> torch.Tensor:
    return scores.clone()


EVIDENCE = {
    "rrf": rrf_evidence,
    "isr": isr_evidence,
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


def _sum_by_id(all_ids: torch.Tensor, evidence: torch.Tensor, bits: torch.Tensor, n_models: int,
               combine: str):
    """Per row, one entry per distinct id: its evidence combined (``sum`` in position order, = model by model
    in config order; ``max``; ``mnz``: the sum times the lists holding it), at the position of its first
    appearance; every other entry gets -inf.

    Returns (scores, first positions, contributor bits), all in (id, position)-sorted layout. Each model's
    list holds an id at most once, so an id's entries are at most ``n_models`` apart after the sort.
    """
    width = all_ids.shape[1]
    shift = max(1, (width - 1).bit_length())
    n_slots = int(all_ids.max()) + 2 if all_ids.numel() else 1  # the last slot holds padding
    dtype = torch.int32 if n_slots << shift < 2**31 else torch.int64  # int32 keys sort twice as fast
    slot = all_ids.to(dtype)
    slot.masked_fill_(slot < 0, n_slots - 1)
    keys = sort_rows((slot << shift) | torch.arange(width, device=all_ids.device, dtype=dtype))
    ids, positions = keys >> shift, (keys & ((1 << shift) - 1)).long()
    parts, owners = evidence.gather(1, positions), bits.gather(1, positions)
    total, contributors = parts.clone(), owners.clone()
    for step in range(1, n_models):
        apart = ids[:, step:] != ids[:, :-step]
        if combine == "max":
            total[:, :-step] = torch.maximum(total[:, :-step], parts[:, step:].masked_fill(apart, float("-inf")))
        else:
            total[:, :-step] += parts[:, step:].masked_fill(apart, 0.0)
        contributors[:, :-step] |= owners[:, step:].masked_fill(apart, 0)
    if combine == "mnz":  # times the number of lists that hold the id
        total *= sum((contributors >> m) & 1 for m in range(n_models)).to(total.dtype)
    repeat = torch.zeros_like(ids, dtype=torch.bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    return total.masked_fill_(repeat | (ids == n_slots - 1), float("-inf")), positions, contributors


def weighted_evidence(scores: torch.Tensor, valid: torch.Tensor | None, config: FusionConfig,
                      weight: float) -> torch.Tensor:
    """One model's evidence for its list, times its weight; with ``rrf_weighting: rank`` (Qdrant) RRF divides
    the rank by the weight instead: 1 / (rank / w + rrf_k), and a weight <= 0 gives 0."""
    if config.method == "rrf" and config.rrf_weighting == "rank":
        if weight <= 0:
            return torch.zeros_like(scores)
        rank = torch.arange(1, scores.shape[1] + 1, device=scores.device, dtype=scores.dtype)
        return (1.0 / (rank / weight + config.rrf_k)).expand_as(scores).clone()
    return EVIDENCE[config.method](scores, valid, rrf_k=config.rrf_k, ddof=config.ddof) * weight


def fuse(ids: list[torch.Tensor], scores: list[torch.Tensor], config: FusionConfig, final_k: int,
         weights: list[float] | None = None) -> FusedLists:
    """Fuse per-model ranked lists for one batch of queries into one list of length ``final_k`` with
    ``config``'s method, key, rrf_k and ddof (``weights``: per model, None = equal)."""
    method, fuse_on = config.method, config.fuse_on
    if method not in EVIDENCE:
        raise FusebenchError(f"fusion method {method!r} cannot fuse; valid: {', '.join(EVIDENCE)}.")
    if fuse_on not in FUSE_ON:
        raise FusebenchError(f"fuse_on={fuse_on!r} is not valid; valid: {', '.join(FUSE_ON)}.")
    weights = [1.0] * len(ids) if weights is None else list(weights)
    evidence = torch.cat([weighted_evidence(s.to(torch.float32), i >= 0, config, w)
                          for i, s, w in zip(ids, scores, weights)], dim=1)
    all_ids = torch.cat(ids, dim=1)
    bits = torch.cat([torch.full_like(i, 1 << m) for m, i in enumerate(ids)], dim=1)
    if fuse_on == "source_object":
        fused, positions, bits_by_id = _sum_by_id(all_ids, evidence, bits, len(ids), config.combine)
        out_scores, out_positions = sort_desc_with_tiebreak(fused, positions)
        bits = torch.zeros_like(bits).scatter_(1, positions, bits_by_id)
    else:
        fused = evidence.masked_fill(all_ids < 0, float("-inf"))
        out_scores, out_positions = sort_desc_with_tiebreak(fused)
    out_scores, out_positions = out_scores[:, :final_k], out_positions[:, :final_k]
    pad = out_scores == float("-inf")
    return FusedLists(ids=all_ids.gather(1, out_positions).masked_fill_(pad, -1), scores=out_scores,
                      contributors=bits.gather(1, out_positions).masked_fill_(pad, 0))


def fuse_in_blocks(ids: list[torch.Tensor], scores: list[torch.Tensor], config: FusionConfig, final_k: int,
                   weights: list[float] | None = None, max_entries: int = 1 << 17) -> FusedLists:
    """``fuse`` over row blocks so that long lists (top_k = all) never hold more than ``max_entries`` at once."""
    rows = ids[0].shape[0]
    width = sum(t.shape[1] for t in ids)
    step = max(1, max_entries // width)
    blocks = [fuse([t[r:r + step] for t in ids], [t[r:r + step] for t in scores], config, final_k, weights)
              for r in range(0, rows, step)]
    if len(blocks) == 1:
        return blocks[0]
    return FusedLists(*(torch.cat([getattr(b, f) for b in blocks]) for f in ("ids", "scores", "contributors")))
