"""Per-query ranks, retriever A against retriever B: each t2i query's rank of its correct image under A (x) and
under B (y), log-log, with the queries B fixes (its image in B's top k, not in A's) and breaks (the reverse)
marked in two colours and counted in the legend. By default A is the best single model and B the run's fusion:
the queries behind the fusion's gain, one point each. Rank 0 in a ranks file (the image is not in the list: a
fused list is ``final_top_k`` long) is drawn on the "absent" line past the largest rank and never counts as in
the top k."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import TITLE_Y, run_title, save, subplots
from fusebench.runtime import checks

KEY = "QueryRanksParams"  # its settings are set from Python (no config key yet): messages name the dataclass


@dataclass
class QueryRanksParams:
    a: str | None = None  # the retriever on the x axis; None: the best single model at t2i R@k (else R@ its first k)
    b: str | None = None  # the retriever on the y axis; None: the run's fusion
    k: int = 1  # fixed: the image in B's top k and not in A's; broken: in A's and not in B's

    def __post_init__(self):
        self.a = checks.text(self.a, f"{KEY}.a", allow_none=True)
        self.b = checks.text(self.b, f"{KEY}.b", allow_none=True)
        self.k = checks.integer(self.k, f"{KEY}.k", 1)


def in_top(ranks: np.ndarray, k: int) -> np.ndarray:
    """Whether each query's correct image is in the top ``k`` (1-based ranks; 0 = absent from the list)."""
    ranks = np.asarray(ranks)
    return (ranks >= 1) & (ranks <= k)


def fixed_broken(ranks_a: np.ndarray, ranks_b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The queries B fixes (in B's top k, not in A's) and breaks (in A's top k, not in B's), as two masks."""
    a, b = in_top(ranks_a, k), in_top(ranks_b, k)
    return b & ~a, a & ~b


def retrievers(record, params: QueryRanksParams) -> tuple[str | None, str | None]:
    """A and B for ``record``: as set, or the best single model and the run's fusion (None when it has none)."""
    k = params.k if params.k in record.ks else record.ks[0]
    a = params.a if params.a is not None else record.best_single("t2i", k)
    b = params.b if params.b is not None else (record.fusions[0] if record.fusions else None)
    return a, b


def check(params: QueryRanksParams, inputs) -> None:
    """A and B, when set, are two different retrievers of the run."""
    names = list(inputs.record.retrievers)
    a = checks.choice(params.a, f"{KEY}.a", names, allow_none=True)
    b = checks.choice(params.b, f"{KEY}.b", names, allow_none=True)
    if a is not None and a == b:
        raise FusebenchError(f"{KEY}.a and {KEY}.b are both {a!r}: name two different retrievers")


def legend_labels(a: str, b: str, k: int, fixed: int, broken: int, total: int) -> tuple[str, str, str]:
    at = "rank 1" if k == 1 else f"the top {k}"
    return (f"fixed: {fixed} queries ({at} under {b}, not under {a})",
            f"broken: {broken} queries ({at} under {a}, not under {b})",
            f"the other {total - fixed - broken} queries")


def query_ranks(ranks_a: np.ndarray, ranks_b: np.ndarray, a: str, b: str, k: int, title: str, path: Path) -> Path:
    fixed, broken = fixed_broken(ranks_a, ranks_b, k)
    absent = 2.0 * max(2, int(max(ranks_a.max(initial=1), ranks_b.max(initial=1))))  # the "absent" line
    x, y = np.where(ranks_a >= 1, ranks_a, absent), np.where(ranks_b >= 1, ranks_b, absent)
    labels = legend_labels(a, b, k, int(fixed.sum()), int(broken.sum()), len(x))
    other = ~(fixed | broken)
    fig, ax = subplots(figsize=(7, 6.5))
    for mask, size, color, label in ((other, 6, "lightgray", labels[2]), (fixed, 10, "tab:green", labels[0]),
                                     (broken, 10, "tab:red", labels[1])):
        points = np.unique(np.stack([x[mask], y[mask]], axis=1), axis=0)  # ranks repeat: each point drawn once
        ax.scatter(points[:, 0], points[:, 1], s=size, color=color, label=label)
    ax.plot([1, absent], [1, absent], color="black", lw=0.8, linestyle=":")
    for line in (ax.axhline, ax.axvline):
        line(absent, color="gray", lw=0.6, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.8, absent * 1.3)
    ax.set_ylim(0.8, absent * 1.3)
    ax.set_xlabel(f"rank of the correct image under {a} (log; dashed: absent from the list)")
    ax.set_ylabel(f"rank under {b} (log)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"{title}\nt2i: each query's rank, {a} against {b}", fontsize=9, y=TITLE_Y)
    return save(fig, path)


def draw(inputs, path: Path, params: QueryRanksParams) -> Path | None:
    a, b = retrievers(inputs.record, params)
    if a is None or b is None or a == b:
        return None  # one retriever only (a run without fusion): nothing to compare
    ranks = [np.load(inputs.run_dir / "ranks" / f"{name}.t2i.npy") for name in (a, b)]
    return query_ranks(*ranks, a, b, params.k, run_title(inputs.record), path)


PLOT = register(Plot("query_ranks.png", ("run",), draw, "each t2i query's rank under the best single model against "
                     "under the fusion (log-log), the queries the fusion fixes (rank 1 under it, not under the "
                     "model) and breaks marked and counted", params=QueryRanksParams, check=check, order=80))
