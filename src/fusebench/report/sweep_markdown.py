"""A sweep's report as text: summary.md (its sections, each a small function of the typed
:class:`~fusebench.report.sweep.SweepSummary`) and the CSV tables beside it."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

from fusebench.evaluation.comparisons import format_p, level_label

if TYPE_CHECKING:
    from fusebench.report.sweep import SweepSummary


def markdown(report: SweepSummary) -> str:
    """summary.md: the runs, recall, paired gains, fusions ranked, the article, tuned runs, extra positives, cost."""
    from fusebench.report.sweep import ranked_fusions

    ranked = ranked_fusions(report.gains, report.ks[0])
    return "\n".join(_head(report) + _recall(report) + _gains(report) + _section(
        f"## Fusions ranked (t2i R@{report.ks[0]} gain over each one's best single model, "
        f"{level_label(report.level)} intervals)", ranked) + _section(
        "## Beside the article (its reported numbers: fusebench/data/article_reference.json)", report.beside_article)
        + _section("## Tuned runs (settings chosen on a tuning split, then evaluated once on test)", report.tuned)
        + _positives(report) + _cost(report))


P_COLUMNS = ("p_value", "p_holm")


def _table(rows: list[dict], columns: list[str]) -> str:
    def cell(v, column: str):
        if v is None:
            return "-"
        if column in P_COLUMNS:
            return format_p(v)
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e-3 and v != 0 else f"{v:.2f}"
        return str(v).replace("|", "/")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c), c) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def csv_text(rows: list[dict]) -> str:
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


GAIN_COLUMNS = ["dataset", "factor", "candidate", "baseline", "direction", "k", "gain", "ci_low", "ci_high",
                "cluster_ci_low", "cluster_ci_high", "wins", "losses", "p_value", "p_holm"]


def _head(report: SweepSummary) -> list[str]:
    failed = report.failed
    lines = [f"# Sweep summary: {report.folder}", "",
             f"{len(report.runs)} finished runs" + (f", {len(failed)} failed: {', '.join(failed)}" if failed else "")
             + ".", ""]
    return lines + ([f"- {name}: {why}" for name, why in report.reasons.items()] + [""] if failed else [])


def _recall(report: SweepSummary) -> list[str]:
    metric_cols = [c for c in (report.article[0] if report.article else {}) if c != "retriever"]
    return ["## Recall (percent)", "", _table(report.article, ["retriever", *metric_cols]), ""]


def _gains(report: SweepSummary) -> list[str]:
    rows = report.headline_gains
    return [f"## Paired gains at R@{report.ks[0]} (points; {level_label(report.level)} bootstrap intervals over "
            f"queries and over images, {report.draws} draws; McNemar p, Holm-adjusted over the whole sweep)", "",
            _table(rows, GAIN_COLUMNS) if rows else "No pairs of runs differ in exactly one factor.", "",
            "All k in gains.csv.", ""]


def _section(title: str, rows: list[dict]) -> list[str]:
    """A titled table of ``rows`` (their keys the columns), or nothing without rows."""
    return [title, "", _table(rows, list(rows[0])), ""] if rows else []


def _positives(report: SweepSummary) -> list[str]:
    if not report.positives:
        return []
    gains = report.positive_gains
    return [*_section("## Extra positives (ECCV Caption, CxC: false negatives of the split corrected; percent)",
                      report.positives),
            "Gains on them (each run's fused vs single comparisons, its own draws and intervals):", "",
            _table(gains, list(gains[0])) if gains else "No fusions.", ""]


def _cost(report: SweepSummary) -> list[str]:
    return ["## Cost", "", _table(report.cost, list(report.cost[0]) if report.cost else ["retriever"]), ""]
