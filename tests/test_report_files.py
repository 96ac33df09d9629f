"""What a report writes, and what it never touches (issue 29): ``fusebench-report`` and a sweep's own report step
never replace a file fusebench did not write (a user's summary.md, gains.csv, plots/...: exit 2, one line naming
it); a report into a run dir draws its plots in ``report_plots/``, never over the run's ``plots/``; every file a
report wrote is recorded in ``report.sha256`` (a second report, a rerun into the dir, recognise them); and a
metrics.json fusebench wrote that was damaged since (cut short) is replaced by a rerun, never a dead end, while
anyone else's metrics.json is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from fusebench import FusebenchError
from fusebench.app import rundir
from fusebench.app.callback import RunDirRefused, SweepReport
from fusebench.app.pipeline import run
from fusebench.report import report_files
from fusebench.report.cli import main as report_main

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
REPORT = str(Path(sys.executable).with_name("fusebench-report"))
TINY = ["dataset.n_images=50", "dataset.n_captions=100", "eval.bootstrap.draws=50", "logger=none",
        "eval.lists.store=false"]
SMALL = ["dataset.n_images=200", "dataset.n_captions=1000", "eval.bootstrap.draws=100", "logger=none"]
RUN_OUTPUTS = ("metrics.json", "ranks", "topk", "plots")

pytestmark = pytest.mark.slow  # whole jobs (the module's fixture) and whole reports: not in the fast tier


def snapshot(folder: Path, only: tuple[str, ...] | None = None) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and (only is None or p.relative_to(folder).parts[0] in only)}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Two finished run dirs with their plots (two fusions), made once; each test copies them."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fusebench.config import CONFIG_DIR, schema

    schema.register()
    root = tmp_path_factory.mktemp("finished")
    for method in ("rrf", "dbsf"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
            cfg = compose(config_name="config", overrides=[*TINY, f"fusion={method}"])
        run(cfg, str(root / method))
        (root / method / ".hydra").mkdir()  # as Hydra leaves a job's dir: its config beside the outputs
        (root / method / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    GlobalHydra.instance().clear()
    return root


@pytest.fixture
def runs(finished, tmp_path):
    import shutil

    shutil.copytree(finished, tmp_path / "runs")
    return tmp_path / "runs"


def one_line(capsys, *fragments) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fusebench-report: error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# ---------------------------------------------------------------- a report into a run dir

def test_a_report_on_a_run_dir_leaves_the_runs_outputs_and_a_rerun_finds_them_fusebenchs(runs, capsys):
    run_dir = runs / "rrf"
    before = snapshot(run_dir, RUN_OUTPUTS)
    assert {"plots/paired_gains.png", "plots/wins_losses.png"} <= before.keys()
    assert report_main([str(run_dir), "--draws", "50"]) == 0
    assert snapshot(run_dir, RUN_OUTPUTS) == before  # the run's plots are the run's
    drawn = sorted(p.name for p in (run_dir / "report_plots").iterdir())
    assert "paired_gains.png" in drawn and "cost_vs_gain.png" in drawn
    manifest = report_files.read_manifest(run_dir)
    assert {"summary.md", "gains.csv", "report_plots/paired_gains.png"} <= manifest.keys()
    assert rundir.foreign(run_dir) == []  # a rerun into it is not refused ...
    rundir.check_outputs(run_dir)
    cwd = os.getcwd()
    try:  # ... also as the current folder (hydra.run.dir=.): the report's files are fusebench's
        os.chdir(run_dir)
        rundir.check_dir(".", "hydra.run.dir")
        (run_dir / "notes.txt").write_text("mine")  # what is not fusebench's still refuses it
        with pytest.raises(FusebenchError, match="notes.txt"):
            rundir.check_dir(".", "hydra.run.dir")
    finally:
        os.chdir(cwd)
    # a second report replaces the first (fusebench's own files), the run's outputs still untouched
    assert report_main([str(run_dir), "--draws", "60"]) == 0
    assert snapshot(run_dir, RUN_OUTPUTS) == before
    assert not list(run_dir.glob(f"{report_files.STAGING}*"))


def test_a_report_on_a_folder_of_run_dirs_draws_in_plots_and_a_run_there_is_refused_not_over_them(runs):
    assert report_main([str(runs), "--draws", "50"]) == 0
    assert (runs / "plots" / "paired_gains.png").is_file() and not (runs / "report_plots").exists()
    assert report_files.written(runs, "plots/paired_gains.png")
    # a run into the folder itself would swap its plots/ away: refused, saying whose they are
    with pytest.raises(FusebenchError, match="fusebench-report drew") as err:
        rundir.check_outputs(runs)
    assert "plots/paired_gains.png" in str(err.value) and "hydra.run.dir" in str(err.value)
    assert set(rundir.foreign(runs)) >= {"plots/paired_gains.png", "plots/wins_losses.png", "plots/cost_vs_gain.png"}


def test_a_later_report_removes_only_the_files_the_earlier_one_recorded(runs):
    assert report_main([str(runs), "--draws", "50"]) == 0
    stale = runs / "positives.csv"  # as if the earlier report had extra positives
    stale.write_text("set,retriever\n")
    report_files._write_manifest(runs, {**report_files.read_manifest(runs),
                                        "positives.csv": {report_files.remembered_checksum(stale)}})
    (runs / "plots" / "mine.png").write_bytes(b"\x89PNG mine")
    assert report_main([str(runs), "--draws", "50"]) == 0
    assert not stale.exists() and "positives.csv" not in report_files.read_manifest(runs)
    assert (runs / "plots" / "mine.png").read_bytes() == b"\x89PNG mine"  # never recorded: left alone


def test_a_later_report_removes_a_plot_an_earlier_release_drew(runs):
    """plots/index_gain_kept.png (a share of the exact gain, retired by issue 39) recorded by an earlier report is
    removed by the next one, never left beside the new report."""
    assert report_main([str(runs), "--draws", "50"]) == 0
    old = runs / "plots" / "index_gain_kept.png"
    old.write_bytes(b"\x89PNG kept")
    report_files._write_manifest(runs, {**report_files.read_manifest(runs),
                                        "plots/index_gain_kept.png": {report_files.remembered_checksum(old)}})
    assert report_main([str(runs), "--draws", "50"]) == 0
    assert not old.exists() and "plots/index_gain_kept.png" not in report_files.read_manifest(runs)


def test_a_report_drawn_in_two_steps_is_the_report_drawn_in_one(runs, tmp_path):
    """``write_report(plots=False)`` then ``write_report_plots`` (a sweep whose plots the views process draws):
    the same files, the same bytes and the same report.sha256 as one ``write_report``; between the steps an
    earlier report's plots are gone (they described another report) and the tables are recorded."""
    import pickle
    import shutil

    from fusebench.report.sweep import write_report, write_report_plots

    shutil.copytree(runs, tmp_path / "two")
    whole = write_report(runs, draws=50)
    assert write_report(tmp_path / "two", draws=50).plots  # an earlier report, with its plots
    tables = write_report(tmp_path / "two", draws=50, plots=False)
    assert tables.plots == [] and not (tmp_path / "two" / "plots").exists()
    assert set(report_files.read_manifest(tmp_path / "two")) == {"summary.md", "summary.csv", "gains.csv", "cost.csv"}
    sent = pickle.loads(pickle.dumps(tables))  # what the views process is sent: no run's arrays (read again if asked)
    assert all(run._loaded == {} for run in sent.runs) and any(run._loaded for run in tables.runs)
    assert all(run._loaded for run in tables.runs)  # this process's runs keep theirs
    plots = write_report_plots(sent)
    assert sorted(p.name for p in plots) == sorted(p.name for p in whole.plots) != []
    assert snapshot(tmp_path / "two", ("plots",)) == snapshot(runs, ("plots",))
    manifest = report_files.read_manifest(tmp_path / "two")
    one_step = report_files.read_manifest(runs)
    assert manifest.keys() == one_step.keys()
    assert {rel: manifest[rel] for rel in manifest if rel != "summary.md"} == \
        {rel: one_step[rel] for rel in one_step if rel != "summary.md"}  # summary.md names its folder
    assert (tmp_path / "two" / "summary.md").read_text().replace(str(tmp_path / "two"), str(runs)) == \
        (runs / "summary.md").read_text()
    for rel in manifest:
        assert report_files.written(tmp_path / "two", rel, manifest)
    assert not list((tmp_path / "two").glob(f"{report_files.STAGING}*"))


