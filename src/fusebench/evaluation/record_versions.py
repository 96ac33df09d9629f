"""Every layout of metrics.json fusebench has written, and :func:`migrate`: the one place that reads an older one as
today's. Every reader of a record (``RunRecord.from_json``, and through it the reports, the notebook helpers and the
run-dir checks) goes through it; nothing else knows which version lacked what.

=======  ===========================  ======================================================================
version  written                      what it changed, and how :func:`migrate` reads it
=======  ===========================  ======================================================================
1        first releases (2026-11-29)  no ``version`` key; ``files`` (the rank and topk files' sha256) only in
                                      the later ones; comparisons without ``level`` and ``draws``. Read:
                                      ``files`` {} when absent (no checksums to check), each comparison's
                                      ``level`` and ``draws`` those of the record's own ``eval`` block (what
                                      it ran with).
2        2026-11-30 to this change    ``version`` and ``files``. Settings added while version 2 was written
                                      are absent from records written before them, and ``fusion.ties``,
                                      ``fusion.params`` and ``eval.search_precision`` were written only
                                      when not their default. Read: each absent
                                      setting is the value that ran before the setting existed
                                      (``LATER_FUSION``, ``LATER_EVAL``, ``LATER_RUN``), in the top-level
                                      ``fusion`` block and in every fusion retriever's ``spec``; ``rrf_k``
                                      as a float (records before the typed configs wrote the YAML's ``60``,
                                      later ones ``60.0``: one retriever in a report, not two).
3        2026-12 to this change       every setting written, always, at its value (no key left out at its
                                      default), so a record means what it says without this table.
4        today (``RECORD_VERSION``)   a method's own settings only in its ``fusion.params``: ``rrf_k`` and
                                      ``rrf_weighting`` rrf's, ``ddof`` dbsf's and zscore's (issue 40, item
                                      3). Read: the flat ``rrf_k``, ``ddof``, ``rrf_weighting`` of the
                                      fusion block and of every fusion retriever's ``spec`` become
                                      ``params`` of the method that read them (``V3_READS``); a method that
                                      did not read them drops them (they held their defaults).
=======  ===========================  ======================================================================

A record of a version above ``RECORD_VERSION`` is refused (:class:`RecordVersionError`: the versions this fusebench
reads, and to upgrade), never guessed at. The fill values are the behaviour of the code before each setting existed,
frozen here: a default changed later in ``FusionConfig`` or ``EvalConfig`` does not change what an old record means.
"""

from __future__ import annotations

import copy

from fusebench.evaluation.subrecords import RecordError

RECORD_VERSION = 4
OLDEST_VERSION = 1
# fusion settings added after records existed (rrf_weighting and preset: the first engine presets; combine: CombMAX
# and CombMNZ; score_map, flat_score, floor, rrf_ranks: the engine presets' normalisations; ties: Milvus's id order;
# params: a method's own settings), each at what ran before it existed
LATER_FUSION = {"rrf_weighting": "multiply", "combine": "sum", "score_map": "none", "flat_score": None,
                "floor": None, "rrf_ranks": "own", "ties": "first", "preset": None, "params": {}}
# eval settings added after records existed: the item axis of the similarity blocks, the list store, the extra
# positives and the distractor tiles' precision
LATER_EVAL = {"item_chunk_size": 16384, "lists": {"store": True, "depth": 100, "max_scores_mb": 2048},
              "positives": [], "search_precision": "auto"}
# the run block's fields added after records existed (None / {}: not recorded)
LATER_RUN = {"search_seconds": None, "lists": {}, "similarity_blocks": None, "query_ms": None, "versions": {}}
# which version 3 methods read which flat fusion setting (frozen: the methods of that release)
V3_READS = {"rrf": ("rrf_k", "rrf_weighting"), "dbsf": ("ddof",), "zscore": ("ddof",)}
V3_FLAT = ("rrf_k", "ddof", "rrf_weighting")
V1_BOOTSTRAP = {"draws": 2000, "level": 0.95}  # version 1's eval defaults, for its comparisons' level and draws


class RecordVersionError(RecordError):
    """A metrics.json written by a newer fusebench (or naming a version none wrote)."""


