"""The search group's checks (each bad setting one line naming the key and what is valid, before any work) and
the engine-parity functions against the obvious loops."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers.tiers import fast_first

from fusebench import FusebenchError
from fusebench.app.run_config import run_config
from fusebench.config.search import SearchConfig, auto_nlist, check_depth, check_sizes, pq_layout, resolve_pq_m
from fusebench.evaluation.parity import identical_at, parity, tie_explained


def _refused(compose_cfg, overrides: list[str], *fragments: str) -> str:
    with pytest.raises(FusebenchError) as err:
        run_config(compose_cfg(overrides))
    message = str(err.value)
    assert "\n" not in message and "secret" not in message  # a credential typed into a value is never echoed
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.slow  # ten compositions (the fast tier composes one option in test_settings_the_index_reads_are_accepted)
def test_every_search_option_composes_and_engines_take_their_preset(compose_cfg):
    expected = {"exact": ("exact", "dbsf"), "faiss_hnsw": ("faiss", "dbsf"), "faiss_ivf_pq": ("faiss", "dbsf"),
                "milvus": ("milvus", "rrf"), "lancedb": ("lancedb", "rrf"), "qdrant": ("qdrant", "dbsf")}
    for option, (backend, method) in expected.items():
        config = run_config(compose_cfg([f"search={option}"]))
        assert (config.search.backend, config.fusion.method) == (backend, method)
    assert run_config(compose_cfg(["search=milvus"])).fusion.preset == "milvus_rrf"
    assert run_config(compose_cfg(["search=qdrant"])).fusion.preset == "qdrant_dbsf"
    # the command line's fusion wins over the engine option's default preset
    assert run_config(compose_cfg(["search=milvus", "fusion=milvus_weighted"])).fusion.preset == "milvus_weighted"
    assert run_config(compose_cfg(["fusion=qdrant_rrf", "search=qdrant"])).fusion.preset == "qdrant_rrf"


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("overrides,fragments", fast_first([  # a composition each: the fast tier keeps one
    (["search=faiss_ivf_flat", "search.nlist=4", "search.nprobe=8"], ("search.nprobe=8", "1..4")),
    (["search=faiss_hnsw", "search.ef_search=50"], ("search.ef_search=50", ">= 100")),
    (["search=faiss_hnsw", "fusion.top_k=300", "search.ef_search=256"], ("search.ef_search=256", ">= 300")),
    (["search=qdrant", "search.index=hnsw"], ("search.index=hnsw", "valid: flat")),
    (["search=milvus", "search.index=ivf_pq"], ("search.index=ivf_pq", "flat, ivf_flat, hnsw")),
    (["search=exact", "search.index=hnsw"], ("search.index=hnsw",)),
    (["search=milvus", "fusion=dbsf"], ("fusion=milvus_rrf | fusion=milvus_weighted",)),
    (["search=lancedb", "fusion=qdrant_rrf"], ("fusion=lancedb_rrf", "another engine's")),
    (["search=milvus", "fusion.rrf_k=10"], ("fusion=milvus_rrf",)),
    (["search=lancedb", "fusion.fuse_on=document"], ("fusion.fuse_on=document", "source_object")),
    (["search=faiss_hnsw", "fusion.top_k=null"], ("fusion.top_k",)),
    (["search=faiss_ivf_flat", "search.max_memory_gb=1"], ("search.max_memory_gb only over a gallery",)),
    (["search=faiss_flat", "tune=weights"], ("search=exact",)),
    (["search=milvus", "models.sim_dfn5b_like.weight=2"],
     ("milvus_rrf takes no per-model weights", "valid: equal weights, or fusion=milvus_weighted, or fusion=milvus_weighted_ip.")),
    (["search=qdrant", "models.sim_dfn5b_like.weight=2"], ("qdrant",)),
    (["search=faiss_ivf_pq", "search.nbits=16"], ("search.nbits=16", "4..12")),
    (["search=faiss_ivf_pq", "search.target_recall=1.5"], ("search.target_recall=1.5", "> 0 and <= 1")),
    (["search=exact", "search.target_recall=0.95"], ("search.target_recall=0.95", "search=exact")),
    (["search=faiss_flat", "search.target_recall=0.95"], ("search.target_recall=0.95 is never read",)),
    (["search=faiss_flat", "search.backend=annoy"], ("search.backend='annoy'", "faiss")),
    # a setting the chosen index or backend never reads is refused, naming the ones that read it
    (["search=faiss_flat", "search.nprobe=8"], ("search.nprobe=8 is never read with search.index=flat",
                                                 "search.index=ivf_flat | ivf_pq")),
    (["search=faiss_hnsw", "search.nlist=10"], ("search.nlist=10 is never read with search.index=hnsw",)),
    (["search=faiss_ivf_flat", "search.ef_search=300"], ("search.ef_search=300", "search.index=hnsw")),
    (["search=faiss_ivf_flat", "search.pq_m=8"], ("search.pq_m=8", "search.index=ivf_pq")),
    (["search=exact", "search.threads=2"], ("search.threads=2 is never read with search.backend=exact",)),
    (["search=faiss_hnsw", "search.batch_size=10"], ("search.batch_size=10", "milvus | lancedb | qdrant")),
    (["search=faiss_flat", "search.keep_db=true"], ("search.keep_db=true", "search.backend=milvus")),
    (["search=milvus", "search.threads=2"], ("search.threads=2", "faiss | lancedb | qdrant")),
    (["search=milvus", "fusion.top_k=20000"], ("fusion.top_k=20000", "1..16384")),
    (["search=milvus", "fusion.final_top_k=16385"], ("fusion.final_top_k=16385", "1..16384")),
    (["search=milvus", "search.batch_size=20000"], ("search.batch_size=20000", "1..16384")),
    # each engine's own rules, checked once, by its backend module, when the config is checked
    (["search=milvus", "fusion=milvus_weighted", "models.sim_dfn5b_like.weight=2"], ("WeightedRanker", "[0, 1]")),
    (["search=milvus", "fusion.fuse_on=document"], ("fusion.fuse_on=document", "source_object")),
    (["search=lancedb", "models.sim_dfn5b_like.weight=2"], ("fusion=lancedb_rrf takes no per-model weights",
                                                            "valid: equal weights.")),
    (["search=lancedb", "search.index=ivf_pq", "search.nbits=6"], ("search.nbits=6", "4 or 8")),
    (["search=qdrant", "fusion=qdrant_dbsf", "models.sim_dfn5b_like.weight=2"],
     ("fusion=qdrant_dbsf takes no per-model weights", "qdrant-client", "or fusion=qdrant_rrf.")),
    (["search=qdrant", "fusion=qdrant_rrf", "fusion.rrf_k=1.5"], ("must be one of its presets, unchanged",)),
    (["search=qdrant", "fusion=qdrant_dbsf", "fusion.ddof=0"], ("must be one of its presets, unchanged",)),
    (["search=qdrant", "fusion=dbsf"], ("valid: fusion=qdrant_rrf | fusion=qdrant_dbsf",)),
    (["search=faiss_flat", "search.milvus_lean_rows=true"], ("search.milvus_lean_rows=true", "search.backend=milvus")),
    # a backend's own key (its params) is refused with any other backend, and checked by its params
    (["search=milvus", "search.qdrant_unsynced=true"], ("search.qdrant_unsynced=true", "only with search.backend=qdrant")),
    (["search=lancedb", "search.max_memory_gb=2"], ("search.max_memory_gb=2", "only with search.backend=faiss")),
    (["search=faiss_ivf_flat", "search.max_memory_gb=0"], ("search.max_memory_gb", "null = no limit")),
    (["search.backend=nosuch"], ("search.backend", "exact, faiss, milvus, lancedb, qdrant")),
    # a Milvus server's keys (issue 42): Milvus' own, each checked once by its params
    (["search=faiss_flat", "search.uri=http://127.0.0.1:19530"], ("search.uri=", "only with search.backend=milvus")),
    (["search=milvus", "search.uri=ftp://h:1"], ("search.uri=ftp://h:1", "http://HOST:PORT")),
    (["search=milvus", "search.uri='http://root:Milvus@h:1'"], ("search.uri=http://h:1 holds credentials", "token_env")),
    (["search=milvus", "search.retries=3"], ("search.retries=3 is read only with search.uri set",)),
    (["search=milvus", "search.uri=http://h:1", "search.token_env=FUSEBENCH_NO_SUCH_VARIABLE"],
     ("search.token_env=FUSEBENCH_NO_SUCH_VARIABLE", "export FUSEBENCH_NO_SUCH_VARIABLE=")),
    (["search=milvus", "search.uri=http://h:1", "search.request_timeout_s=0"], ("search.request_timeout_s=0", "> 0")),
    (["search=milvus", "search.uri=http://h:1", "search.milvus_lean_rows=true"], ("search.milvus_lean_rows=true",)),
    (["search=milvus", "search.uri=http://h:1", "search.retries=11"], ("search.retries=11", "0..10")),
    (["search=milvus", "search.uri='http://h:1?token=secret'"], ("search.uri=http://h:1?*** has a query",)),
    (["search=milvus", "search.uri='root:secret@h:1'"], ("search.uri=***@h:1 is not a Milvus server address",)),
    (["search=milvus", "search.uri='grpc://u:secret@h:1'"], ("search.uri=grpc://***@h:1 is not",)),
], unpack=True))
def test_bad_search_settings_are_one_line(compose_cfg, overrides, fragments):
    _refused(compose_cfg, overrides, *fragments)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("overrides", fast_first([
    ["search=faiss_ivf_flat", "search.nprobe=8", "search.seed=3", "search.threads=1"],
    ["search=faiss_ivf_pq", "search.pq_m=8", "search.nbits=6"],
    ["search=faiss_hnsw_fast"],  # its YAML sets ef_search: 100
    ["search=lancedb", "search.threads=1", "search.batch_size=64", "search.keep_db=true"],
    ["search=milvus", "search.milvus_lean_rows=true"],
]))
def test_settings_the_index_reads_are_accepted(compose_cfg, overrides):
    run_config(compose_cfg(overrides))


def test_index_sizes_are_checked_against_the_corpus():
    config = SearchConfig(backend="faiss", index="ivf_flat", nlist=None, nprobe=32)
    assert auto_nlist(5000) == 128 and auto_nlist(25010) == 633 and auto_nlist(10) == 1
    check_sizes(config, {"t2i": 5000, "i2t": 25010}, 100)  # auto nlist 128 / 633 >= nprobe 32
    with pytest.raises(FusebenchError, match=r"search.nprobe=32 is more than the 25 lists of the t2i index"):
        check_sizes(config, {"t2i": 1000, "i2t": 5000}, 100)
    with pytest.raises(FusebenchError, match=r"search.nlist=600 is more than the 500 items"):
        check_sizes(SearchConfig(backend="faiss", index="ivf_flat", nlist=600, nprobe=1), {"t2i": 500, "i2t": 900}, 10)
    with pytest.raises(FusebenchError, match="search.ef_search=120 is below the list depth 200"):
        check_depth(SearchConfig(backend="faiss", index="hnsw", ef_search=120), 200)
    # ef_search past every item only costs time (1e8 ran for minutes on 300 images): bounded by the largest index
    check_sizes(SearchConfig(backend="faiss", index="hnsw", ef_search=900), {"t2i": 500, "i2t": 900}, 100)
    with pytest.raises(FusebenchError, match=r"search.ef_search=100000000 is more than the 900 items.*100..900"):
        check_sizes(SearchConfig(backend="faiss", index="hnsw", ef_search=100_000_000), {"t2i": 500, "i2t": 900}, 100)


def test_pq_m_divides_the_width():
    assert resolve_pq_m(SearchConfig(backend="faiss", index="ivf_pq"), 1152, "a") == 64
    assert resolve_pq_m(SearchConfig(backend="faiss", index="ivf_pq"), 24, "a") == 6
    assert resolve_pq_m(SearchConfig(backend="faiss", index="ivf_pq", pq_m=8), 1024, "a") == 8
    with pytest.raises(FusebenchError, match=r"search.pq_m=7 does not divide model b's width 1024"):
        resolve_pq_m(SearchConfig(backend="faiss", index="ivf_pq", pq_m=7), 1024, "b")


def test_faiss_pads_the_width_when_m_does_not_divide_it():
    """(m, coded width): a divisor of the width when one is at least half of width / 4 (capped at 64), else the cap
    over zero-padded vectors; a set pq_m pads to its next multiple; one wider than the model is refused."""
    auto = SearchConfig(backend="faiss", index="ivf_pq")
    assert [pq_layout(auto, d, "a") for d in (1152, 1024, 768, 1280, 1026, 24)] == [
        (64, 1152), (64, 1024), (64, 768), (64, 1280), (57, 1026), (6, 24)]
    assert pq_layout(auto, 1154, "a") == (64, 1216)  # 1154 = 2 x 577: a divisor would be m = 2
    assert pq_layout(auto, 34, "a") == (8, 40)
    assert pq_layout(SearchConfig(backend="faiss", index="ivf_pq", pq_m=7), 1024, "b") == (7, 1029)
    assert pq_layout(SearchConfig(backend="faiss", index="ivf_pq", pq_m=8), 1024, "b") == (8, 1024)
    with pytest.raises(FusebenchError, match=r"search.pq_m=40 is more than model c's width 32: .*valid: 1..32"):
        pq_layout(SearchConfig(backend="faiss", index="ivf_pq", pq_m=40), 32, "c")


def _slow_explained(engine, exact, scores, k):
    """The rule written out: at every differing position the engine's item scores (by the exact list) what the
    exact list's item there scores."""
    lookup = {}
    for i, s in zip(exact, scores):
        if i >= 0:
            lookup[int(i)] = float(s)
    for p in range(k):
        if engine[p] == exact[p]:
            continue
        if engine[p] not in lookup or abs(lookup[engine[p]] - scores[p]) > 1e-5 * max(abs(lookup[engine[p]]), abs(scores[p])) + 1e-9:
            return False
    return True


