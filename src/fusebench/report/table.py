"""The short human-readable table printed at the end of a run."""

from __future__ import annotations

from fusebench import DIRECTIONS
from fusebench.evaluation.comparisons import format_p, level_label
from fusebench.evaluation.record import RunRecord
from fusebench.evaluation.search_record import tuning_words
from fusebench.report.article import reference_lines


def _fmt(value) -> str:
    return "   -  " if value is None else f"{value:6.2f}"


def _gain_line(pair: str, what: str, c) -> str:
    """One printed comparison: '  PAIR  WHAT: +gain [low, high]  W won / L lost  p=P'."""
    return (f"  {pair}  {what}: {c.gain:+6.2f} [{c.ci_low:+.2f}, {c.ci_high:+.2f}]  {c.wins} won / {c.losses} lost  "
            f"p={format_p(c.p_value)}")


def tune_lines(record: RunRecord) -> list[str]:
    """What the tuning split chose (tune mode), so the test numbers above are read as evaluated once."""
    t = record.tune
    if not t:
        return []
    where = (f"a seeded {100 * t.fraction:g}% of the images (seed {t.seed}), held out of the test corpus"
             if t.seeded else f"the {t.split} split")
    singles = ", ".join(f"{n} {v:.2f}" for n, v in t.singles.items())
    return ["", f"tuned on {where} ({t.n_images} images, {t.n_captions} captions) by {t.criterion}: "
                f"{len(t.curve)} settings, chosen {t.chosen.describe() or 'the configured one'} "
                f"({t.chosen.value:.2f} there; single models {singles}); the table above evaluates that one "
                "setting on test"]


def positive_lines(record: RunRecord) -> list[str]:
    """The extra-positive metrics (ECCV Caption, CxC) per retriever, and the fusion's paired gains on them."""
    if not record.positives:
        return []
    lines = []
    for name, counts in record.positives.items():
        metrics = [m for m in next(iter(record.retrievers.values())).positives.get(name, {}).get("t2i", {})
                   if m != "n_queries"]
        columns = [f"{d} {m}" for d in DIRECTIONS for m in metrics]
        width = max(22, *(len(n) + 2 for n in record.retrievers))
        lines += ["", f"{name} positives (false negatives corrected; {counts.t2i_queries} t2i / "
                      f"{counts.i2t_queries} i2t queries, {counts.captions_left_out} captions outside its gallery):",
                  f"{'retriever':<{width}}" + "".join(f"{c:>12}" for c in columns)]
        for retriever, result in record.retrievers.items():
            block = result.positives.get(name, {})
            lines.append(f"{retriever:<{width}}" + "".join(
                f"{_fmt(block.get(d, {}).get(m)):>12}" for d in DIRECTIONS for m in metrics))
        for c in record.positive_comparisons:  # against the best single model (all pairs: metrics.json)
            if c.metric.startswith(f"{name} ") and c.baseline == record.best_single(c.direction, 1):
                lines.append(_gain_line(f"{c.candidate} vs {c.baseline}", f"{c.direction} {c.metric.split(' ', 1)[1]}", c))
    return lines


def target_line(target: dict, direction: str, reported: float) -> str:
    """What ``search.target_recall`` chose and on what, beside the recall every reported query got: 'nprobe 77
    chosen for neighbour recall 0.95 on 1,000 captions of the dataset's val split (0.9535, lower bound 0.9524;
    tuning 4.6 s); every reported query: 0.9547, target reached'. Records written before the tuning queries were
    recorded (drawn from the reported queries themselves) say so."""
    queries = target.get("queries")
    if queries is None:
        where = f"{target['sample_queries']:,} of the reported queries themselves (a record of an older fusebench)"
        bound = ""
    else:
        where = tuning_words(queries, direction)
        bound = f", lower bound {target['sample_recall_low']:.4f}; tuning {target['seconds']:.1f} s"
    verdict = "target reached" if reported >= target["target_recall"] else "BELOW the target"
    return (f"{target['setting']} {target['value']} chosen for neighbour recall {target['target_recall']:g} on "
            f"{where} ({target['sample_recall']:.4f}{bound}); every reported query: {reported:.4f}, {verdict}")


