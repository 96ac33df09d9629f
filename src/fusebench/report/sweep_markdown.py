"""A sweep's report as text: summary.md (its sections, each a small function of the typed
:class:`~fusebench.report.sweep.SweepSummary`) and the CSV tables beside it."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

from fusebench.evaluation.comparisons import format_p, level_label
from fusebench.report.index_effects import markdown_section

if TYPE_CHECKING:
    from fusebench.report.sweep import SweepSummary


def markdown(report: SweepSummary) -> str:
    """summary.md: the runs, recall, the scaling and index-effects studies, paired gains, fusions ranked, the
    article, tuned runs, extra positives, cost."""
    from fusebench.report.sweep import ranked_fusions  # lazy: cycle (report.sweep imports this one)

    ranked = ranked_fusions(report.gains, report.ks[0])
    return "\n".join(_head(report) + _recall(report) + _scaling(report) + _index_effects(report) + _gains(report) + _section(
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
    failed, damaged = report.failed, report.damaged
    lines = [f"# Sweep summary: {report.folder}", "",
             f"{len(report.runs)} finished runs" + (f", {len(failed)} failed: {', '.join(failed)}" if failed else "")
             + (f", {len(damaged)} damaged: {', '.join(damaged)}" if damaged else "") + ".", ""]
    return lines + ([f"- {name}: {why}" for name, why in report.reasons.items()] + [""] if report.reasons else [])


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


def _interval(row: dict, value: str, low: str, high: str, signed: bool = False) -> str:
    """'56.30 [55.69, 56.91]' (or '-' without a value)."""
    if row.get(value) is None:
        return "-"
    form = "{:+.2f}" if signed else "{:.2f}"
    return f"{form.format(row[value])} [{form.format(row[low])}, {form.format(row[high])}]"


def _scaling(report: SweepSummary) -> list[str]:
    """The distractor-scaling study: recall per retriever at every gallery size, fusion gains, paired changes
    from the smallest gallery, the extrapolation and its check (fusebench.report.scaling)."""
    s = report.scaling
    if s is None:
        return []
    level = level_label(s.level)
    flag = " [SIMULATED: simulated models and distractors, not real results]" if s.simulated else ""
    lines = [f"## Distractor scaling{flag}", "",
             "t2i only: distractors carry no captions, so they ask no i2t query and i2t is unchanged. "
             f"Intervals: {level} (recall: Wilson; gains and changes: bootstrap over queries, and over images). "
             "Plots: plots/scaling_recall.png, plots/scaling_gain.png; every table in scaling_*.csv. Distractors: "
             "those in the gallery, after near-duplicates of test images were dropped (of the number asked).", ""]
    studies = list(dict.fromkeys(r["study"] for r in s.recall))
    if len(studies) == 1:
        lines += [f"Study: {studies[0]}.", ""]
    for (study, retriever) in dict.fromkeys((r["study"], r["retriever"]) for r in s.recall):
        rows = [r for r in s.recall if (r["study"], r["retriever"]) == (study, retriever)]
        table = [{"distractors": f"{r['distractors']:,}" + (f" (of {r['asked']:,})" if r["asked"] != r["distractors"]
                                                             else ""),
                  "gallery images": f"{r['gallery images']:,}",
                  **{f"t2i R@{k}": _interval(r, f"t2i R@{k}", f"R@{k} low", f"R@{k} high") for k in s.ks}}
                 for r in rows]
        lines += [f"### {retriever}" + (f" ({study})" if len(studies) > 1 else ""), "", _table(table, list(table[0])),
                  ""]
    k = s.ks[0]
    gains = [{"study": g["study"], "fusion": g["fusion"], "distractors": f"{g['distractors']:,}", "over": g["over"],
              f"gain t2i R@{k}": _interval(g, "gain", "ci_low", "ci_high", True),
              "over images": _interval(g, "gain", "cluster_ci_low", "cluster_ci_high", True),
              "won/lost": f"{g['wins']}/{g['losses']}", "p_value": g["p_value"]} for g in s.gains if g["k"] == k]
    lines += _section(f"### Each fusion's gain over its best single model at every size (t2i R@{k}, points; "
                      "each run's own comparison)", _one_study(gains))
    changes = [{"study": c["study"], "retriever": c["retriever"], "from": f"{c['from']:,}", "to": f"{c['to']:,}",
                f"change t2i R@{k}": _interval(c, "change", "ci_low", "ci_high", True),
                "over images": _interval(c, "change", "cluster_ci_low", "cluster_ci_high", True),
                "found/lost": f"{c['gained']}/{c['lost']}", "p_value": c["p_value"]}
               for c in s.changes if c["k"] == k]
    lines += _section(f"### Change from the smallest gallery (t2i R@{k}, points; paired query by query: the same "
                      "queries at every size)", _one_study(changes))
    extrapolated = [{"study": e["study"], "model": e["model"], "from": f"{e['from']:,}", "to": f"{e['to']:,}",
                     "step": f"x{e['step']:.3g}", "predicted R@1": _interval(e, "predicted R@1", "low", "high"),
                     "measured R@1": "-" if e["measured R@1"] is None else f"{e['measured R@1']:.2f}",
                     "check": e["check"]} for e in s.extrapolation]
    title = (f"### Extrapolated t2i R@1 ({level} bootstrap interval over test images and distractors; a row with "
             "a measured R@1 is a check, a measured size predicted from a smaller one, at the printed prediction's "
             "step where the sizes allow; the prediction past the largest is withheld when a check missed or "
             "could not be made, or when the largest gallery is larger than those its coverage was measured from "
             "(docs/galleries.md), and says what the checks that held support: checked at the step, checked only "
             "at a shorter one, or unchecked)")
    assumption = ("Method: the tail above each query's threshold, from its saved list at N: the mean of a shape "
                  "pooled over the queries (each query's excesses over its own scale) and an exponential tail per "
                  "query; assumes the galleries nest and that each query's distractor scores above its threshold "
                  "follow such a tail (docs/galleries.md). Never past the source's size; single models only.")
    lines += _section(title, _one_study(extrapolated)) + [assumption, ""] if extrapolated else [
        "### Extrapolated t2i R@1", "", "None: no model could be extrapolated (why: under 'Not compared' below).", ""]
    if s.refused:
        lines += ["Not compared:", "", *[f"- {why}" for why in s.refused], ""]
    return lines


def _index_effects(report: SweepSummary) -> list[str]:
    """The index-effects study: each search backend's fusion gain and what it kept (fusebench.report.index_effects)."""

    return markdown_section(getattr(report, "index_effects", None))


def _one_study(rows: list[dict]) -> list[dict]:
    """``rows`` without their study column when they all belong to one study (its name heads the section)."""
    if len({r["study"] for r in rows}) > 1:
        return rows
    return [{k: v for k, v in r.items() if k != "study"} for r in rows]