def test_parity_against_the_obvious_loops():
    rng = np.random.default_rng(3)
    n, k, width = 300, 10, 20
    exact_ids = np.stack([rng.permutation(100)[:width] for _ in range(n)])
    exact_scores = np.sort(rng.choice([0.5, 0.25, 0.2, 0.1, 0.05], size=(n, width)), axis=1)[:, ::-1].astype(np.float32)
    engine_ids = exact_ids.copy()
    for q in range(n):  # swap two positions, or bring in an outsider, or leave alone
        kind = q % 3
        a, b = rng.integers(0, k, 2)
        if kind == 0:
            engine_ids[q, [a, b]] = engine_ids[q, [b, a]]
        elif kind == 1:
            engine_ids[q, a] = 100 + q
    block, differ, explained = parity(engine_ids, exact_ids, exact_scores, k)
    slow_same = [all(engine_ids[q, :k] == exact_ids[q, :k]) for q in range(n)]
    assert block.identical_top10 == pytest.approx(np.mean(slow_same))
    assert block.identical_top1 == pytest.approx(np.mean([engine_ids[q, 0] == exact_ids[q, 0] for q in range(n)]))
    assert list(differ) == [q for q in range(n) if not slow_same[q]]
    assert list(explained) == [_slow_explained(engine_ids[q], exact_ids[q], exact_scores[q], k) for q in differ]
    assert 0 < block.explained < block.differ  # both kinds occur
    assert identical_at(engine_ids, exact_ids, 1).dtype == bool
    # a swap of two items with float-rounding-equal scores is a tie; an item the exact list lacks never is
    assert tie_explained(np.array([2, 1, 3]), np.array([1, 2, 3]), np.array([0.3, 0.3 + 1e-9, 0.1]), 3)
    assert not tie_explained(np.array([2, 1, 3]), np.array([1, 2, 3]), np.array([0.3, 0.2, 0.1]), 3)
    assert not tie_explained(np.array([9, 2, 3]), np.array([1, 2, 3]), np.array([0.3, 0.3, 0.1]), 3)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_patched_engine_is_said_in_its_label(compose_cfg):
    """Milvus Lite's times are stock unless search.milvus_lean_rows patches it; then every label says so."""
    assert "lean_rows" not in run_config(compose_cfg(["search=milvus"])).search.label()
    assert run_config(compose_cfg(["search=milvus", "search.milvus_lean_rows=true"])).search.label().endswith(" lean_rows")