def test_a_report_s_plots_drawn_after_its_tables_never_replace_a_users_file(runs, caplog):
    """A file put under one plot's name between the tables and the plots is left as it is, with a warning naming
    it; the report's other plots are drawn and recorded."""
    from fusebench.report.sweep import write_report, write_report_plots

    report = write_report(runs, draws=50, plots=False)
    (runs / "plots").mkdir()
    (runs / "plots" / "wins_losses.png").write_bytes(b"\x89PNG mine")
    placed = write_report_plots(report)
    assert (runs / "plots" / "wins_losses.png").read_bytes() == b"\x89PNG mine"
    assert "plots/wins_losses.png not drawn" in caplog.text and "wins_losses.png was not written by fusebench" in \
        caplog.text
    manifest = report_files.read_manifest(runs)
    assert "plots/wins_losses.png" not in manifest and {"plots/paired_gains.png", "summary.md"} <= manifest.keys()
    assert sorted(p.name for p in placed) == sorted(rel.split("/")[1] for rel in manifest if "/" in rel)
    assert not list(runs.glob(f"{report_files.STAGING}*"))


# ---------------------------------------------------------------- a user's files are never replaced

@pytest.mark.parametrize("name", ["summary.md", "summary.csv", "gains.csv", "cost.csv", "plots/cost_vs_gain.png",
                                  "index_effects.csv"])
