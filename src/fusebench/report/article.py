"""The reference study's reported numbers (``data/article_reference.json``), placed beside a run's own.

A job of the article experiments carries ``reference: {dataset, study}`` (set by ``conf/experiment/article_*``
and ``conf/study/*``); ``fusebench.config.reference.reference_row`` finds the article's row for it when the
config is checked, and :func:`reference_lines` prints it beside the run's numbers, marked when the run is
simulated (the article's numbers are for real models on real data).
"""

from __future__ import annotations

from fusebench.evaluation.record import RunRecord


def beside_article(record: RunRecord) -> dict | None:
    """The run's numbers beside the article's row for it: t2i R@1 of the job's headline retriever (its fusion,
    else its model) and, for rows with a gain, the run's gain over the same model (None when not comparable)."""
    row = record.reference
    if not row:
        return None
    name = record.headline
    out = {"dataset": row["dataset"], "study": row["study"], "label": row.get("label", row["study"]),
           "retriever": name, "simulated": record.simulated, "t2i_r1": record.retrievers[name].recall("t2i", 1),
           "article_t2i_r1": row.get("t2i_r1"), "article_gain": row.get("gain_t2i_r1"), "article_ci": row.get("ci"),
           "article_won": row.get("won"), "article_lost": row.get("lost"), "baseline": row.get("baseline_model"),
           "baseline_study": row.get("baseline"),
           "note": row.get("note")}
    c = record.comparison(name, out["baseline"], "t2i", 1) if record.fusions and out["baseline"] else None
    out.update(gain=c.gain if c else None, ci=[c.ci_low, c.ci_high] if c else None, won=c.wins if c else None,
               lost=c.losses if c else None)
    return out


def reference_lines(record: RunRecord) -> list[str]:
    """The article's row beside this run's numbers, for the printed table."""
    b = beside_article(record)
    if b is None:
        return []
    flag = " [this run is SIMULATED: the article's numbers are real models on real data]" if b["simulated"] else ""
    lines = [f"the article ({b['dataset']}, {b['label']}){flag}:"]
    if b["article_t2i_r1"] is not None and b["t2i_r1"] is not None:
        lines.append(f"  t2i R@1: {b['t2i_r1']:.2f} here ({b['retriever']}), {b['article_t2i_r1']:.2f} in the article")
    if b["article_gain"] is not None:
        ci = f" [{b['article_ci'][0]:+.2f}, {b['article_ci'][1]:+.2f}]" if b["article_ci"] else ""
        counts = f", {b['article_won']} won / {b['article_lost']} lost" if b["article_won"] is not None else ""
        mine = (f"; here {b['gain']:+.2f} [{b['ci'][0]:+.2f}, {b['ci'][1]:+.2f}], {b['won']} won / {b['lost']} lost"
                if b["gain"] is not None else "")
        over = b["baseline"] or f"the {b['baseline_study']} job (the sweep report pairs the two jobs)"
        lines.append(f"  t2i R@1 gain over {over}: {b['article_gain']:+.2f}{ci}{counts} in the article{mine}")
    if b["note"]:
        lines.append(f"  ({b['note']})")
    return lines
