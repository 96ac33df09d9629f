"""The sweep report keeps apart retrievers that differ in any setting, and reports each distinct one once
(issue 29's second probe: fusion.rrf_k, a model's weight, fusion.combine, a sim model's seed and a model's
rewritten .npy files were merged into one row with one run's numbers; a fusion held by two jobs that differ only
in the bootstrap seed was compared with its best single model twice, inflating Holm's family)."""

import json
import shutil

import numpy as np
import pytest

from fusebench.app import pipeline
from fusebench.report.sweep import build_report

pytestmark = pytest.mark.slow  # whole jobs: not in the fast tier

SMALL = ["dataset.n_images=100", "dataset.n_captions=400", "eval.bootstrap.draws=100", "logger=none", "plots=false",
         "eval.ks=[1,5]"]


def _jobs(compose_cfg, folder, variants, small=SMALL):
    records = {}
    for i, overrides in enumerate(variants):
        cfg = compose_cfg([*small, *overrides, f"embed.cache.dir={folder.parent / 'cache'}"])
        records[i] = pipeline.run(cfg, str(folder / str(i)))
    return records


def _fused_rows(report):
    return [r for r in report.article if r["retriever"].startswith("fused")]


@pytest.mark.parametrize("setting,values,shown", [
    ("fusion.rrf_k", ["1", "60"], "rrf_k="),
    ("models.sim_dfn5b_like.weight", ["0.5", "2"], "weight="),
    ("fusion.combine", ["sum", "max"], "combine="),
])
def test_fusions_differing_in_one_setting_are_two_rows_with_their_own_numbers(compose_cfg, tmp_path, setting, values,
                                                                             shown):
    method = ["fusion=rrf"] if "rrf_k" in setting else ["fusion=dbsf"]
    records = _jobs(compose_cfg, tmp_path / "s", [[*method, f"{setting}={v}"] for v in values])
    report = build_report(tmp_path / "s", draws=100)
    rows = _fused_rows(report)
    assert len(rows) == 2 and len({r["retriever"] for r in rows}) == 2 and all(shown in r["retriever"] for r in rows)
    column = next(c for c in rows[0] if c.endswith("t2i R@1"))
    measured = sorted(r.retrievers["fused"].recall("t2i", 1) for r in records.values())
    assert sorted(r[column] for r in rows) == measured  # each job's own number, none lost
    pairs = [g for g in report.gains if g["candidate"].startswith("fused") and g["factor"] != "fused vs best single"]
    assert pairs and all(g["candidate"] != g["baseline"] for g in report.gains)
    factor = setting.rsplit(".", 1)[-1] if setting.startswith("fusion") else "weights"
    assert {g["factor"] for g in pairs} == {factor}  # named by the setting (rrf_k and combine were called 'top_k')


def test_a_model_of_another_seed_is_another_row(compose_cfg, tmp_path):
    _jobs(compose_cfg, tmp_path / "s", [["fusion=dbsf"], ["fusion=dbsf", "models.sim_dfn5b_like.seed=7"]])
    report = build_report(tmp_path / "s", draws=100)
    dfn = [r for r in report.article if r["retriever"].startswith("sim_dfn5b_like")]
    assert len(dfn) == 2 and len({r["retriever"] for r in dfn}) == 2
    assert all(g["candidate"] != g["baseline"] for g in report.gains)


def test_one_fusion_in_two_jobs_is_compared_once(compose_cfg, tmp_path):
    _jobs(compose_cfg, tmp_path / "s", [["eval.bootstrap.seed=0"], ["eval.bootstrap.seed=1"]])
    report = build_report(tmp_path / "s", draws=100)
    best = [g for g in report.gains if g["factor"] == "fused vs best single"]
    keys = [(g["candidate"], g["baseline"], g["direction"], g["k"]) for g in best]
    assert len(keys) == len(set(keys)) == 2 * 2  # t2i and i2t at k = 1 and 5, once each
    assert len(_fused_rows(report)) == 1
    # the variant: one run copied twice into a folder reports exactly what the one copy reports (Holm's family too)
    single = tmp_path / "one"
    shutil.copytree(tmp_path / "s" / "0", single / "x")
    twice = tmp_path / "two"
    shutil.copytree(tmp_path / "s" / "0", twice / "x")
    shutil.copytree(tmp_path / "s" / "0", twice / "y")
    one, two = build_report(single, draws=100), build_report(twice, draws=100)
    assert json.dumps(one.gains, sort_keys=True) == json.dumps(two.gains, sort_keys=True)
    assert one.article == two.article