def test_fusebench_report_refuses_to_replace_a_users_file(runs, capsys, name):
    mine = runs / name
    mine.parent.mkdir(exist_ok=True)
    mine.write_bytes(b"my own notes\n")
    before = snapshot(runs)
    assert report_main([str(runs), "--draws", "50"]) == 2
    line = one_line(capsys, str(mine), "--out")
    assert "was not written by fusebench" in line
    assert snapshot(runs) == before  # nothing written, nothing half-written
    assert report_main([str(runs), "--draws", "50", "--out", str(runs / "report")]) == 0  # elsewhere: written
    assert (runs / "report" / "summary.md").is_file() and (runs / "report" / "plots" / "paired_gains.png").is_file()
    assert mine.read_bytes() == b"my own notes\n"


@pytest.mark.parametrize("damage", ["edited", "folder", "foreign_manifest", "plots_is_a_file"])
def test_a_report_file_edited_since_or_not_a_file_is_refused(runs, capsys, damage):
    assert report_main([str(runs), "--draws", "50"]) == 0
    capsys.readouterr()
    blocked = {"edited": runs / "summary.md", "folder": runs / "gains.csv", "foreign_manifest": runs / "report.sha256",
               "plots_is_a_file": runs / "plots"}[damage]
    if damage == "edited":
        blocked.write_text(blocked.read_text() + "\nmy notes on these results\n")
    elif damage in ("folder", "plots_is_a_file"):
        import shutil

        shutil.rmtree(blocked) if blocked.is_dir() else blocked.unlink()
        blocked.mkdir() if damage == "folder" else blocked.write_text("mine")
    else:
        blocked.write_text("a checksum list of my own\n")
    before = snapshot(runs)
    assert report_main([str(runs), "--draws", "50"]) == 2
    one_line(capsys, str(blocked))
    assert snapshot(runs) == before


@pytest.mark.parametrize("cut", [0, 20, 0.5, 0.8])
def test_a_manifest_cut_short_vouches_for_its_whole_lines_and_is_rebuilt(runs, capsys, cut):
    assert report_main([str(runs), "--draws", "50"]) == 0
    manifest, full = runs / report_files.MANIFEST, report_files.read_manifest(runs)
    data = manifest.read_bytes()
    keep = data[: int(len(data) * cut) if isinstance(cut, float) else cut]
    manifest.write_bytes(keep)
    entries = report_files.read_manifest(runs)
    assert entries is not None  # still fusebench's (even cut within its header): its whole lines count
    complete = {line.split("  ", 1)[1] for line in keep.decode().split("\n")[1:-1]}  # lines ended by a newline
    assert complete <= entries.keys() <= full.keys() and len(entries) < len(full)
    assert report_main([str(runs), "--draws", "50"]) == 2  # what it no longer records is not vouched for ...
    one_line(capsys, "does not record it")
    for rel in report_files.candidates(runs):
        if rel != report_files.MANIFEST and (runs / rel).is_file() and rel not in entries:
            (runs / rel).unlink()  # ... moved away, as the message says
    assert report_main([str(runs), "--draws", "50"]) == 0  # and the manifest is rebuilt
    assert report_files.read_manifest(runs).keys() == full.keys()


@pytest.mark.parametrize("given", ["", "  "])
def test_an_empty_folder_argument_is_refused_not_the_current_folder(runs, capsys, monkeypatch, given):
    monkeypatch.chdir(runs)  # a folder of run dirs: '' must not mean it
    before = snapshot(runs)
    assert report_main([given]) == 2
    one_line(capsys, "SWEEP_DIR is empty", "unset shell variable")
    assert report_main([".", "--out", given]) == 2
    one_line(capsys, "--out is empty")
    assert snapshot(runs) == before


# ---------------------------------------------------------------- the sweep's own report step

