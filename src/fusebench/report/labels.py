"""What a report calls each corpus, so that rows of two corpora are told apart.

Runs pair only on one corpus (:attr:`fusebench.report.runs.Run.dataset_key`: the test split's content digest, the
gallery's size and source). Two corpora of one name (two ``dataset.seed`` values, two manifests, two gallery
seeds at one size) get the name plus what differs between them: ``sim (simulated) [sim_seed=1]``,
``coco5k +2,000 distractors [gallery seed=3]``; when no recorded setting differs (two manifests of one name
and path, rewritten between runs), the digest's first characters.
"""

from __future__ import annotations

import json

from fusebench.report.runs import Run

HIDDEN = frozenset({"simulated", "nonstandard", "test_images"})  # said in the name already, or a gallery's count


def base_label(run: Run) -> str:
    """The dataset's name, flags and distractors ('coco5k +100,000 distractors', 'sim (simulated)')."""
    d = run.record.dataset
    label = d.name + (" (simulated)" if d.simulated else "") + (" (non-standard)" if d.nonstandard else "")
    gallery = run.record.gallery
    return label if gallery is None else f"{label} +{gallery.distractors:,} distractors"


def settings(run: Run) -> dict[str, str]:
    """The facts that tell one corpus from another of its name: counts, the loader's facts (simulation
    parameters, split, source) and the gallery's (kind, seed, threshold, source), flattened to text."""
    d = run.record.dataset
    out = {"images": f"{run.n_test:,}", "captions": f"{d.n_captions:,}"}
    out.update({k: _text(v) for k, v in d.meta.items() if k not in HIDDEN and not k.startswith("gallery_")})
    gallery = run.record.gallery
    if gallery is not None:
        out.update({"gallery": gallery.kind, "gallery seed": str(gallery.seed),
                    "gallery.near_duplicate": _text(gallery.near_duplicate)})
        out.update({f"gallery {k}": _text(v) for k, v in json.loads(gallery.identity)["source"].items()})
    return out


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def distinct(bases: dict, facts: dict[object, dict[str, str]], digests: dict[object, str], tag: str = "corpus") -> dict:
    """``bases`` (key -> label) made unique: keys sharing a label get the facts that differ among them in
    brackets, then (when none differs) their digests' first characters (``[tag abcdef0123]``)."""
    groups: dict[str, list] = {}
    for key, label in bases.items():
        groups.setdefault(label, []).append(key)
    out = {}
    for label, keys in groups.items():
        if len(keys) == 1:
            out[keys[0]] = label
            continue
        names = list(dict.fromkeys(n for k in keys for n in facts[k]))
        differing = [n for n in names if len({facts[k].get(n) for k in keys}) > 1]
        for key in keys:
            shown = [f"{n}={facts[key].get(n, '-')}" for n in differing]
            out[key] = f"{label} [{', '.join(shown)}]" if shown else label
        seen: dict[str, list] = {}
        for key in keys:
            seen.setdefault(out[key], []).append(key)
        for same in (ks for ks in seen.values() if len(ks) > 1):
            for key in same:
                out[key] = f"{out[key]} [{tag} {digests[key][:10]}]"
    return out


def dataset_labels(runs: list[Run]) -> dict[tuple, str]:
    """Each corpus of ``runs`` (by :attr:`Run.dataset_key`) -> its label, unique among them."""
    bases, facts, digests = {}, {}, {}
    for run in runs:
        key = run.dataset_key
        if key not in bases:
            bases[key] = base_label(run)
            facts[key] = settings(run)
            digests[key] = run.record.dataset.digest or json.dumps(key, default=str)
    return distinct(bases, facts, digests)


def study_labels(studies: dict[object, tuple[str, Run]]) -> dict:
    """Scaling studies (key -> (label, a run of it)) labelled uniquely by what differs between their runs'
    test splits and distractor sources."""
    bases = {key: label for key, (label, _) in studies.items()}
    facts = {key: settings(run) for key, (_, run) in studies.items()}
    digests = {key: run.record.dataset.digest or str(key) for key, (_, run) in studies.items()}
    return distinct(bases, facts, digests)
