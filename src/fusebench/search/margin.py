"""The certified-margin path: a gallery's distractor tiles scored in bf16 (or TF32) for candidates only, and every
entry that could change a list or a rank rescored in fp32, so lists and ranks equal the fp32 search's exactly.

The bound. Let q, v be fp32 rows (the evaluator's rows are L2-normalised: ||q||, ||v|| = 1 up to fp32 rounding),
x = q.v the exact dot product and s = fl32(q.v) the fp32 score the lists rank by (any summation order, with or
without fused multiply-adds). The standard inner-product bound (Higham, Accuracy and Stability, eq. 3.5) gives

    |s - x| <= gamma_d(2^-24) * sum_i |q_i v_i| <= gamma_d(2^-24) * ||q|| ||v||,   gamma_n(u) = n u / (1 - n u),

the last step by Cauchy-Schwarz. The low-precision product reads q~ = round(q), v~ = round(v):

* bf16 (8 significant bits, rounded to nearest here, by torch): |q_i - q~_i| <= 2^-8 |q_i|, so the residual
  e_q = q - q~ has ||e_q|| <= 2^-8 ||q||; the code uses each row's residual norm, computed exactly.
* TF32 (11 significant bits, converted by the hardware, which may truncate): |q_i - q~_i| < 2^-10 |q_i|, so
  ||e_q|| <= 2^-10 ||q|| and ||q~|| <= ||q||.

The products q~_i v~_i are exact in fp32 (8 + 8 and 11 + 11 significant bits are at most 24), so the accumulated
b = fl(q~.v~) satisfies |b - q~.v~| <= gamma_d(u_acc) ||q~|| ||v~|| with u_acc = 2^-23 (accumulation rounded to
nearest, or truncated as tensor cores may: one ulp). And q.v - q~.v~ = q~.e_v + e_q.v~ + e_q.e_v, so by
Cauchy-Schwarz once more

    |b - s| <= Delta = ||q~|| ||e_v|| + ||e_q|| ||v~|| + ||e_q|| ||e_v||
                       + gamma_d(2^-23) ||q~|| ||v~|| + gamma_d(2^-24) ||q|| ||v|| + out ||q~|| ||v~|| (1 + gamma_d(2^-23))
                       + 2 d 2^-126,

where ``out`` = 2^-8 when the product is only available rounded to bf16 (else 0) and the last term covers inputs
and products in the subnormal range (flushed or rounded). For unit rows in bf16 this is at most
2^-7 + 2^-16 + 3 d 2^-24 (about 0.0079 at d = 256); with the rows' own residual norms it is typically 0.0045.
The norms are computed in float64 and the thresholds rounded outward to fp32, so every comparison below is safe.

What is rescored, per row and tile (k = list depth, w = the row's running k-th fp32 score, -inf until k are
held, tau = the tile's k-th largest b, t = the row's target score, in fp32):

* an entry can enter the list only if s > w and s >= the tile's k-th largest s, which is at least tau - Delta:
  so only entries with b >= max(w - Delta, tau - 2 Delta) are candidates (rescored, then offered);
* a distractor ranks before the target iff s > t: surely when b > t + Delta, surely not when b < t - Delta;
  the entries in between are rescored and compared.

Rescoring runs as fp32 GEMMs over groups of ``GROUP`` rows and the union of their columns (at least
``MIN_COLUMNS``): on the CPU (MKL) such a product gives each entry the same bits as the tile's product (the
tests compare the two paths); a tile where a group would need more than half the columns is computed whole in
fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fusebench.runtime import state
from fusebench.search.exact import similarity

PRECISIONS = ("fp32", "bf16", "tf32")
GROUP = 16  # rows rescored by one fp32 product
MIN_COLUMNS = 32  # at least this many columns per rescoring product (MKL's general GEMM path)
U32, U_ACC, U_BF16, U_TF32 = 2.0**-24, 2.0**-23, 2.0**-8, 2.0**-10
TINY = 2.0**-126


def resolve_precision(precision: str | None, device: torch.device) -> str:
    """The similarity precision for distractor tiles: fp32 (exact throughout), bf16 or tf32 (certified margin).
    None: bf16 on CUDA, fp32 elsewhere (a CPU's bf16 product is no faster)."""
    if precision is None:
        return "bf16" if device.type == "cuda" else "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: valid values are {', '.join(PRECISIONS)}")
    return precision


def gamma(n: int, unit: float) -> float:
    return n * unit / (1 - n * unit)


@dataclass
class LowRows:
    """Rows as the low-precision product reads them, and the float64 norms the bound needs, per row."""

    low: torch.Tensor  # what the product multiplies (bf16 on CUDA; fp32 holding the rounded values elsewhere)
    norm: torch.Tensor  # ||x|| of the fp32 rows
    low_norm: torch.Tensor  # ||x~|| (an upper bound for TF32)
    residual: torch.Tensor  # ||x - x~|| (an upper bound for TF32)

    def rows(self, r0: int, r1: int) -> LowRows:
        return LowRows(self.low[r0:r1], self.norm[r0:r1], self.low_norm[r0:r1], self.residual[r0:r1])


