"""What a report calls a retriever, and when two runs hold the same one.

A retriever is its factors (:func:`retriever_factors`: the models, their text settings and weights, the method,
the key, every other fusion setting one factor each, the search backend) on one corpus; two runs hold the same
retriever only when, besides, their saved ranks are the same file (``metrics.json`` records each rank file's
sha256): a setting no record keeps (a model's .npy rewritten in place, a sim seed an older record lacks) makes two
retrievers, never one row with one run's numbers. Each distinct retriever is reported once
(:func:`unique_retrievers`), and every label is unique on its corpus (:func:`retriever_labels`): retrievers that
:func:`describe` would call alike get the settings that differ between them in brackets, then their ranks'
digest when nothing recorded differs.
"""

from __future__ import annotations

import json
from dataclasses import fields

from fusebench import DIRECTIONS
from fusebench.fusion.config import FusionConfig, flat_settings, moved_keys
from fusebench.report.index_effects import EXACT, search_label
from fusebench.report.labels import distinct
from fusebench.report.runs import Run

# every fusion setting besides the method, the key and the preset label, each its own factor (older records:
# the defaults; a method's own setting that was a flat key, rrf_k or ddof, under that key: config.flat_settings), so
# that two fusions differing in any of them (rrf_k, combine, a floor, ...) are two retrievers
FUSION_SETTINGS = [f.name for f in fields(FusionConfig) if f.name not in ("method", "fuse_on", "preset")]
assert set(moved_keys()) <= set(FUSION_SETTINGS)


def retriever_factors(run: Run, name: str) -> dict:
    """What a retriever is, as comparable factors (dataset aside)."""
    result = run.record.retrievers[name]
    spec = result.spec
    if result.is_fusion:
        members = [run.record.retrievers[m].spec for m in result.members]
        fusion = spec.fusion
        flat = flat_settings(fusion)
        return {"kind": "fusion", "model": json.dumps([m.identity() for m in members], sort_keys=True),
                "text": json.dumps([m.text for m in members], sort_keys=True),
                "weights": json.dumps([m.weight for m in members]),
                "method": fusion.preset or fusion.method, "fuse_on": fusion.fuse_on,
                **{key: json.dumps(flat[key], sort_keys=True, default=str) for key in FUSION_SETTINGS},
                "search": search_label(run, name)}
    return {"kind": "single", "model": json.dumps(spec.identity(), sort_keys=True),
            "text": json.dumps(spec.text, sort_keys=True), "search": search_label(run, name)}


def ranks_digest(run: Run, name: str) -> str | None:
    """The sha256 of the retriever's saved rank files, as its metrics.json records them (None: an older record)."""
    found = [run.record.files.get(f"ranks/{name}.{d}.npy") for d in DIRECTIONS]
    return None if None in found else "+".join(found)


def retriever_key(run: Run, name: str) -> tuple:
    """One retriever on one corpus: the corpus, the factors and the ranks' digest."""
    return run.dataset_key, json.dumps(retriever_factors(run, name), sort_keys=True), ranks_digest(run, name)


def unique_retrievers(runs: list[Run]) -> list[tuple[Run, str]]:
    """Each distinct retriever once per corpus (a single model evaluated in several jobs counts once; so does one
    fusion in jobs that differ only in, say, the bootstrap seed), in the runs' order."""
    seen, out = set(), []
    for run in runs:
        for name in run.record.retrievers:
            key = retriever_key(run, name)
            if key not in seen:
                seen.add(key)
                out.append((run, name))
    return out


def _short(run: Run, name: str) -> str:
    text = run.record.retrievers[name].spec.text
    extra = [text["case"]] if text.get("case", "as_typed") != "as_typed" else []
    if text.get("template"):
        extra.append(f"template={text['template']!r}")
    return name + (f" ({', '.join(extra)})" if extra else "")


def describe(run: Run, name: str) -> str:
    """A retriever's base label: its name (and text settings), or its method, key, top_k and members."""
    result = run.record.retrievers[name]
    search = "" if search_label(run, name) == EXACT else f" on {search_label(run, name)}"
    if result.is_fusion:
        parts = [_short(run, m) for m in result.members]
        fusion = result.spec.fusion
        return (f"fused {fusion.preset or fusion.method} by {fusion.fuse_on} top_k={fusion.top_k} "
                f"[{' + '.join(parts)}]{search}")
    return _short(run, name) + search


def settings_of(run: Run, name: str) -> dict[str, str]:
    """The settings a label may add: every fusion setting, each member's weight and model settings."""
    result = run.record.retrievers[name]
    members = result.members or [name]
    out = {}
    for m in members:
        spec = run.record.retrievers[m].spec
        prefix = f"{m}." if result.is_fusion else ""
        out.update({f"{prefix}{k}": json.dumps(v, sort_keys=True, default=str) if not isinstance(v, str) else v
                    for k, v in spec.identity().items()})
        out[f"{prefix}weight"] = f"{spec.weight:g}"
    if result.is_fusion:
        flat = flat_settings(result.spec.fusion)
        out.update({key: json.dumps(flat[key], sort_keys=True, default=str) for key in FUSION_SETTINGS if key != "top_k"})
    return out


def retriever_labels(runs: list[Run]) -> dict[tuple, str]:
    """(run path, retriever name) -> its label, unique among the distinct retrievers of its corpus."""
    keys = {}
    for run in runs:
        for name in run.record.retrievers:
            keys[(run.path, name)] = (run, name, retriever_key(run, name))
    out = {}
    for dataset in {k[0] for _, _, k in keys.values()}:
        first = {}
        for run, name, key in keys.values():
            if key[0] == dataset and key not in first:
                first[key] = (run, name)
        bases = {key: describe(*rn) for key, rn in first.items()}
        facts = {key: settings_of(*rn) for key, rn in first.items()}
        digests = {key: key[2] or "unknown" for key in first}
        labels = distinct(bases, facts, digests, tag="ranks")
        out.update({where: labels[key] for where, (_, _, key) in keys.items() if key[0] == dataset})
    return out
