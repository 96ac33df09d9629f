"""The distractor-scaling study's gains: each fusion's t2i R@k gain (its first k) over its best single model
against gallery size, with its interval over queries (a :class:`fusebench.report.scaling.ScalingReport`)."""

from __future__ import annotations

from pathlib import Path

from fusebench.evaluation.comparisons import level_label
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import against_size


def scaling_gain(scaling, path: Path) -> Path | None:
    k, level = scaling.ks[0], level_label(scaling.level)
    several = len({r["study"] for r in scaling.recall}) > 1
    gains = [{**g, "line": f"{g['study']}: {g['fusion']}" if several else g["fusion"]} for g in scaling.gains
             if g["k"] == k]
    return against_size(gains, "line", "gain", "ci_low", "ci_high", f"t2i R@{k} minus the best single model's (points)",
                        f"fusion gain against gallery size ({level} CI over queries)", scaling.simulated, path)


def draw(inputs, path: Path, params=None) -> Path | None:
    scaling = getattr(inputs.report, "scaling", None)
    return None if scaling is None else scaling_gain(scaling, path)


PLOT = register(Plot("scaling_gain.png", ("sweep",), draw, "when runs differ by gallery size: each fusion's gain "
                     "over its best single model against gallery size, with its interval over queries", order=120))
