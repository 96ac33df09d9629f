"""Sweep reports pair only runs of one corpus (its content digest, not its name and size) and label every corpus
apart (issue 29: two manifests of one size, two dataset seeds, two gallery seeds)."""

import json
import shutil

import numpy as np
import pytest
from helpers.corpora import write_manifest

from fusebench.app import pipeline
from fusebench.data.corpus import Corpus
from fusebench.report.runs import JOBS_FILE, read_jobs, scan_runs, write_jobs
from fusebench.report.sweep import build_report, comparable_pairs, write_report

pytestmark = pytest.mark.slow  # whole jobs: not in the fast tier

SMALL = ["dataset.n_images=120", "dataset.n_captions=600", "eval.bootstrap.draws=100", "logger=none", "plots=false"]


def job(compose_cfg, out, overrides):
    cfg = compose_cfg([*overrides, f"embed.cache.dir={out.parent / 'cache'}"])
    return pipeline.run(cfg, str(out))


def test_digest_is_the_content_not_the_name_or_source():
    ids, captions = ["a", "b"], ["one", "two", "three"]
    base = Corpus("m", ids, captions, np.array([0, 0, 1]), meta={"source": "/x/m.jsonl"})
    same = Corpus("other name", ids, captions, np.array([0, 0, 1]), meta={"source": "/y/copy.jsonl"})
    assert base.content_digest() == same.content_digest()
    for changed in (Corpus("m", ids, ["one", "two", "THREE"], np.array([0, 0, 1])),
                    Corpus("m", ids, captions, np.array([0, 1, 1])),
                    Corpus("m", ["a", "c"], captions, np.array([0, 0, 1])),
                    Corpus("m", ids, captions, np.array([0, 0, 1]), meta={"sim_seed": 1}),
                    Corpus("m", ids, captions, np.array([0, 0, 1]), image_paths=["p/a.jpg", "p/b.jpg"])):
        assert changed.content_digest() != base.content_digest()
    with_distractor = Corpus("m", [*ids, "d"], captions, np.array([0, 0, 1]), meta={"gallery_size": 1})
    assert with_distractor.content_digest(2) == base.content_digest()  # the test split's digest ignores distractors


def _manifest_case(root, name, seed):
    """A manifest of 30 images x 2 captions (ids and captions its own) and one model 'a' of .npy vectors."""
    rng = np.random.default_rng(seed)
    records = [{"image_id": f"{name}{i}", "captions": [f"{name} caption {j} of {i}" for j in range(2)]}
               for i in range(30)]
    manifest = write_manifest(root / f"{name}.jsonl", records)
    z = rng.standard_normal((30, 8)).astype(np.float32)
    np.save(root / f"{name}_img.npy", z)
    np.save(root / f"{name}_txt.npy", (np.repeat(z, 2, axis=0) + rng.standard_normal((60, 8))).astype(np.float32))
    return ["dataset=manifest", f"dataset.manifest={manifest}", "models=[]", "+models.a.kind=vectors",
            f"+models.a.image_embeddings={root / f'{name}_img.npy'}",
            f"+models.a.text_embeddings={root / f'{name}_txt.npy'}", "fusion=none", "eval.bootstrap.draws=100",
            "logger=none", "plots=false"]


def test_runs_of_two_manifests_of_one_size_are_never_paired(compose_cfg, tmp_path):
    folder = tmp_path / "mixed"
    for name, seed in (("first", 0), ("second", 1)):
        job(compose_cfg, folder / name, _manifest_case(tmp_path, name, seed))
    report = build_report(folder, draws=100)
    assert len(report.runs) == 2
    assert comparable_pairs(report.runs) == []
    assert not [g for g in report.gains if g["factor"] != "fused vs best single"]  # no 'a vs a'
    labels = {c.rsplit(" ", 2)[0] for row in report.article for c in row if c != "retriever"}
    assert len(labels) == 2  # one column group per manifest, told apart
    assert all(row[c] is not None for row in report.article for c in row)  # 'a' on both, each its own number
    # a record written before digests: told apart by its source, still never paired
    for run in report.runs:
        path = run.path / "metrics.json"
        data = json.loads(path.read_text())
        del data["dataset"]["digest"]
        path.write_text(json.dumps(data))
    old = build_report(folder, draws=100)
    assert comparable_pairs(old.runs) == [] and len({c.rsplit(" ", 2)[0] for c in old.article[0]} - {"retriever"}) == 2