def test_a_model_whose_files_were_rewritten_is_another_row(compose_cfg, tmp_path):
    """Two runs of model 'a' at one .npy path, rewritten between them: nothing recorded differs but the ranks."""
    from helpers.corpora import write_manifest

    rng = np.random.default_rng(0)
    manifest = write_manifest(tmp_path / "m.jsonl", [{"image_id": str(i), "captions": [f"c{i}a", f"c{i}b"]}
                                                     for i in range(40)])
    overrides = ["dataset=manifest", f"dataset.manifest={manifest}", "models=[]", "+models.a.kind=vectors",
                 f"+models.a.image_embeddings={tmp_path / 'a_img.npy'}",
                 f"+models.a.text_embeddings={tmp_path / 'a_txt.npy'}", "fusion=none"]
    numbers = []
    for i, noise in enumerate((0.2, 3.0)):
        z = rng.standard_normal((40, 8)).astype(np.float32)
        np.save(tmp_path / "a_img.npy", z)
        np.save(tmp_path / "a_txt.npy", (np.repeat(z, 2, axis=0) + noise * rng.standard_normal((80, 8))).astype(np.float32))
        record = _jobs(compose_cfg, tmp_path / f"r{i}", [overrides], SMALL[2:])[0]
        numbers.append(record.retrievers["a"].recall("t2i", 1))
    folder = tmp_path / "both"
    for i in range(2):
        shutil.copytree(tmp_path / f"r{i}" / "0", folder / str(i))
    report = build_report(folder, draws=100)
    rows = [r for r in report.article if r["retriever"].startswith("a")]
    assert len(rows) == 2 and len({r["retriever"] for r in rows}) == 2 and all("[ranks " in r["retriever"] for r in rows)
    column = next(c for c in rows[0] if c.endswith("t2i R@1"))
    assert sorted(r[column] for r in rows) == sorted(numbers)
    assert not report.gains  # nothing recorded tells them apart: no pair of one factor


@pytest.mark.parametrize("field,change", [("R@1", 10.0), ("R@5", -0.25), ("median_rank", 1.0)])
def test_a_number_changed_in_metrics_json_is_caught_against_the_ranks(compose_cfg, tmp_path, field, change):
    """metrics.json has no checksum of its own: a bit flipped in a recall (85.5 -> 95.5) went into summary.md with
    exit 0. Every recorded number the report prints is computed again from the checksummed ranks."""
    from fusebench.report.runs import scan_runs

    _jobs(compose_cfg, tmp_path / "s", [["fusion=dbsf"], ["fusion=rrf"]])
    assert len(scan_runs(tmp_path / "s").runs) == 2  # untouched: both reported
    path = tmp_path / "s" / "0" / "metrics.json"
    data = json.loads(path.read_text())
    data["retrievers"]["fused"]["t2i"][field] += change
    path.write_text(json.dumps(data, indent=2) + "\n")
    scan = scan_runs(tmp_path / "s")
    assert [r.path.name for r in scan.runs] == ["1"]
    assert "metrics.json changed after the run" in scan.failed["0"] and "fused t2i" in scan.failed["0"]
    report = build_report(tmp_path / "s", draws=100)
    assert all(r.path.name == "1" for r in report.runs)


@pytest.mark.parametrize("members,why", [(["nosuch"], "names models it does not hold (nosuch)"),
                                         ([], "names no models"), (["fused"], "names a fusion as one of its models")])
def test_a_record_naming_a_model_it_lacks_is_damaged_not_a_crash(compose_cfg, tmp_path, members, why):
    """A fused member renamed in metrics.json crashed fusebench-report (KeyError; AttributeError for [])."""
    from fusebench.report.runs import scan_runs

    _jobs(compose_cfg, tmp_path / "s", [["fusion=dbsf"], ["fusion=rrf"]])
    path = tmp_path / "s" / "0" / "metrics.json"
    data = json.loads(path.read_text())
    data["retrievers"]["fused"]["spec"]["members"] = members
    path.write_text(json.dumps(data, indent=2) + "\n")
    scan = scan_runs(tmp_path / "s")
    assert [r.path.name for r in scan.runs] == ["1"] and why in scan.failed["0"]
    assert build_report(tmp_path / "s", draws=100).runs[0].path.name == "1"


def test_runs_of_one_retriever_at_other_ks_fill_every_column(compose_cfg, tmp_path):
    """One retriever in runs with different eval.ks: each recall any run measured is shown (the first run's ks
    alone were, the others' columns blank)."""
    small = [s for s in SMALL if not s.startswith("eval.ks")]
    records = _jobs(compose_cfg, tmp_path / "s", [["eval.ks=[1,50]"], ["eval.ks=[1,5,10]"]], small)
    report = build_report(tmp_path / "s", draws=100)
    fused = _fused_rows(report)
    assert len(fused) == 1
    row = fused[0]
    for k, record in ((50, records[0]), (5, records[1]), (10, records[1])):
        column = next(c for c in row if c.endswith(f"t2i R@{k}"))
        assert row[column] == record.retrievers["fused"].recall("t2i", k)
