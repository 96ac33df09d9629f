"""The distractor-scaling study's recall: t2i R@k (its first k) against gallery size per retriever, with
Wilson intervals (a :class:`fusebench.report.scaling.ScalingReport`)."""

from __future__ import annotations

from pathlib import Path

from fusebench.evaluation.comparisons import level_label
from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import against_size


def scaling_recall(scaling, path: Path) -> Path | None:
    k, level = scaling.ks[0], level_label(scaling.level)
    several = len({r["study"] for r in scaling.recall}) > 1
    recall = [{**r, "line": f"{r['study']}: {r['retriever']}" if several else r["retriever"]} for r in scaling.recall]
    return against_size(recall, "line", f"t2i R@{k}", f"R@{k} low", f"R@{k} high",
                        f"t2i R@{k} (%), {level} Wilson interval", f"t2i R@{k} against gallery size",
                        scaling.simulated, path)


def draw(inputs, path: Path, params=None) -> Path | None:
    scaling = getattr(inputs.report, "scaling", None)
    return None if scaling is None else scaling_recall(scaling, path)


PLOT = register(Plot("scaling_recall.png", ("sweep",), draw, "when runs differ by gallery size: t2i R@1 against "
                     "gallery size per retriever (log x), with Wilson intervals", order=110))