def test_the_sweep_report_step_keeps_the_jobs_and_names_the_file_in_its_way(runs):
    (runs / "gains.csv").write_text("my,own\n1,2\n")
    before = snapshot(runs)
    SweepReport.kind, SweepReport.jobs_failed = "run", []
    with pytest.raises(RunDirRefused) as err:  # cli.main: exit 2 and this one line
        SweepReport(draws=50).on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(runs)}}}))
    message = str(err.value)
    assert str(runs / "gains.csv") in message and f"fusebench-report {runs} --out" in message
    assert "results are kept" in message and "\n" not in message
    assert snapshot(runs) == before  # the jobs' results as they were, no report half-written
    with pytest.raises(RunDirRefused, match="gains.csv"):  # a new sweep into it: refused before any job
        from fusebench.app.callback import _check_report_files

        _check_report_files(runs)
    (runs / "gains.csv").unlink()
    SweepReport(draws=50).on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(runs)}}}))
    assert report_files.written(runs, "gains.csv") and SweepReport.failed == []


def test_a_sweep_into_a_dir_holding_a_users_summary_is_refused_before_any_job(tmp_path):
    (tmp_path / "S").mkdir()
    (tmp_path / "S" / "summary.md").write_text("# my summary\n")
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}
    result = subprocess.run([FUSEBENCH, "-m", *SMALL, "plots=false", "fusion=rrf,dbsf", "hydra.sweep.dir=S"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("fusebench: error:")]
    assert len(lines) == 1 and "summary.md" in lines[0] and "hydra.sweep.dir" in lines[0], result.stderr
    assert sorted(p.name for p in (tmp_path / "S").iterdir()) == ["summary.md"]  # no job ran
    assert (tmp_path / "S" / "summary.md").read_text() == "# my summary\n"


# ---------------------------------------------------------------- a damaged metrics.json fusebench wrote

def _cut(path: Path, how) -> None:
    data = path.read_bytes()
    if how == "flipped":
        i = data.index(b'"retrievers"')
        path.write_bytes(data[:i] + b"}" + data[i + 1:])
    else:
        path.write_bytes(data[: int(len(data) * how) if isinstance(how, float) else how])


@pytest.mark.parametrize("how", [0.5, 0.97, 30, 7, 0, "flipped"])
def test_a_damaged_record_in_a_fusebench_run_dir_is_fusebenchs(runs, how):
    run_dir = runs / "rrf"
    _cut(run_dir / "metrics.json", how)
    assert rundir.run_record(run_dir / "metrics.json") is None
    assert rundir.foreign(run_dir) == [] and rundir.damaged_record(run_dir)
    rundir.check_outputs(run_dir)  # a rerun is not refused: it replaces the damaged record
    import numpy as np

    np.save(run_dir / "ranks" / "mine.npy", np.arange(3))  # a file fusebench never names so: still someone else's
    assert rundir.foreign(run_dir) == ["ranks/mine.npy"]


@pytest.mark.parametrize("case", ["no_fusebench_config", "someone_elses_broken_json", "someone_elses_json",
                                  "another_apps_config"])
def test_a_metrics_json_not_shown_to_be_fusebenchs_is_never_replaced(runs, case):
    run_dir = runs / "rrf"
    _cut(run_dir / "metrics.json", 0.5)
    if case == "no_fusebench_config":  # a random folder: no fusebench config, and ranks/ holds another's file
        (run_dir / ".hydra" / "config.yaml").unlink()
        (run_dir / "ranks" / "notes.txt").write_text("mine")
    elif case == "someone_elses_broken_json":
        (run_dir / "metrics.json").write_text('{"accuracy": 0.9, "loss": ')
    elif case == "someone_elses_json":
        (run_dir / "metrics.json").write_text('{\n  "version": 3,\n  "dataset": {\n    "name": "mine"\n  }\n}\n')
    else:
        (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"epochs": 3}}))
        for file in (run_dir / "ranks").iterdir():
            file.rename(run_dir / "ranks" / f"{file.stem}.bak")
    assert not rundir.damaged_record(run_dir)
    assert "metrics.json" in rundir.foreign(run_dir)
    with pytest.raises(FusebenchError, match="fusebench did not write"):
        rundir.check_outputs(run_dir)


def test_a_damaged_record_beside_fusebench_rank_files_alone_is_fusebenchs(runs):
    run_dir = runs / "rrf"
    (run_dir / ".hydra" / "config.yaml").unlink()  # hydra.output_subdir=null: no config beside the outputs
    _cut(run_dir / "metrics.json", 0.3)
    assert rundir.foreign(run_dir) == [] and rundir.damaged_record(run_dir)