def test_the_backend_table_in_the_docs_is_the_registry():
    """docs/search.md's table of backends says what each registered backend builds, reads (shared, and its own
    params) and fuses by, in the registry's order; its parameters table has a row per search key, and each backend's
    own key's row names that backend alone and its default."""
    from dataclasses import MISSING, fields
    from pathlib import Path

    from fusebench.backends import base
    from fusebench.config.search import own_keys

    text = (Path(__file__).resolve().parents[1] / "docs" / "search.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.split("## Adding a backend", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`") and cells[0] != "backend":
            rows[cells[0].strip("`")] = cells
    assert tuple(rows) == base.names()
    for name, (_, module, indexes, reads, own, fuses) in rows.items():
        backend = base.get(name)
        assert module.split()[0] == f"`backends/kinds/{name}.py`", name
        assert [i.strip() for i in indexes.split(",")] == list(backend.indexes), name
        shared = [*backend.reads, *(base.ENGINE_READS if backend.engine else ())]
        assert [r.strip() for r in reads.split(",") if r.strip()] == shared, name
        assert [r.strip() for r in own.split(",") if r.strip()] == list(own_keys(backend)), name
        assert set(backend.label_flags) <= set(own_keys(backend)), name  # a label word is said for its own setting
        assert [p.strip(" `") for p in fuses.split(",")] == (list(backend.presets) or ["fusebench"]), name
    table = {}
    for line in text.split("## Parameters", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`search."):
            table[cells[0].strip("`")[len("search."):]] = cells
    assert set(table) == {f.name for f in fields(SearchConfig)}
    for backend in base.REGISTRY.items():
        for f in fields(backend.params) if backend.params is not None else ():
            _, default, by, _ = table[f.name]
            named = [n for n in re.findall(r"\w+", by) if n in base.REGISTRY]
            assert f.default is not MISSING and named == [backend.name], f.name
            assert default == {None: "null", True: "true", False: "false"}.get(f.default, str(f.default)), f.name


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("first", ["fusebench.backends.kinds.milvus", "fusebench.backends.base",
                                   "fusebench.backends.engine_steps", "fusebench.config.search", "fusebench.config.run"])
def test_the_search_schema_holds_every_backends_keys_whichever_module_comes_first(first):
    """SearchConfig is assembled from a scan of backends/kinds/: whichever module a program imports first (a backend
    module by name included), every backend is registered whole and its own keys are the schema's; and the scan
    imports nothing heavy (the CLI checks a config before any heavy import)."""
    import subprocess
    import sys

    code = (f"import sys, {first}\n"
            "from dataclasses import fields\n"
            "from fusebench.backends import base\n"
            "from fusebench.config.search import SearchConfig, own_keys\n"
            "keys = [k for b in base.REGISTRY.items() for k in own_keys(b)]\n"
            "assert base.names() == ('exact', 'faiss', 'milvus', 'lancedb', 'qdrant'), base.names()\n"
            "assert {'milvus_lean_rows', 'qdrant_unsynced', 'max_memory_gb'} <= set(keys), keys\n"
            "assert set(keys) <= {f.name for f in fields(SearchConfig)}\n"
            "heavy = {'torch', 'numpy', 'faiss', 'pymilvus', 'lancedb', 'qdrant_client', 'pandas', 'numba'}\n"
            "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_new_backends_own_keys_join_the_schema_flat_and_clash_with_none():
    """A backend's params become search.* keys of the schema (read by it alone); a key another backend or the
    shared keys already hold is a plugin's bug, refused when the schema is assembled."""
    from dataclasses import dataclass, fields, replace

    from fusebench.backends import base
    from fusebench.config import search
    from fusebench.fusion.config import FusionConfig

    @dataclass
    class ToyParams:
        toy_depth: int = 3

    @dataclass
    class ClashParams:
        nprobe: int = 1

    toy = base.Backend(name="toy", indexes=("flat",), params=ToyParams)
    base.register(toy)
    try:
        schema = search._assembled()
        assert [f.name for f in fields(schema)][-1] == "toy_depth" and schema().toy_depth == 3
        assert base.get("toy").settings == ("toy_depth",) and base.names()[-1] == "toy"
        with pytest.raises(FusebenchError, match=r"search.toy_depth=4 is never read with search.backend=faiss; "
                                                 r"search.toy_depth is read only with search.backend=toy"):
            base.check_search(schema(backend="faiss", toy_depth=4), FusionConfig(), [1.0, 1.0])
        base.REGISTRY.unregister("toy")
        base.register(replace(toy, params=ClashParams))
        with pytest.raises(RuntimeError, match="search.nprobe of backend 'toy' is already every backend's"):
            search._assembled()
    finally:
        base.REGISTRY.unregister("toy")