def _truncated_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 values cut to TF32's 10 explicit mantissa bits (truncation: the worst a tensor core may do)."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def low_rows(x: torch.Tensor, precision: str) -> LowRows:
    """``x`` (fp32 rows) prepared for the low-precision product of ``precision`` (bf16 or tf32)."""
    norm = x.double().norm(dim=1)
    if precision == "bf16":
        rounded = x.to(torch.bfloat16)
        back = rounded.float()
        low = rounded if x.device.type == "cuda" else back
        return LowRows(low, norm, back.double().norm(dim=1), (x - back).double().norm(dim=1))  # x - back is exact
    low = x if x.device.type == "cuda" else _truncated_tf32(x)  # CUDA converts inside the product
    return LowRows(low, norm, norm * (1 + U_TF32), norm * U_TF32)


def approx_similarity(q: torch.Tensor, v: torch.Tensor, precision: str) -> tuple[torch.Tensor, float]:
    """``q @ v.T`` in the low precision, as fp32, and the relative rounding of its output (0 when the product
    returns fp32). On the CPU the rounded inputs are multiplied in fp32: exact products, fp32 accumulation,
    what a tensor core does."""
    state.current().similarity_blocks += 1
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" and q.device.type == "cuda" else "highest")
    try:
        if q.dtype == torch.bfloat16:
            try:
                return torch.mm(q, v.T, out_dtype=torch.float32), 0.0
            except (TypeError, RuntimeError, NotImplementedError):  # a torch without fp32 output for bf16
                return torch.mm(q, v.T).float(), U_BF16
        return torch.mm(q, v.T), 0.0
    finally:
        torch.set_float32_matmul_precision(previous)


def margin(q: LowRows, v: LowRows, dim: int, out_unit: float) -> torch.Tensor:
    """Per row of ``q``, a float64 bound on |b - s| over every row of ``v`` (the module docstring's Delta)."""
    v_low, v_res, v_norm = v.low_norm.max(), v.residual.max(), v.norm.max()
    g_acc, g32 = gamma(dim, U_ACC), gamma(dim, U32)
    bound = (q.low_norm * v_res + q.residual * v_low + q.residual * v_res + g_acc * q.low_norm * v_low
             + g32 * q.norm * v_norm + out_unit * (1 + g_acc) * q.low_norm * v_low + 2 * dim * TINY)
    return bound * (1 + 2.0**-40)  # over the float64 rounding of the norms and of this sum


def down32(x: torch.Tensor) -> torch.Tensor:
    """The largest fp32 at or below each float64 value."""
    y = x.float()
    return torch.where(y.double() > x, torch.nextafter(y, torch.full_like(y, -math.inf)), y)


def up32(x: torch.Tensor) -> torch.Tensor:
    """The smallest fp32 at or above each float64 value."""
    y = x.float()
    return torch.where(y.double() < x, torch.nextafter(y, torch.full_like(y, math.inf)), y)


def rescore(text: torch.Tensor, items: torch.Tensor, need: torch.Tensor) -> tuple[torch.Tensor, int]:
    """fp32 scores of (at least) the entries ``need`` marks in ``text @ items.T``, -inf elsewhere, and how many
    entries were computed. Rows go in groups of ``GROUP`` (the last row repeated to fill one), each group with
    the union of its rows' columns; groups are batched so the gathered rows stay within one tile's size."""
    rows, width = need.shape
    if not bool(need.any()):
        return torch.full((rows, width), -math.inf, device=need.device), 0
    groups = -(-rows // GROUP)
    padded = torch.zeros(groups * GROUP, width, dtype=torch.bool, device=need.device)
    padded[:rows] = need
    wanted = padded.view(groups, GROUP, width).any(dim=1)
    del padded
    columns = max(int(wanted.sum(dim=1).max()), MIN_COLUMNS)
    if 2 * columns >= width:
        return similarity(text, items), rows * width
    order = torch.sort(wanted.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :columns]
    members = torch.arange(groups * GROUP, device=need.device).clamp(max=rows - 1).view(groups, GROUP)
    grouped = torch.full((groups, GROUP, width), -math.inf, device=need.device)
    step = max(1, width // columns)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        for g0 in range(0, groups, step):
            cols = order[g0:g0 + step]
            scores = torch.bmm(text[members[g0:g0 + step]], items[cols].transpose(1, 2))
            grouped[g0:g0 + step].scatter_(2, cols[:, None, :].expand(-1, GROUP, -1), scores)
    finally:
        torch.set_float32_matmul_precision(previous)
    return grouped.view(groups * GROUP, width)[:rows], groups * GROUP * columns


def margin_block(text: torch.Tensor, q: LowRows, items: torch.Tensor, v: LowRows, precision: str,
                 worst: torch.Tensor, k: int, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One block of distractors (every item past every row's target): (the candidates' exact fp32 scores, -inf
    elsewhere; per row, how many entries score strictly above its ``target`` score in fp32; entries rescored).
    ``worst``: each row's running k-th fp32 score (-inf while its list fills)."""
    approx, out_unit = approx_similarity(q.low, v.low, precision)
    delta = margin(q, v, items.shape[1], out_unit)
    width = approx.shape[1]
    tau = torch.topk(approx, k, dim=1, sorted=False).values.amin(dim=1).double() if width > k \
        else torch.full_like(delta, -math.inf)
    floor = down32(torch.maximum(worst.double() - delta, tau - 2 * delta))
    candidate = approx >= floor[:, None]
    high, low = up32(target.double() + delta), down32(target.double() - delta)
    window = (approx >= low[:, None]) & (approx <= high[:, None])
    surely = (approx > high[:, None]).sum(dim=1)
    del approx
    exact, computed = rescore(text, items, candidate | window)
    ahead = surely + (window & (exact > target[:, None])).sum(dim=1)
    return exact.masked_fill_(~candidate, -math.inf), ahead, computed