@pytest.mark.parametrize("how", [0.5, 0])
def test_a_rerun_replaces_a_damaged_metrics_json_and_says_so(tmp_path, how):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}

    def fusebench(*args):
        return subprocess.run([FUSEBENCH, *SMALL, *args, "hydra.run.dir=X"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    assert fusebench().returncode == 0
    assert subprocess.run([REPORT, "X", "--draws", "50"], cwd=tmp_path, env=env, capture_output=True).returncode == 0
    _cut(tmp_path / "X" / "metrics.json", how)
    result = fusebench("fusion=rrf")
    assert result.returncode == 0, result.stderr
    assert "metrics.json is damaged" in result.stdout + result.stderr and "this run replaces it" in result.stdout
    record = json.loads((tmp_path / "X" / "metrics.json").read_text())
    assert record["fusion"]["method"] == "rrf"
    # the report of the run it replaced went with that run (issue 39, item 8): never beside the new metrics.json
    assert not (tmp_path / "X" / "summary.md").exists() and not (tmp_path / "X" / report_files.MANIFEST).exists()
    assert (tmp_path / "X" / "plots" / "paired_gains.png").is_file()  # the rerun's own plots: not refused


def test_every_table_a_report_writes_is_known(runs):
    from fusebench.report.sweep import SCALING_TABLES

    assert {f"scaling_{name}.csv" for name in SCALING_TABLES} <= set(report_files.TABLES)
    assert report_main([str(runs), "--draws", "50"]) == 0
    written = {str(p.relative_to(runs)) for p in runs.rglob("*") if p.is_file() and p.parts[len(runs.parts)] not in
               ("rrf", "dbsf")}
    assert written - {report_files.MANIFEST} == set(report_files.read_manifest(runs))
    assert written <= set(report_files.candidates(runs))


# ---------------------------------------------------------------- a rerun into a reported run dir (issue 39, item 8)

def test_a_rerun_takes_away_the_report_of_the_run_it_replaces(runs, compose_cfg, monkeypatch, caplog):
    """``fusebench-report RUN_DIR`` describes the run in it: a rerun that writes its outputs moves that report away
    with the earlier run (never a summary of the old run beside the new metrics.json); a rerun that fails leaves
    both as they were; a report file someone edited since is theirs, left as it is."""
    import errno

    run_dir = runs / "rrf"
    assert report_main([str(run_dir), "--draws", "50"]) == 0
    reported = {name for name in report_files.read_manifest(run_dir)}
    assert {"summary.md", "summary.csv", "gains.csv", "report_plots/paired_gains.png"} <= reported
    assert "rrf" in (run_dir / "summary.csv").read_text()
    before = snapshot(run_dir)
    real = os.replace

    def fails_at_metrics(src, dst):  # the new outputs cannot be moved in: the earlier run and its report stay
        if Path(dst).name == "metrics.json" and Path(src).parent.name.startswith(".staging-"):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr("fusebench.report.outputs.os.replace", fails_at_metrics)
    with pytest.raises(FusebenchError, match="could not write the outputs"):
        run(compose_cfg([*TINY, "fusion=dbsf", "plots=false"]), str(run_dir))
    monkeypatch.setattr("fusebench.report.outputs.os.replace", real)
    assert snapshot(run_dir) == before
    (run_dir / "cost.csv").write_text("my notes\n")  # edited since the report: someone else's now
    with caplog.at_level("WARNING", logger="fusebench.report.report_files"):
        run(compose_cfg([*TINY, "fusion=dbsf", "plots=false"]), str(run_dir))
    assert [r.getMessage() for r in caplog.records if r.name == "fusebench.report.report_files"] == [
        f"{run_dir / 'cost.csv'} is left as it is: a report drew it for the run this one replaces, and it was edited "
        "since (someone else's now); it does not describe the new run"]
    left = {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}
    assert not left & (reported - {"cost.csv"}) and report_files.MANIFEST not in left
    assert not (run_dir / "report_plots").exists() and (run_dir / "cost.csv").read_text() == "my notes\n"
    assert json.loads((run_dir / "metrics.json").read_text())["fusion"]["method"] == "dbsf"
    assert not list(run_dir.glob(".staging-*"))
    (run_dir / "cost.csv").unlink()
    assert report_main([str(run_dir), "--draws", "50"]) == 0  # drawn again: of the new run
    assert "dbsf" in (run_dir / "summary.csv").read_text() and "rrf" not in (run_dir / "summary.csv").read_text()
