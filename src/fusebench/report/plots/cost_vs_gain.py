"""A sweep's cost against gain: index bytes per image against the t2i R@1 gain over the best single model."""

from __future__ import annotations

from pathlib import Path

from fusebench.report.plots import Plot, register
from fusebench.report.plots._common import TITLE_Y, clip, save, subplots


def cost_vs_gain(cost: list[dict], article: list[dict], path: Path) -> Path | None:
    """Index bytes per image against the t2i R@1 gain over the best single model on the same dataset."""
    if not cost:
        return None
    recall: dict = {}
    for r in article:
        for column, value in r.items():
            if column.endswith(" t2i R@1") and value is not None:
                recall[(column.rsplit(" ", 2)[0], r["retriever"])] = value  # the corpus label, as cost rows have it
    fusion = {(row["dataset"], row["retriever"]): row.get("fusion", False) for row in cost}
    best: dict = {}  # the best single model per dataset at t2i R@1 (fusions are flagged in the cost rows)
    for (dataset, retriever), value in recall.items():
        if not fusion.get((dataset, retriever), False):
            best[dataset] = max(best.get(dataset, value), value)
    points = [(row, recall[(row["dataset"], row["retriever"])] - best[row["dataset"]]) for row in cost
              if (row["dataset"], row["retriever"]) in recall and row["dataset"] in best]
    if not points:
        return None
    fig, ax = subplots(figsize=(9, 5.5))
    for row, gain in points:
        ax.scatter(row["bytes_per_image_fp32"], gain, color="tab:orange" if row.get("fusion") else "tab:blue")
        ax.annotate(clip(f"{row['dataset']}: {row['retriever']}", 50), (row["bytes_per_image_fp32"], gain), fontsize=7)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("index bytes per image (fp32)")
    ax.set_ylabel("t2i R@1 minus the best single model's (points)")
    ax.set_title("cost vs gain (blue: single models, orange: fusions)", y=TITLE_Y)
    ax.grid(alpha=0.3)
    return save(fig, path)


def draw(inputs, path: Path, params=None) -> Path | None:
    return cost_vs_gain(inputs.report.cost, inputs.report.article, path)


PLOT = register(Plot("cost_vs_gain.png", ("sweep",), draw, "bytes per image against the t2i R@1 gain over the best "
                     "single model", order=100))
