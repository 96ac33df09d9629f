import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from fusebench.evaluation.metrics import hits_at_k
from fusebench.evaluation.stats import holm_adjust, paired_bootstrap
from fusebench.report.cli import main as report_main
from fusebench.report.sweep import build_report, load_runs

pytestmark = pytest.mark.slow  # whole jobs and subprocesses: not in the fast tier

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
SMALL = ["dataset.n_images=300", "dataset.n_captions=1500", "eval.bootstrap.draws=200"]


def sweep(tmp_path, *args, name="sweep", code=0):
    result = subprocess.run([FUSEBENCH, "-m", *SMALL, *args, f"hydra.sweep.dir={tmp_path / name}"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600,
                            env={"PATH": str(Path(sys.executable).parent), "FUSEBENCH_OUTPUT": str(tmp_path / "out"),
                                 "HOME": str(tmp_path), "WANDB_MODE": "disabled"})
    assert result.returncode == code, result.stderr
    return tmp_path / name, result


@pytest.fixture(scope="module")
def method_sweep(tmp_path_factory):
    return sweep(tmp_path_factory.mktemp("report"), "fusion=rrf,dbsf", "fusion.fuse_on=document,source_object")[0]


def test_multirun_writes_the_report_files(method_sweep):
    for name in ("summary.md", "summary.csv", "gains.csv", "cost.csv", "plots/paired_gains.png",
                 "plots/wins_losses.png", "plots/cost_vs_gain.png"):
        assert (method_sweep / name).is_file()
    for name in ("recall_bars", "recall_at_k", "wins_losses", "paired_gains", "score_distributions"):
        assert (method_sweep / "0" / "plots" / f"{name}.png").stat().st_size > 5000
    summary = (method_sweep / "summary.md").read_text()
    assert "4 finished runs" in summary and "| sim_siglip2_like |" in summary
    ranked = summary.split("## Fusions ranked")[1].split("##")[0]  # the four fusions, best gain first
    gains = [float(line.split("|")[4]) for line in ranked.splitlines() if line.startswith("| sim")]
    assert len(gains) == 4 and gains == sorted(gains, reverse=True)
    assert "| retriever | sim (simulated) t2i R@1 | sim (simulated) t2i R@5 |" in summary


def test_pairs_differ_in_one_factor_and_stats_come_from_saved_ranks(method_sweep):
    report = build_report(method_sweep, draws=300)
    gains = report.gains
    factors = {(g["factor"], g["candidate"].split(" [")[0], g["baseline"].split(" [")[0]) for g in gains if g["k"] == 1}
    assert ("method", "fused dbsf by document top_k=100", "fused rrf by document top_k=100") in factors
    assert ("fuse_on", "fused rrf by source_object top_k=100", "fused rrf by document top_k=100") in factors
    assert ("model", "sim_dfn5b_like", "sim_siglip2_like") in factors or ("model", "sim_siglip2_like", "sim_dfn5b_like") in factors
    # RRF keyed by document never changes rank 1: zero wins and losses at R@1 against the first model
    rrf_doc = [g for g in gains if g["factor"] == "fused vs best single" and "rrf by document" in g["candidate"]
               and g["k"] == 1 and g["baseline"] == "sim_siglip2_like"]
    assert rrf_doc and all(g["wins"] == g["losses"] == 0 for g in rrf_doc if g["direction"] == "t2i")
    runs = {r.record.fusion.method + "/" + r.record.fusion.fuse_on: r for r in report.runs}
    row = next(g for g in gains if g["factor"] == "method" and "by document" in g["candidate"] and g["k"] == 5
               and g["direction"] == "t2i")
    cand = hits_at_k(runs["dbsf/document"].ranks("fused", "t2i"), 5)
    base = hits_at_k(runs["rrf/document"].ranks("fused", "t2i"), 5)
    expected = paired_bootstrap(cand, base, draws=300, seed=0)
    assert (row["gain"], row["wins"], row["losses"], row["ci_low"]) == (expected.gain, expected.wins, expected.losses,
                                                                      expected.ci_low)
    assert all(g["p_holm"] >= g["p_value"] for g in gains)


def test_singles_counted_once_and_cost_table(method_sweep):
    report = build_report(method_sweep, draws=50)
    names = [r["retriever"] for r in report.article]
    assert names.count("sim_siglip2_like") == 1 and len(names) == 2 + 4
    fused = next(c for c in report.cost if c["retriever"].startswith("fused"))
    assert fused["dims"] == 1152 + 1024 and fused["bytes_per_image_fp32"] == 4 * 2176
    assert fused["index_10M_fp32_GB"] == pytest.approx(4 * 2176 * 1e7 / 1e9, abs=0.1)
    assert fused["query_ms_run"] > 0


def test_holm_exact_numbers():
    assert holm_adjust([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm_adjust([0.9, 0.8]) == pytest.approx([1.0, 1.0])
    assert holm_adjust([]) == []


def test_failed_job_keeps_the_others_and_is_listed(tmp_path):
    folder, result = sweep(tmp_path, "fusion.top_k=100,5", code=1)  # a sweep with a failed job exits 1
    assert "job 1 failed" in result.stderr and "1 job(s) of the sweep failed: 1" in result.stderr
    runs, failed = load_runs(folder)
    assert len(runs) == 1 and failed == ["1"]
    assert (folder / "1" / "error.txt").read_text().count("fusion.top_k=5") >= 1
    assert "1 failed: 1" in (folder / "summary.md").read_text()


def test_report_command_on_plain_run_dirs(method_sweep, tmp_path, capsys):
    assert report_main([str(method_sweep), "--draws", "100"]) == 0
    assert "Paired gains" in capsys.readouterr().out
    assert report_main([str(tmp_path / "nothing")]) == 2
    (tmp_path / "empty").mkdir()
    assert report_main([str(tmp_path / "empty")]) == 2


def test_a_sweep_without_a_logger_has_every_jobs_plots_when_it_ends(tmp_path):
    """Every job of a logger=none sweep has its plots, whole, when the command returns (each job draws its own)."""
    folder, _ = sweep(tmp_path, "fusion=rrf,dbsf,sum", "logger=none", name="bg")
    for job in ("0", "1", "2"):
        assert sorted(p.name for p in (folder / job / "plots").glob("*.png")) == [
            "paired_gains.png", "query_ranks.png", "recall_at_k.png", "recall_bars.png", "score_distributions.png",
            "wins_losses.png"]
        assert all(p.stat().st_size > 5000 for p in (folder / job / "plots").glob("*.png"))
    assert (folder / "summary.md").is_file() and (folder / "plots" / "paired_gains.png").is_file()


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_launchers(tmp_path, launcher):
    folder, _ = sweep(tmp_path, "fusion=rrf,dbsf", f"hydra/launcher={launcher}", name=launcher)
    runs, failed = load_runs(folder)
    assert len(runs) == 2 and not failed
    assert {r.record.fusion.method for r in runs} == {"rrf", "dbsf"}
    assert json.loads((folder / "0" / "metrics.json").read_text())["retrievers"]


def test_article_experiment_runs_on_sim_stand_ins(tmp_path):
    result = subprocess.run([FUSEBENCH, "experiment=article_coco", "dataset=sim", *SMALL,
                             f"hydra.sweep.dir={tmp_path / 'article'}"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env={"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path),
                                              "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"})
    assert result.returncode == 0, result.stderr
    runs, failed = load_runs(tmp_path / "article")
    assert len(runs) == 7 and not failed
    studies = {r.overrides[0] for r in runs}
    assert studies == {f"study={s}" for s in ("siglip2_as_typed", "siglip2_lowercase", "dfn5b", "pair_dbsf_source",
                                              "pair_rrf_document", "pair_rrf_source", "four_dbsf_source")}
    for run in runs:
        assert run.record.simulated is True
        for entry in run.record.retrievers.values():
            if not entry.is_fusion:  # the record says what ran, and what it stood in for
                assert entry.embedding["stand_in"]["kind"] == "sim" and entry.spec.kind == "sim"
                assert entry.spec.values["stands_in_for"]["kind"] in ("hf", "open_clip")
    summary = (tmp_path / "article" / "summary.md").read_text()  # the article's numbers beside the simulated ones
    assert "## Beside the article" in summary and "coco5k (simulated run)" in summary and "58.10" in summary
    assert "1438/864" in summary and "[+1.93, +2.69]" in summary
    assert "the article (coco5k, SigLIP 2 (lowercased) + DFN5B, DBSF by source image) [this run is SIMULATED" in result.stdout
    report = build_report(tmp_path / "article", draws=100)
    gains = report.gains
    text = [g for g in gains if g["factor"] == "text" and g["direction"] == "t2i" and g["k"] == 1]
    assert text and text[0]["candidate"].endswith("(lowercase)") and text[0]["gain"] > 0
    # the article's lowercasing gain (+3.71) is between two of its jobs: measured here by pairing the two jobs
    beside = {row["job"]: row for row in report.beside_article}
    lowercased = beside["SigLIP 2 So400m/14-384, lowercased queries"]
    assert lowercased["article gain"] == 3.71 and lowercased["this gain"] == pytest.approx(text[0]["gain"])
    assert "gain over the siglip2_as_typed job" in result.stdout
    assert {g["factor"] for g in gains} >= {"text", "method", "fuse_on", "fused vs best single"}


def test_experiments_compose(compose_cfg):
    cfg = compose_cfg(["experiment=fusion_ablation", "dataset=sim"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params["fusion.top_k"] == "25,100,null"
    assert list(cfg.models) == ["siglip2_so400m_p14_384", "dfn5b_h14_224"] and cfg.dataset.kind == "sim"
    cfg = compose_cfg(["experiment=article_flickr", "study=four_dbsf_source"])
    assert cfg.dataset.name == "flickr1k" and len(cfg.models) == 4 and cfg.fusion.method == "dbsf"
    assert cfg.models.siglip2_so400m_p14_384.text.case == "lowercase"  # as the article fused it


def test_real_model_without_stand_in_is_refused_on_sim(compose_cfg, tmp_path):
    from fusebench import FusebenchError
    from fusebench.app.pipeline import run

    with pytest.raises(FusebenchError, match="has no 'sim:' stand-in"):
        run(compose_cfg(SMALL + ["models=[]", "+models.x.kind=hf", "+models.x.checkpoint=somewhere"]), str(tmp_path))


def test_every_fusion_setting_makes_a_distinct_retriever(tmp_path):
    """Two fusions that differ only in a setting outside method / key (here the floor) are two retrievers, and
    a pair one factor apart, the factor named by that setting (it was called 'top_k'); an older record without
    the newer settings reads them as the defaults."""
    from fusebench.evaluation.record import RunRecord
    from fusebench.fusion.config import FusionConfig
    from fusebench.report.retrievers import retriever_factors
    from fusebench.report.runs import Run

    def run(drop=(), **fusion):
        spec = {k: v for k, v in {"kind": "fusion", "members": ["a"], **asdict(FusionConfig(**fusion))}.items()
                if k not in drop}
        record = RunRecord.from_json({
            "eval": {"ks": [1]}, "dataset": {"name": "d", "n_images": 1, "n_captions": 1}, "comparisons": [],
            "retrievers": {"a": {"t2i": {"R@1": 1.0}, "i2t": {"R@1": 1.0}, "mean": {"R@1": 1.0}, "spec": {"kind": "sim"}},
                           "fused": {"t2i": {"R@1": 1.0}, "i2t": {"R@1": 1.0}, "mean": {"R@1": 1.0}, "spec": spec}}})
        return Run(tmp_path, "r", record)

    plain, floored = retriever_factors(run(method="minmax"), "fused"), retriever_factors(run(method="minmax", floor=0.001), "fused")
    assert [key for key in plain if plain[key] != floored[key]] == ["floor"]
    old = run(method="minmax", drop=("score_map", "flat_score", "floor", "rrf_ranks"))
    assert retriever_factors(old, "fused") == plain


def test_a_run_file_damaged_after_it_was_hashed_here_is_read_again(tmp_path):
    """The digests a job computed when it wrote its files are reused by the same process's sweep report, but
    only for a file unchanged since: a byte flipped in place (same inode and size) is hashed again."""
    from fusebench.stores.files import file_sha256, remembered_checksum

    path = tmp_path / "ranks.npy"
    path.write_bytes(bytes(range(256)) * 64)
    first = remembered_checksum(path)
    assert first == file_sha256(path) == remembered_checksum(path)
    with path.open("r+b") as fh:  # in place: the same inode and size
        fh.seek(100)
        fh.write(b"\xff")
    stat = path.stat()  # a later mtime (the filesystem's clock may not have ticked within this test)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert remembered_checksum(path) == file_sha256(path) != first


def test_the_summary_head_lists_failed_and_damaged_runs_apart():
    """A run whose files were changed after it finished is listed as damaged, a job that did not finish as failed
    (docs/guarantees.md; issue 39, item 8); every one with its reason."""
    from types import SimpleNamespace

    from fusebench.report.sweep import SweepSummary
    from fusebench.report.sweep_markdown import _head

    reasons = {"0": "no metrics.json (the job failed or was stopped)",
               "2": "ranks/fused.t2i.npy does not match the checksum metrics.json recorded"}
    report = SimpleNamespace(folder="S", runs=[object()], reasons=reasons, damaged=["2"])
    report.failed = SweepSummary.failed.fget(report)
    assert report.failed == ["0"] and SweepSummary.not_reported.fget(report) == ["0", "2"]
    lines = _head(report)
    assert lines[2] == "1 finished runs, 1 failed: 0, 1 damaged: 2."
    assert f"- 2: {reasons['2']}" in lines and f"- 0: {reasons['0']}" in lines