def record_version(data: dict) -> int:
    """The record version ``data`` (a parsed metrics.json object) is; version 1 wrote none. Raises
    :class:`RecordVersionError` for a version this fusebench does not read."""
    version = data.get("version", OLDEST_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not OLDEST_VERSION <= version <= RECORD_VERSION:
        raise RecordVersionError(f"metrics.json is record version {version!r}; this fusebench reads record versions "
                                 f"{OLDEST_VERSION} to {RECORD_VERSION} (upgrade fusebench to read it)")
    return version


def _fill(block, later: dict) -> None:
    """Add to ``block`` (a mapping in the record; anything else is left for the typed readers to refuse) each key
    of ``later`` it lacks, a copy of its value; a nested mapping key by key."""
    if not isinstance(block, dict):
        return
    for key, value in later.items():
        if key not in block:
            block[key] = copy.deepcopy(value)
        elif isinstance(value, dict) and value and isinstance(block[key], dict):
            _fill(block[key], value)


def _comparisons(data: dict) -> list:
    """The record's comparisons (its recall ones and its extra positives' ones)."""
    return [c for block in ("comparisons", "positive_comparisons")
            for c in (data.get(block) if isinstance(data.get(block), list) else [])]


def _from_v1(data: dict) -> None:
    data.setdefault("files", {})
    settings = data.get("eval") if isinstance(data.get("eval"), dict) else {}
    boot = {key: settings.get(key, value) for key, value in V1_BOOTSTRAP.items()}
    for comparison in _comparisons(data):
        _fill(comparison, boot)


def _fusion_v2(block) -> None:
    """A version 2 (or 1) fusion block as version 3 holds it: every later setting, ``rrf_k`` a float."""
    if not isinstance(block, dict):
        return
    _fill(block, LATER_FUSION)
    if isinstance(block.get("rrf_k"), int) and not isinstance(block["rrf_k"], bool):
        block["rrf_k"] = float(block["rrf_k"])


def _fusion_blocks(data: dict) -> list:
    """The record's fusion blocks: the top-level one and every fusion retriever's ``spec``."""
    retrievers = data.get("retrievers")
    specs = [result.get("spec") if isinstance(result, dict) else None
             for result in (retrievers.values() if isinstance(retrievers, dict) else [])]
    return [data.get("fusion"), *(s for s in specs if isinstance(s, dict) and s.get("kind") == "fusion")]


def _from_v2(data: dict) -> None:
    for block in _fusion_blocks(data):
        _fusion_v2(block)
    if isinstance(data.get("eval"), dict):
        _fill(data["eval"], LATER_EVAL)
    if isinstance(data.get("run"), dict):
        _fill(data["run"], LATER_RUN)


def _fusion_v3(block) -> None:
    """A version 3 fusion block as version 4 holds it: its method's flat settings in its ``params``."""
    if not isinstance(block, dict) or not isinstance(block.get("params", {}), dict):
        return
    flat = {key: block.pop(key) for key in V3_FLAT if key in block}
    reads = V3_READS.get(block.get("method"), ())
    block["params"] = {**{key: flat[key] for key in reads if key in flat}, **block.get("params", {})}


def _from_v3(data: dict) -> None:
    for block in _fusion_blocks(data):
        _fusion_v3(block)


STEPS = {1: _from_v1, 2: _from_v2, 3: _from_v3}  # version -> what brings a record of it to the next version


def migrate(data) -> dict:
    """``data`` (a parsed metrics.json of any version fusebench wrote) as a record of ``RECORD_VERSION``: a new
    dict (``data`` is left as it was), each step of the table above applied in turn. A record of this version
    comes back equal. Not an object, or a version this fusebench does not read: :class:`RecordError`. What a
    damaged record lacks is left for the typed readers (``RunRecord.from_json``) to name."""
    if not isinstance(data, dict):
        raise RecordError(f"metrics.json holds a JSON {type(data).__name__}, not an object")
    version = record_version(data)
    out = copy.deepcopy(data)
    for step in range(version, RECORD_VERSION):
        STEPS[step](out)
    out.pop("version", None)
    return {"version": RECORD_VERSION, **out}