def test_a_sweep_over_dataset_seeds_reports_every_seed_apart(compose_cfg, tmp_path):
    folder = tmp_path / "seeds"
    for seed in (0, 1):
        for method in ("dbsf", "rrf"):
            job(compose_cfg, folder / f"{seed}{method}", [*SMALL, f"dataset.seed={seed}", f"fusion={method}"])
    report = write_report(folder, draws=100)
    groups = {c.rsplit(" ", 2)[0] for row in report.article for c in row if c != "retriever"}
    assert groups == {"sim (simulated) [sim_seed=0]", "sim (simulated) [sim_seed=1]"}
    by_seed = {r.record.dataset.meta["sim_seed"]: r for r in report.runs if r.record.fusion.method == "dbsf"}
    row = next(r for r in report.article if r["retriever"] == "sim_siglip2_like")
    for seed, run in by_seed.items():  # each seed's own numbers, not seed 0's twice
        assert row[f"sim (simulated) [sim_seed={seed}] t2i R@1"] == run.record.retrievers["sim_siglip2_like"].recall(
            "t2i", 1)
    ranked = [g for g in report.gains if g["factor"] == "fused vs best single" and g["k"] == 1
              and g["direction"] == "t2i"]
    assert len({(g["dataset"], g["candidate"]) for g in ranked}) == 4  # two fusions x two seeds, all told apart
    for factor, (run_c, _), (run_b, _) in comparable_pairs(report.runs):
        assert run_c.record.dataset.digest == run_b.record.dataset.digest, factor
    csv = (folder / "summary.csv").read_text()
    assert "sim_seed=1" in csv and "sim_seed=0" in csv


def test_two_gallery_seeds_are_two_labelled_galleries_and_studies(compose_cfg, tmp_path):
    folder = tmp_path / "galleries"
    job(compose_cfg, folder / "bare", [*SMALL, "fusion=dbsf"])
    for seed in (1, 2):
        for size in (100, 300):
            job(compose_cfg, folder / f"g{seed}_{size}",
                [*SMALL, "fusion=dbsf", "gallery=sim", f"gallery.size={size}", f"gallery.seed={seed}"])
    report = build_report(folder, draws=100)
    groups = {c.rsplit(" ", 2)[0] for row in report.article for c in row if c != "retriever"}
    assert "sim (simulated) +300 distractors [gallery seed=1]" in groups
    assert "sim (simulated) +300 distractors [gallery seed=2]" in groups
    studies = {r["study"] for r in report.scaling.recall}
    assert len(studies) == 2 and all("gallery seed=" in s for s in studies)


def test_the_extrapolation_needs_no_run_without_distractors(compose_cfg, tmp_path):
    """It starts from a run with distractors (their saved lists), so two gallery sizes are enough: each single model
    is checked from 100 to 300, or the report says why not."""
    from fusebench.report.sweep_markdown import markdown

    folder = tmp_path / "nozero"
    for size in (100, 300):
        job(compose_cfg, folder / f"g{size}", [*SMALL, "fusion=dbsf", "gallery=sim", f"gallery.size={size}"])
    report = build_report(folder, draws=100)
    s = report.scaling
    singles = {r["retriever"] for r in s.recall} - {g["fusion"] for g in s.gains}
    checked = {e["model"] for e in s.extrapolation if e["from"] == 100 and e["to"] == 300}
    why = [w for w in s.refused if "no extrapolation from 100 distractors" in w]
    assert singles and all(m in checked or any(f": {m}: " in w for w in why) for m in singles), (s.extrapolation, why)
    assert not any("gallery.size=0" in w for w in s.refused)
    assert "### Extrapolated t2i R@1" in markdown(report)


def test_a_deleted_job_dir_is_named_in_the_report(compose_cfg, tmp_path):
    folder = tmp_path / "sweep"
    for i in range(2):
        job(compose_cfg, folder / str(i), [*SMALL, "fusion=dbsf"])
    assert write_jobs(folder, [{"job": i, "dir": str(i), "overrides": [f"dataset.seed={i}"]} for i in range(3)])
    scan = scan_runs(folder)
    assert len(scan.runs) == 2 and set(scan.failed) == {"2"}
    assert "missing" in scan.failed["2"] and "dataset.seed=2" in scan.failed["2"]
    shutil.rmtree(folder / "1")
    scan = scan_runs(folder)
    assert len(scan.runs) == 1 and set(scan.failed) == {"1", "2"}
    # a file of that name that is not fusebench's is neither read nor overwritten
    (folder / JOBS_FILE).write_text('{"mine": 1}')
    assert read_jobs(folder / JOBS_FILE) is None and not write_jobs(folder, [])
    assert (folder / JOBS_FILE).read_text() == '{"mine": 1}' and set(scan_runs(folder).failed) == set()


def test_a_sweep_records_its_jobs_and_the_report_names_a_deleted_one(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "WANDB_MODE": "disabled"}
    sweep = tmp_path / "sweep"
    result = subprocess.run([str(bin_dir / "fusebench"), "-m", *SMALL, "dataset.seed=0,1",
                             f"embed.cache.dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    jobs = read_jobs(sweep / JOBS_FILE)
    assert [(j["job"], j["dir"], j["overrides"][-2:]) for j in jobs] == [
        (0, "0", ["dataset.seed=0", f"embed.cache.dir={tmp_path / 'cache'}"]),
        (1, "1", ["dataset.seed=1", f"embed.cache.dir={tmp_path / 'cache'}"])]
    shutil.rmtree(sweep / "1")
    result = subprocess.run([str(bin_dir / "fusebench-report"), str(sweep), "--draws", "50"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert "1 failed: 1" in result.stdout and "job dir is missing (job 1: dataset.seed=1)" in result.stdout
