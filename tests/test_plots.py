"""The plots' registry (fusebench.report.plots): one module per plot, every list of plot names derived from it (the
run dir's, the sweep report's, the docs table), nothing heavy imported by the scan; and the per-query ranks plot
(query_ranks.py): its fixed and broken queries against a slow reference, its drawing on a run with known ranks."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.config.schema import EvalConfig
from fusebench.evaluation.comparisons import paired_comparisons, retriever_result
from fusebench.evaluation.record import RunRecord
from fusebench.evaluation.subrecords import DatasetSummary, FusionRecord, ModelRecord, RunInfo
from fusebench.fusion.config import FusionConfig
from fusebench.report import plots, report_files
from fusebench.report.plots import query_ranks
from fusebench.report.plots.query_ranks import QueryRanksParams, fixed_broken
from fusebench.runtime import layout

DOCS = Path(__file__).resolve().parents[1] / "docs"
N_IMAGES, KS = 30, [1, 5, 10]
CAPTION_IMAGE = np.repeat(np.arange(N_IMAGES), 2)  # 60 t2i queries


def test_every_list_of_plot_names_comes_from_the_registry():
    assert layout.run_plot_names() == plots.names("run") == layout.plot_names("run")
    assert report_files.plot_names() == plots.names("sweep")
    assert {"recall_bars.png", "query_ranks.png"} <= set(plots.names("run"))
    assert not set(report_files.RETIRED_PLOTS) & set(plots.names())  # retired: no module draws it
    for plot in plots.REGISTRY.items():
        module = Path(sys.modules[plot.draw.__module__].__file__)
        assert f"{module.stem}.png" == plot.name  # a plot's module is named for the file it writes
        assert plot.doc and plot.scopes


def test_the_docs_table_is_the_registrys():
    page = (DOCS / "formats.md").read_text(encoding="utf-8")
    assert plots.docs_table() in page
    named = set(re.findall(r"`(\w+\.png)`", page))
    assert named - set(plots.names()) - set(report_files.RETIRED_PLOTS) == set()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_scanning_the_plots_imports_no_matplotlib():
    code = ("import sys; from fusebench.runtime import layout; names = layout.plot_names('run');"
            "print(len(names), any(m.split('.')[0] == 'matplotlib' for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    count, heavy = out.stdout.split()
    assert int(count) >= 8 and heavy == "False"


def slow_fixed_broken(ranks_a, ranks_b, k):
    """The definition, query by query: fixed = in B's top k and not in A's; broken = the reverse; 0 = absent."""
    fixed = broken = 0
    for a, b in zip(ranks_a.tolist(), ranks_b.tolist()):
        in_a, in_b = 1 <= a <= k, 1 <= b <= k
        fixed += in_b and not in_a
        broken += in_a and not in_b
    return fixed, broken


@pytest.mark.parametrize("seed", range(6))
def test_fixed_and_broken_equal_the_obvious_count(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    ranks_a, ranks_b = (np.where(rng.random(n) < 0.1, 0, rng.integers(1, 30, n)) for _ in "ab")
    for k in (1, 2, 5, 29, 30):
        fixed, broken = fixed_broken(ranks_a, ranks_b, k)
        assert (int(fixed.sum()), int(broken.sum())) == slow_fixed_broken(ranks_a, ranks_b, k)
        assert not (fixed & broken).any()


def known_run(tmp_path: Path) -> tuple[Path, RunRecord, dict]:
    """A run dir as the pipeline leaves it, with ranks set by hand: model 'a' better at R@1 than 'b'; 'fused'
    fixes queries 0..6 (rank 1, 'a' had 2, 3 or was absent) and breaks 7..9 (rank 4 or absent, 'a' had 1)."""
    q = len(CAPTION_IMAGE)
    a = np.r_[[2, 3, 0, 2, 3, 0, 5], [1, 1, 1], np.ones(30, int), np.full(q - 40, 7)]
    b = np.r_[np.full(10, 2), np.ones(20, int), np.full(q - 30, 9)]
    fused = np.r_[np.ones(7, int), [4, 0, 4], np.ones(30, int), np.full(q - 40, 3)]
    ranks = {name: {"t2i": t2i, "i2t": np.ones(N_IMAGES, int)} for name, t2i in (("a", a), ("b", b), ("fused", fused))}
    specs = {"a": ModelRecord({"kind": "sim", "dim": 16, "seed": 1}), "b": ModelRecord({"kind": "sim", "dim": 8, "seed": 2})}
    retrievers = {m: retriever_result(m, ranks[m], KS, specs[m]) for m in "ab"}
    retrievers["fused"] = retriever_result("fused", ranks["fused"], KS, FusionRecord(["a", "b"], FusionConfig()))
    clusters = {"t2i": CAPTION_IMAGE, "i2t": np.arange(N_IMAGES)}
    comparisons = paired_comparisons(ranks, ["fused"], ["a", "b"], clusters, KS, 200, 0.95, 0)
    record = RunRecord(DatasetSummary("sim", N_IMAGES, q, meta={"simulated": True}), retrievers, comparisons,
                       FusionConfig(), EvalConfig(ks=KS), RunInfo())
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    for name, by_direction in ranks.items():
        for direction, values in by_direction.items():
            np.save(run_dir / "ranks" / f"{name}.{direction}.npy", values.astype(np.int64))
    return run_dir, record, {name: r["t2i"] for name, r in ranks.items()}


def legend_of(monkeypatch) -> list:
    """The legends of the query-ranks figures drawn from now on, as their texts."""
    drawn, save = [], query_ranks.save
    monkeypatch.setattr(query_ranks, "save", lambda fig, path, *a: drawn.append(
        [t.get_text() for t in fig.axes[0].get_legend().get_texts()]) or save(fig, path, *a))
    return drawn


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_run_draws_query_ranks_with_the_counts_it_reports(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    run_dir, record, t2i = known_run(tmp_path)
    assert record.best_single("t2i", 1) == "a"
    legends = legend_of(monkeypatch)
    made = plots.run_plots(run_dir, record)
    path = run_dir / "plots" / "query_ranks.png"
    assert path in made and path.stat().st_size > 5000
    manifest = layout.read_plots_manifest(run_dir / "plots")
    assert manifest is not None and set(manifest) == {p.name for p in made}
    assert manifest["query_ranks.png"] == hashlib.sha256(path.read_bytes()).hexdigest()
    (legend,) = legends
    assert legend[1:] == ["fixed: 7 queries (rank 1 under fused, not under a)",
                          "broken: 3 queries (rank 1 under a, not under fused)"]
    assert legend[0] == f"the other {len(CAPTION_IMAGE) - 10} queries"
    # the same queries the paired comparison counts as won and lost at R@1
    won = record.comparison("fused", "a", "t2i", 1)
    assert (won.wins, won.losses) == (7, 3) == slow_fixed_broken(t2i["a"], t2i["fused"], 1)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_query_ranks_with_its_own_settings(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    run_dir, record, t2i = known_run(tmp_path)
    legends = legend_of(monkeypatch)
    plot = plots.REGISTRY.get("query_ranks.png")
    out = tmp_path / "out"
    out.mkdir()
    assert plot.make(plots.RunInputs(run_dir, record), out, QueryRanksParams(a="b", b="a", k=2)) == out / plot.name
    fixed, broken = slow_fixed_broken(t2i["b"], t2i["a"], 2)
    assert legends[0][1:] == [f"fixed: {fixed} queries (the top 2 under a, not under b)",
                              f"broken: {broken} queries (the top 2 under b, not under a)"]


@pytest.mark.parametrize(("given", "fragment"), [({"k": 0}, "QueryRanksParams.k"), ({"k": 1.5}, "QueryRanksParams.k"),
                                                 ({"a": [1]}, "QueryRanksParams.a")])
def test_query_ranks_settings_are_checked(given, fragment):
    with pytest.raises(FusebenchError, match=re.escape(fragment)):
        QueryRanksParams(**given)


@pytest.mark.parametrize(("given", "fragment"), [({"a": "nope"}, "QueryRanksParams.a"),
                                                 ({"b": "nope"}, "a, b, fused"),
                                                 ({"a": "b", "b": "b"}, "two different retrievers")])
def test_query_ranks_names_retrievers_of_the_run(tmp_path, given, fragment):
    run_dir, record, _ = known_run(tmp_path)
    with pytest.raises(FusebenchError, match=re.escape(fragment)):
        plots.REGISTRY.get("query_ranks.png").make(plots.RunInputs(run_dir, record), tmp_path, QueryRanksParams(**given))


def test_a_run_without_a_fusion_has_no_query_ranks_plot(tmp_path):
    run_dir, record, _ = known_run(tmp_path)
    record.retrievers.pop("fused")
    assert query_ranks.draw(plots.RunInputs(run_dir, record), tmp_path / "q.png", QueryRanksParams()) is None
    assert json.dumps(query_ranks.retrievers(record, QueryRanksParams())) == '["a", null]'