def search_lines(record: RunRecord) -> list[str]:
    """An approximate backend's block: how close each model's index lists are to exact search, what it cost, and,
    for an engine, how its fused lists compare with fusebench's exact preset."""
    s = record.search
    if s is None:
        return []
    lines = ["", f"search: {s.label} ({s.version}); each model's list is {s.depth} deep: a first correct item past "
                 "it counts as missed; exact_fused = the same fusion over exact lists"]
    for model, by in s.models.items():
        for direction, q in by.items():
            cost = "".join([f", built in {q.build_seconds:.2f} s" if q.build_seconds is not None else "",
                            ", from the index store" if q.hit else "",
                            f", {q.index_bytes / 2**20:.1f} MiB" if q.index_bytes else "",
                            f", {q.query_ms:.3f} ms/query" if q.query_ms is not None else ""])
            lines.append(f"  {model} {direction}: neighbour recall@{q.depth} {q.neighbour_recall:.4f}, "
                         f"top-1 agreement {q.top1_agreement:.4f}{cost}")
            if q.target is not None:
                lines.append(f"    {target_line(q.target, direction, q.neighbour_recall)}")
    for direction, c in s.engine.items():
        latency = (f", latency median {c.latency_ms_median:.2f} ms / p95 {c.latency_ms_p95:.2f} ms"
                   if c.latency_ms_median is not None else "")
        lines.append(f"  engine {direction}: ingest {c.ingest_seconds:.1f} s, index {c.build_seconds:.1f} s, "
                     f"queries {c.search_seconds:.1f} s{latency}, {c.disk_bytes / 2**20:.1f} MiB on disk")
    for direction, p in s.parity.items():
        lines.append(f"  engine vs exact preset {direction}: identical top-1 {100 * p.identical_top1:.2f}%, top-10 "
                     f"{100 * p.identical_top10:.2f}% of {p.n_queries:,} queries; {p.differ} differ, {p.explained} "
                     f"of them by tied scores only" + (f" ({p.file})" if p.file else ""))
    if s.notes:
        lines.append(f"  {len(s.notes)} note{'s' if len(s.notes) > 1 else ''} on the backend's own rules (what "
                     "it searches, ties, score forms, limits): metrics.json search.notes, docs/search.md")
    return lines


def _gallery_source(gallery) -> str:
    """Where a gallery's distractors come from, for the table: the kind and seed; a manifest's caption-less lines
    (kind ``manifest``) have no seeded order."""
    if gallery.kind == "manifest":
        return "the manifest's caption-less lines, every one kept"
    return f"{gallery.kind}, seed {gallery.seed}"

def format_table(record: RunRecord) -> str:
    ks = record.ks
    dataset = record.dataset
    title = f"{dataset.name}: {dataset.n_images} images, {dataset.n_captions} captions"
    if dataset.nonstandard:
        title += "  [NON-STANDARD corpus: counts differ from the benchmark's; not comparable to published numbers]"
    if dataset.simulated:
        title += "  [SIMULATED DATA: synthetic embeddings, not real model results]"
    gallery = record.gallery
    if gallery is not None:
        undecodable = int(gallery.source.get("undecodable") or 0)
        dropped = (f", {gallery.near_duplicates:,} near-duplicates of test images dropped" if gallery.near_duplicates
                   else "") + (f", {undecodable:,} undecodable left out" if undecodable else "")
        title += (f"\ngallery: {dataset.n_images - gallery.distractors:,} test images + {gallery.distractors:,} "
                  f"distractors ({_gallery_source(gallery)}{dropped}); queries: the test split's")
    name_width = max(22, *(len(n) + 2 for n in record.retrievers))
    columns = [(d, k, f"{d} R@{k}") for d in DIRECTIONS for k in ks]
    width = {label: max(11, len(label) + 2) for _, _, label in columns}  # a space before every header, any k
    header = f"{'retriever':<{name_width}}" + "".join(f"{label:>{width[label]}}" for _, _, label in columns)
    header += f"{'mean R@1':>10}" if 1 in ks else ""
    lines = [title, header, "-" * len(header)]
    for name, result in record.retrievers.items():
        row = f"{name:<{name_width}}" + "".join(f"{_fmt(result.recall(d, k)):>{width[label]}}" for d, k, label in columns)
        row += f"{_fmt(result.recall('mean', 1)):>10}" if 1 in ks else ""
        lines.append(row)
    published = []
    for name, result in record.retrievers.items():
        block = {} if result.is_fusion else result.spec.published
        theirs = block.get(dataset.name) or {}
        for direction in DIRECTIONS:
            value = theirs.get(f"{direction}_r1")
            if value is not None and 1 in ks:
                where = ", ".join(x for x in (f"{theirs['protocol']} protocol" if theirs.get("protocol") else "",
                                              theirs.get("source") or block.get("source") or "source not given") if x)
                published.append(f"  {name} {direction} R@1: {result.recall(direction, 1):.2f} here, {value:.2f} "
                                 f"published ({where})")
    if published:
        lines += ["", "this run beside the published numbers (each with its protocol: paper = the authors' own "
                  "evaluation, clip_benchmark = CLIP_benchmark's):" if any("protocol" in p for p in published)
                  else "this run beside the published numbers:", *published]
    lines += search_lines(record)
    lines += tune_lines(record)
    lines += positive_lines(record)
    reference = reference_lines(record)
    if reference:
        lines += ["", *reference]
    gains = [c for c in record.comparisons if c.k == ks[0]]
    if gains:
        lines.append("")
        lines.append(f"paired gains at R@{ks[0]} ({level_label(record.level)} bootstrap interval over queries; "
                     "wins/losses):")
        width = max(len(f"{c.candidate} vs {c.baseline}") for c in gains)
        for c in gains:
            pair = f"{c.candidate} vs {c.baseline}"
            lines.append(_gain_line(f"{pair:<{width}}", c.direction, c))
    return "\n".join(lines)
