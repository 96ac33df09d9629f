"""Run and sweep dirs (issue 20, items 6, 7, 9) and the CLI's one-line errors for Hydra's own mistakes and for
files that cannot be read or written.

A rerun into a run dir keeps the earlier run (outputs, and the ``.hydra`` files Hydra rewrote) until it writes
its own; a run dir that is empty, the current folder holding others' files, a file, or cannot be created is
refused before Hydra touches it; fusebench removes nothing it cannot tell it wrote. Every refusal is exit 2
and one ``fusebench: error:`` line naming the config key or the file.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from fusebench import FusebenchError
from fusebench.app import cli, rundir
from fusebench.app.pipeline import run
from fusebench.report.runs import scan_runs
from fusebench.runtime import layout, run_lock

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
SMALL = ["dataset.n_images=200", "dataset.n_captions=1000", "eval.bootstrap.draws=100", "logger=none", "plots=false"]
# the CLI with io.open and os.mkdir failing (FAULT_ERRNO) for paths under FAULT_PREFIX, for reads or for writes
# (FAULT_KIND): a file the user cannot read, a full or read-only disk, even when the tests run as root
FAULTY_CLI = """
import builtins, io, os, sys
prefix, code, kind = os.path.abspath(os.environ["FAULT_PREFIX"]), int(os.environ["FAULT_ERRNO"]), os.environ["FAULT_KIND"]
real_open, real_mkdir = io.open, os.mkdir
def hit(path):
    return isinstance(path, (str, os.PathLike)) and os.path.abspath(path).startswith(prefix)
def faulty_open(file, mode="r", *args, **kwargs):
    if hit(file) and any(c in mode for c in "wax+") == (kind == "write"):
        raise OSError(code, os.strerror(code), os.fspath(file))
    return real_open(file, mode, *args, **kwargs)
def faulty_mkdir(path, *args, **kwargs):
    if hit(path) and kind == "write":
        raise OSError(code, os.strerror(code), os.fspath(path))
    return real_mkdir(path, *args, **kwargs)
io.open = builtins.open = faulty_open
os.mkdir = faulty_mkdir
from fusebench.app.cli import main
sys.argv = ["fusebench", *sys.argv[1:]]
main()
"""


def fusebench(*args, cwd, fault: tuple[str, int, str] | None = None, env: dict[str, str] | None = None):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(Path(cwd).parent / f"{Path(cwd).name}-out"),
           "WANDB_MODE": "disabled", **(env or {})}
    command = [FUSEBENCH, *args]
    if fault is not None:
        env.update(FAULT_PREFIX=str(fault[0]), FAULT_ERRNO=str(fault[1]), FAULT_KIND=fault[2])
        command = [sys.executable, "-c", FAULTY_CLI, *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def one_line_error(result, *fragments, alone: bool = False) -> str:
    """Exit 2 and one ``fusebench: error:`` line holding every fragment; no traceback, no Hydra "Error executing
    job" line; ``alone``: nothing else on stderr (refused before the job started). Returns the line."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Error executing job" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("fusebench: error:")]
    assert len(lines) == 1, result.stderr
    if alone:
        assert result.stderr.strip() == lines[0], result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (hidden ones too), relative path -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def without_logs(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` less the logs and the run dir's lock (``runtime.run_lock``: it names the last run that took it,
    a refused one too; no result)."""
    return {name: data for name, data in files.items() if not name.endswith(".log")
            and Path(name).name != run_lock.LOCK_NAME}


# ---------------------------------------------------------------- item 6: a failed rerun keeps the earlier run

@pytest.mark.slow
@pytest.mark.parametrize("bad", [["eval.bootstrap.draws=0"], ["fusion.top_k=5"], ["models.sim_dfn5b_like.weight=nan"]],
                         ids=["draws", "top_k", "weight"])
def test_a_failed_rerun_keeps_the_earlier_run_and_its_config(tmp_path, bad):
    assert fusebench(*SMALL, "hydra.run.dir=X", cwd=tmp_path).returncode == 0
    before = without_logs(snapshot(tmp_path / "X"))
    assert {"metrics.json", ".hydra/overrides.yaml"} <= set(before) and any(n.startswith("ranks/") for n in before)
    one_line_error(fusebench(*SMALL, *bad, "hydra.run.dir=X", cwd=tmp_path), bad[-1].split("=")[0])
    assert without_logs(snapshot(tmp_path / "X")) == before  # results, and the .hydra config that made them
    scan = scan_runs(tmp_path / "X")
    assert not scan.failed and [r.overrides for r in scan.runs] == [SMALL]


@pytest.mark.slow
def test_a_rerun_stopped_with_ctrl_c_keeps_the_earlier_run(tmp_path):
    assert fusebench(*SMALL, "hydra.run.dir=X", cwd=tmp_path).returncode == 0
    before = without_logs(snapshot(tmp_path / "X"))
    overrides = tmp_path / "X" / ".hydra" / "overrides.yaml"
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([FUSEBENCH, "dataset.n_images=20000", "dataset.n_captions=100000", "logger=none",
                             "hydra.run.dir=X"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while b"n_images=20000" not in overrides.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)  # until Hydra has rewritten the dir's config
    time.sleep(2.0)  # inside the run
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert without_logs(snapshot(tmp_path / "X")) == before


@pytest.mark.slow
def test_a_finished_rerun_replaces_the_earlier_outputs(tmp_path):
    assert fusebench(*SMALL, "plots=true", "hydra.run.dir=X", cwd=tmp_path).returncode == 0
    assert (tmp_path / "X" / "plots").is_dir()
    (tmp_path / "X" / "notes.txt").write_text("mine")
    # every plot fusebench drew is recognised as its own (runtime.layout.PLOTS), so the rerun is not refused
    result = fusebench(*SMALL, "fusion=rrf", "hydra.run.dir=X", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "X" / "plots").exists()  # the earlier run's plots went with its results
    assert (tmp_path / "X" / "notes.txt").read_text() == "mine"
    assert not list((tmp_path / "X").glob(".staging-*"))
    scan = scan_runs(tmp_path / "X")
    assert not scan.failed and scan.runs[0].record.fusion.method == "rrf"
    assert "fusion=rrf" in scan.runs[0].overrides


@pytest.mark.slow
def test_a_finished_run_is_whole_after_the_process_exits(tmp_path):
    """cli.freeze_at_exit leaves cycles that become garbage after it unfinalised: everything a run writes must be
    complete by then. After the process has ended: metrics.json reads back and its checksums match every file,
    every plot is drawn and in the manifest, and fusebench.log ends with the run's last line."""
    from fusebench.stores.files import file_sha256

    result = fusebench(*SMALL, "plots=true", "hydra.run.dir=X", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "X"
    record = json.loads((out / "metrics.json").read_text())
    assert record["files"] and all(file_sha256(out / name) == digest for name, digest in record["files"].items())
    manifest = json.loads((out / "plots" / layout.PLOTS_MANIFEST).read_text())
    assert manifest["plots"] and all(file_sha256(out / "plots" / n) == d for n, d in manifest["plots"].items())
    assert (out / "fusebench.log").read_text().rstrip().endswith(f"outputs written to {out}")


@pytest.mark.slow
def test_a_failed_sweep_rerun_keeps_the_earlier_jobs(tmp_path):
    assert fusebench("-m", *SMALL, "fusion=rrf,dbsf", "hydra.sweep.dir=S", cwd=tmp_path).returncode == 0
    jobs = {job: without_logs(snapshot(tmp_path / "S" / job)) for job in ("0", "1")}
    result = fusebench("-m", *SMALL, "fusion=rrf,dbsf", "fusion.rrf_k=-1", "hydra.sweep.dir=S", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "2 job(s) of the sweep failed: 0, 1" in result.stderr
    for job, files in jobs.items():
        now = without_logs(snapshot(tmp_path / "S" / job))
        error = now.pop("error.txt").decode()  # a user's mistake: its one line, not a traceback
        assert error.startswith("fusebench: error: ") and "fusion.params.rrf_k" in error and error.count("\n") == 1
        assert now == files
    scan = scan_runs(tmp_path / "S")  # the earlier results are kept, but not reported as this sweep's
    assert not scan.runs and sorted(scan.failed) == ["0", "1"]
    assert all("earlier run's results, not reported" in why for why in scan.failed.values())
    assert fusebench("-m", *SMALL, "fusion=rrf,dbsf", "hydra.sweep.dir=S", cwd=tmp_path).returncode == 0
    assert not (tmp_path / "S" / "0" / "error.txt").exists()  # the next finished run swaps it out too


@pytest.mark.slow  # whole jobs
def test_outputs_are_swapped_back_when_the_new_ones_cannot_be_moved_in(compose_cfg, tmp_path, monkeypatch):
    cfg = compose_cfg(["dataset.n_images=50", "dataset.n_captions=100", "logger=none", "plots=false",
                       "eval.lists.store=false"])
    run(cfg, str(tmp_path / "run"))
    before = snapshot(tmp_path / "run")
    real = os.replace

    def fails_at_metrics(src, dst):
        if Path(dst).name == "metrics.json" and Path(src).parent.name.startswith(".staging-"):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr("fusebench.report.outputs.os.replace", fails_at_metrics)
    with pytest.raises(FusebenchError, match="could not write the outputs"):
        run(compose_cfg(["dataset.n_images=50", "dataset.n_captions=100", "logger=none", "plots=false",
                         "eval.lists.store=false", "fusion=rrf"]), str(tmp_path / "run"))
    assert snapshot(tmp_path / "run") == before  # the earlier ranks/ and topk/ moved back, nothing staged left


def test_earlier_config_is_restored_only_while_its_metrics_stand(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- a=1\n")
    (tmp_path / "metrics.json").write_text(json.dumps({"version": 2, "dataset": {}, "retrievers": {}, "run": {},
                                                       "files": {}}))
    rundir.keep_earlier_config(tmp_path)
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- a=2\n")  # Hydra's rewrite for the rerun
    (tmp_path / ".hydra" / "config.yaml").write_text("a: 2\n")
    assert rundir.restore_earlier_config(tmp_path)
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- a=1\n"
    assert not (tmp_path / ".hydra" / "config.yaml").exists()  # the earlier run had none
    rundir.keep_earlier_config(tmp_path)
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- a=3\n")
    (tmp_path / "metrics.json").write_text(json.dumps({"version": 2, "dataset": {}, "retrievers": {}, "run": {},
                                                       "files": {"x": "y"}}))  # the rerun wrote its own
    assert not rundir.restore_earlier_config(tmp_path)
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- a=3\n"


# ---------------------------------------------------------------- item 7: what fusebench did not write is kept

def _someone_elses_files(folder: Path) -> dict[str, bytes]:
    folder.mkdir(exist_ok=True)
    (folder / "notes.txt").write_text("mine")
    (folder / "metrics.json").write_text('{"accuracy": 0.9}\n')
    (folder / "ranks").mkdir()
    np.save(folder / "ranks" / "mine.npy", np.arange(3))
    return snapshot(folder)


@pytest.mark.slow
@pytest.mark.parametrize("args,key", [(["hydra.run.dir="], "hydra.run.dir"), (["hydra.run.dir=."], "hydra.run.dir"),
                                      (["-m", "hydra.sweep.dir="], "hydra.sweep.dir")],
                         ids=["empty", "current_folder", "empty_sweep_dir"])
def test_an_empty_or_current_folder_run_dir_is_refused(tmp_path, args, key):
    work = tmp_path / "work"
    before = _someone_elses_files(work)
    one_line_error(fusebench(*args, *SMALL, cwd=work), key, alone=True)
    assert snapshot(work) == before and not (work / ".hydra").exists()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["foreign_rank_file", "foreign_metrics", "foreign_topk_file"])
def test_a_run_dir_holding_files_fusebench_did_not_write_is_refused(tmp_path, damage):
    assert fusebench(*SMALL, "hydra.run.dir=X", cwd=tmp_path).returncode == 0
    x = tmp_path / "X"
    if damage == "foreign_rank_file":
        np.save(x / "ranks" / "mine.npy", np.arange(3))
    elif damage == "foreign_metrics":
        (x / "metrics.json").write_text('{"accuracy": 0.9}\n')
    else:
        np.savez(x / "topk" / "notes.npz", ids=np.arange(3))
    before = without_logs(snapshot(x))
    line = one_line_error(fusebench(*SMALL, "hydra.run.dir=X", cwd=tmp_path), "hydra.run.dir", alone=True)
    assert "fusebench did not write" in line
    assert without_logs(snapshot(x)) == before


@pytest.mark.slow
def test_a_damaged_rank_file_of_the_earlier_run_is_replaced_not_a_dead_end(tmp_path):
    """A file the earlier record lists is fusebench's even when its bytes changed (damage): the rerun replaces it."""
    assert fusebench(*SMALL, "hydra.run.dir=X", cwd=tmp_path).returncode == 0
    rank_file = next((tmp_path / "X" / "ranks").glob("*.t2i.npy"))
    good = rank_file.read_bytes()
    np.save(rank_file, np.load(rank_file)[::-1])
    result = fusebench(*SMALL, "hydra.run.dir=X", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert rank_file.read_bytes() == good


@pytest.mark.slow
def test_the_current_folder_holding_only_fusebench_outputs_is_a_run_dir(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for _ in range(2):  # the rerun finds nothing but the first run's own files (its cache in out/ too)
        result = fusebench(*SMALL, "paths.output_dir=out", "hydra.run.dir=.", cwd=work)
        assert result.returncode == 0, result.stderr
    assert not scan_runs(work).failed and len(scan_runs(work).runs) == 1


def test_a_users_file_under_a_plots_name_is_refused_never_overwritten(tmp_path):
    """A user's file at plots/recall_bars.png was replaced by a rerun (exit 0): the run's plots manifest records
    each plot's sha256, so only the plots the run drew are its own."""
    from fusebench.runtime.layout import PLOTS_MANIFEST, plots_manifest_text, read_plots_manifest

    plots = tmp_path / "plots"
    plots.mkdir()
    for name in ("recall_bars.png", "paired_gains.png"):
        (plots / name).write_bytes(b"\x89PNG drawn")
    from fusebench.stores.files import file_sha256

    (plots / PLOTS_MANIFEST).write_text(plots_manifest_text({n: file_sha256(plots / n) for n in
                                                             ("recall_bars.png", "paired_gains.png")}))
    assert rundir.foreign(tmp_path) == []
    (plots / "recall_bars.png").write_text("my own notes")  # the user's file, under a plot's name
    assert rundir.foreign(tmp_path) == ["plots/recall_bars.png"]
    with pytest.raises(FusebenchError, match="plots/recall_bars.png"):
        rundir.check_outputs(tmp_path)
    assert (plots / "recall_bars.png").read_text() == "my own notes"
    (plots / "recall_bars.png").unlink()
    (plots / "tune_curve.png").write_bytes(b"\x89PNG")  # a plot's name the run did not draw: not its own
    assert rundir.foreign(tmp_path) == ["plots/tune_curve.png"]
    (plots / "tune_curve.png").unlink()
    (plots / PLOTS_MANIFEST).write_text(plots_manifest_text({"paired_gains.png": None}))  # stopped while drawing
    assert rundir.foreign(tmp_path) == []
    whole = (plots / PLOTS_MANIFEST).read_bytes()
    for cut in (len(whole) // 2, 30, 0):  # fusebench's, cut short (to empty): its plots by name, never a dead end
        (plots / PLOTS_MANIFEST).write_bytes(whole[:cut])
        assert rundir.foreign(tmp_path) == []
    (plots / PLOTS_MANIFEST).write_text("{}")  # a manifest that is not fusebench's is someone else's file
    assert PLOTS_MANIFEST in " ".join(rundir.foreign(tmp_path)) and read_plots_manifest(plots) is None


@pytest.mark.slow
def test_a_rerun_refuses_a_user_file_that_replaced_a_plot(tmp_path):
    assert fusebench(*SMALL, "plots=true", "hydra.run.dir=X", cwd=tmp_path).returncode == 0
    bars = tmp_path / "X" / "plots" / "recall_bars.png"
    assert bars.is_file() and (bars.parent / ".fusebench-plots.json").is_file()
    bars.write_text("my own notes")
    result = fusebench(*SMALL, "plots=true", "hydra.run.dir=X", cwd=tmp_path)
    assert result.returncode == 2 and "plots/recall_bars.png" in result.stderr and len(result.stderr.splitlines()) == 1
    assert bars.read_text() == "my own notes"


def test_foreign_recognises_what_fusebench_wrote(tmp_path):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "topk").mkdir()
    (tmp_path / "plots").mkdir()
    np.save(tmp_path / "ranks" / "a.t2i.npy", np.arange(5))
    np.savez(tmp_path / "topk" / "a.t2i.npz", ids=np.arange(5))
    (tmp_path / "plots" / "recall_bars.png").write_bytes(b"\x89PNG")
    (tmp_path / "error.txt").write_text("Traceback (most recent call last):\n  ...\n")
    assert rundir.foreign(tmp_path) == ["ranks/a.t2i.npy", "topk/a.t2i.npz"]  # no record to check them by
    from fusebench.stores.files import file_sha256

    files = {f"{sub}/{p.name}": file_sha256(p) for sub in ("ranks", "topk") for p in (tmp_path / sub).iterdir()}
    (tmp_path / "metrics.json").write_text(json.dumps({"version": 2, "dataset": {}, "retrievers": {}, "run": {},
                                                       "files": files}))
    assert rundir.foreign(tmp_path) == []
    (tmp_path / "plots" / "chart.png").write_bytes(b"\x89PNG")
    (tmp_path / "error.txt").write_text("my notes")
    np.save(tmp_path / "ranks" / "a.t2i.npy", np.arange(6))  # listed by the record: fusebench's, damaged
    np.save(tmp_path / "ranks" / "b.t2i.npy", np.arange(6))  # not listed: someone else's
    assert rundir.foreign(tmp_path) == ["ranks/b.t2i.npy", "plots/chart.png", "error.txt"]
    with pytest.raises(FusebenchError, match="hydra.run.dir"):
        rundir.check_outputs(tmp_path)
    assert (tmp_path / "metrics.json").is_file()  # refused, none of it removed


# ---------------------------------------------------------------- item 9: a run dir that cannot be one

@pytest.mark.slow
@pytest.mark.parametrize("args,key", [
    (["hydra.run.dir=a_file"], "hydra.run.dir"),
    (["hydra.run.dir=/proc/fusebench-x/run"], "hydra.run.dir"),
    (["-m", "hydra.sweep.dir=a_file"], "hydra.sweep.dir"),
    (["-m", "hydra.sweep.dir=/proc/fusebench-x"], "hydra.sweep.dir"),
], ids=["run_dir_is_a_file", "run_dir_cannot_be_created", "sweep_dir_is_a_file", "sweep_dir_cannot_be_created"])
def test_a_run_dir_that_is_a_file_or_cannot_be_created(tmp_path, args, key):
    if "/proc/" in args[-1] and not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    (tmp_path / "a_file").write_text("x")
    line = one_line_error(fusebench(*args, *SMALL, cwd=tmp_path), key, alone=True)
    assert args[-1].split("=", 1)[1] in line
    assert (tmp_path / "a_file").read_text() == "x"


@pytest.mark.slow
def test_an_output_root_that_cannot_be_created_names_the_run_dir(tmp_path):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "a_file" / "out"), "WANDB_MODE": "disabled"}
    (tmp_path / "a_file").write_text("x")
    result = subprocess.run([FUSEBENCH, *SMALL], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    one_line_error(result, "hydra.run.dir", "paths.output_dir", alone=True)


# ---------------------------------------------------------------- Hydra's own mistakes: one line

def _parse_error(override: str) -> OverrideParseException:
    with pytest.raises(OverrideParseException) as err:
        OverridesParser.create().parse_overrides([override])
    return err.value


@pytest.mark.parametrize("override,fragment", [
    ("eval.ks=[1", "no viable alternative at input '[1'"),
    ("foo", "missing EQUAL"),
    ("fusion.rrf_k=60'", "unexpected character \"'\" at position 16"),
])
def test_bad_override_syntax_is_one_line_naming_the_override(override, fragment):
    message = cli.hydra_error_message(_parse_error(override))
    assert "\n" not in message and repr(override) in message and fragment in message


@pytest.mark.slow
def test_bad_override_syntax_through_the_cli(tmp_path):
    one_line_error(fusebench(*SMALL, "eval.ks=[1,5", "hydra.run.dir=run", cwd=tmp_path),
                   "'eval.ks=[1,5'", alone=True)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("override,group", [("fusion=nonexistent", "fusion"), ("dataset=nope", "dataset")])
def test_an_unknown_config_option_is_one_line_with_the_valid_ones(tmp_path, override, group):
    line = one_line_error(fusebench(*SMALL, override, "hydra.run.dir=run", cwd=tmp_path), override, alone=True)
    options = sorted(p.stem for p in (Path(cli.CONFIG_DIR) / group).glob("*.yaml"))
    assert f"valid: {', '.join(options)}." in line


# ---------------------------------------------------------------- files that cannot be read or written

@pytest.mark.slow
def test_an_unreadable_manifest_is_named_as_unreadable(tmp_path):
    manifest = tmp_path / "M.jsonl"
    manifest.write_text(json.dumps({"image_id": "a", "captions": ["x"]}) + "\n")
    result = fusebench("dataset=manifest", f"dataset.manifest={manifest}", "logger=none", "hydra.run.dir=run",
                       cwd=tmp_path, fault=(manifest, errno.EACCES, "read"))
    line = one_line_error(result, f"cannot read {manifest}: Permission denied")
    assert "hydra.run.dir" not in line and "cannot write" not in line


@pytest.mark.slow
def test_an_unreadable_npy_is_named_as_unreadable(vectors_case, tmp_path):
    files = vectors_case["files"]
    result = fusebench(
        "dataset=manifest", f"dataset.manifest={vectors_case['manifest']}", "models=[]", "logger=none",
        "+models.a.kind=vectors", f"+models.a.image_embeddings={files['A'][0]}",
        f"+models.a.text_embeddings={files['A'][1]}", "hydra.run.dir=run", cwd=tmp_path,
        fault=(files["A"][1], errno.EACCES, "read"))
    one_line_error(result, f"cannot read {files['A'][1]}: Permission denied")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["read_only_disk", "under_a_file"])
def test_a_cache_that_cannot_be_written_names_embed_cache_dir(tmp_path, case):
    cache = tmp_path / "cache"
    if case == "under_a_file":
        cache.write_text("x")
        cache = cache / "sub"
    fault = (cache, errno.EROFS, "write") if case == "read_only_disk" else None
    result = fusebench(*SMALL, f"embed.cache.dir={cache}", "hydra.run.dir=run", cwd=tmp_path, fault=fault)
    line = one_line_error(result, "embed.cache.dir")
    assert "hydra.run.dir" not in line


@pytest.mark.parametrize("error,fragments", [
    (OSError(errno.ENOSPC, "No space left on device", "/c/lists/ab/x.npz"), ["embed.cache.dir=/c"]),
    (OSError(errno.EACCES, "Permission denied", "/c/lists/ab/x.npz"), ["embed.cache.dir=/c"]),
    (OSError(errno.ENOSPC, "No space left on device", "/runs/1/ranks/a.npy"), ["hydra.run.dir=/runs/1"]),
    (OSError(errno.EACCES, "Permission denied", "/data/M.jsonl"), ["cannot read /data/M.jsonl"]),
    (OSError(errno.EROFS, "Read-only file system", "/elsewhere/x"), ["cannot write /elsewhere/x"]),
])
def test_os_error_message_names_the_place(monkeypatch, error, fragments):
    monkeypatch.setattr(cli, "PLACES", {"hydra.run.dir": "/runs/1", "embed.cache.dir": "/c"})
    message = cli.os_error_message(error)
    assert all(f in message for f in fragments), message


# ---------------------------------------------------------------- sweep job dirs: one per job, inside the sweep dir

@pytest.mark.slow
@pytest.mark.parametrize("subdir,fragment", [("same", "same for every job"), ("", "is empty"),
                                             ("../../d7", "climbs out"), ("/proc/x", "absolute path")],
                         ids=["constant", "empty", "dotdot", "absolute"])
def test_a_job_dir_pattern_that_does_not_give_each_job_its_own_dir_is_refused(tmp_path, subdir, fragment):
    result = fusebench("-m", *SMALL, "hydra.sweep.dir=S", f"hydra.sweep.subdir={subdir}", "fusion=rrf,dbsf,sum",
                       cwd=tmp_path)
    one_line_error(result, "hydra.sweep.subdir", fragment, alone=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # refused before anything was created
    assert not (tmp_path.parent / "d7").exists()


@pytest.mark.slow
@pytest.mark.parametrize("args,fragment", [
    (["hydra.sweep.subdir=${hydra.job.override_dirname}", "hydra.job.config.override_dirname.exclude_keys=[fusion]"],
     "which job 0 of this sweep writes too"),
    (["hydra.sweep.subdir=${oc.env:FUSEBENCH_TEST_ELSEWHERE}/${hydra.job.num}"], "not a folder inside the sweep dir"),
], ids=["same_dir_for_two_jobs", "resolves_outside"])
def test_job_dirs_are_checked_as_resolved_before_any_job_runs(tmp_path, args, fragment):
    """A pattern that names a per-job key can still resolve to one dir for two jobs, or to a dir elsewhere: the
    sweeper works out every job's dir before the first job runs."""
    result = fusebench("-m", *SMALL, "hydra.sweep.dir=S", *args, "fusion=rrf,sum", cwd=tmp_path,
                       env={"FUSEBENCH_TEST_ELSEWHERE": str(tmp_path / "elsewhere")})
    one_line_error(result, "hydra.sweep.subdir", fragment)
    assert not list(tmp_path.rglob("metrics.json")) and not (tmp_path / "elsewhere").exists()


@pytest.mark.slow
def test_a_job_dir_an_earlier_job_of_the_sweep_wrote_stops_the_sweep_with_hydras_sweeper(tmp_path):
    """With Hydra's own sweeper (no check before the jobs) the second job into the first one's dir is refused as
    it starts, and the first job's config, which Hydra had just overwritten, is put back."""
    result = fusebench("-m", *SMALL, "hydra/sweeper=basic", "hydra.sweep.dir=S",
                       "hydra.sweep.subdir=${hydra.job.override_dirname}",
                       "hydra.job.config.override_dirname.exclude_keys=[fusion]", "fusion=rrf,sum", cwd=tmp_path)
    one_line_error(result, "hydra.sweep.subdir", "which job 0 of this sweep already wrote")
    [job_dir] = [p.parent for p in (tmp_path / "S").rglob("metrics.json")]
    assert "- fusion=rrf" in (job_dir / ".hydra" / "overrides.yaml").read_text()
    assert [r.record.fusion.method for r in scan_runs(tmp_path / "S").runs] == ["rrf"]


def test_check_subdir_needs_a_per_job_relative_path():
    for good in ("${hydra.job.num}", "${hydra:job.id}", "run_${hydra.job.num}", "${hydra.job.override_dirname}",
                 "a/${ hydra.job.num }"):
        rundir.check_subdir(good)
    for bad, fragment in (("same", "same for every job"), ("", "empty"), ("  ", "empty"), (None, "empty"),
                          (5, "same for every job"), ("/abs/${hydra.job.num}", "absolute"),
                          ("../${hydra.job.num}", "climbs out"), ("${hydra.job.name}", "same for every job")):
        with pytest.raises(FusebenchError, match=fragment) as err:
            rundir.check_subdir(bad)
        assert "hydra.sweep.subdir" in str(err.value)


def test_check_job_dir_refuses_a_shared_or_outside_dir(tmp_path):
    taken: dict[str, int] = {}
    first = rundir.check_job_dir(tmp_path / "S", "0", 0, taken)
    assert first == str(tmp_path / "S" / "0") and taken == {first: 0}
    with pytest.raises(FusebenchError, match="which job 0 of this sweep writes too"):
        rundir.check_job_dir(tmp_path / "S", "./0", 1, taken)
    for outside in ("", ".", "../x", str(tmp_path / "x"), "a/../../x"):
        with pytest.raises(FusebenchError, match="not a folder inside the sweep dir"):
            rundir.check_job_dir(tmp_path / "S", outside, 2, taken)
    assert rundir.check_job_dir(tmp_path / "S", "a=1/b", 3, taken) == str(tmp_path / "S" / "a=1" / "b")


# ---------------------------------------------------------------- a failed job of a sweep rerun: failed, not stale

@pytest.mark.slow
def test_a_failed_job_of_a_sweep_rerun_is_reported_as_failed_not_with_its_earlier_results(tmp_path):
    assert fusebench("-m", *SMALL, "fusion=rrf,sum", "hydra.sweep.dir=S", cwd=tmp_path).returncode == 0
    earlier = without_logs(snapshot(tmp_path / "S" / "0"))
    result = fusebench("-m", *SMALL, "fusion=rrf,sum", "fusion.score_map=atan", "hydra.sweep.dir=S", cwd=tmp_path)
    assert result.returncode == 1 and "1 job(s) of the sweep failed: 0" in result.stderr, result.stderr
    assert "(1 runs, 1 failed)" in result.stdout + result.stderr  # Hydra's log line of the report
    now = without_logs(snapshot(tmp_path / "S" / "0"))
    error = now.pop("error.txt").decode()
    assert error.startswith("fusebench: error: fusion.score_map") and error.count("\n") == 1
    assert now == earlier  # the earlier results are never lost ...
    scan = scan_runs(tmp_path / "S")  # ... nor reported as this sweep's
    assert list(scan.failed) == ["0"] and "earlier run's results, not reported" in scan.failed["0"]
    assert [(r.record.fusion.method, r.record.fusion.score_map) for r in scan.runs] == [("sum", "atan")]
    summary = (tmp_path / "S" / "summary.md").read_text()
    assert "1 finished runs, 1 failed: 0." in summary and "- 0: the job failed (see error.txt)" in summary


@pytest.mark.slow  # a whole job
def test_scan_counts_a_dir_with_error_txt_as_failed(compose_cfg, tmp_path):
    cfg = compose_cfg(["dataset.n_images=50", "dataset.n_captions=100", "logger=none", "plots=false",
                       "eval.lists.store=false"])
    run(cfg, str(tmp_path / "S" / "0"))
    assert len(scan_runs(tmp_path / "S").runs) == 1
    error = tmp_path / "S" / "0" / "error.txt"
    for text in ("fusebench: error: eval.bootstrap.draws=0 is not valid\n",
                 "Traceback (most recent call last):\n  File ...\nValueError: x\n"):
        error.write_text(text)
        assert layout.is_error_file(error)
        scan = scan_runs(tmp_path / "S")
        assert not scan.runs and "earlier run's results, not reported" in scan.failed["0"]
    error.write_text("my notes\n")  # not fusebench's: not a sign of a failed job (a rerun refuses the dir)
    assert not layout.is_error_file(error) and len(scan_runs(tmp_path / "S").runs) == 1
    (tmp_path / "S" / "1").mkdir()  # a job that failed before writing anything but its error.txt
    (tmp_path / "S" / "1" / "error.txt").write_text("fusebench: error: x\n")
    assert scan_runs(tmp_path / "S").failed == {"1": "no metrics.json (the job failed or was stopped; see error.txt)"}


# ---------------------------------------------------------------- another Hydra app's run dir

@pytest.mark.slow
@pytest.mark.parametrize("sweep", [False, True], ids=["run_dir", "sweep_job_dir"])
def test_another_hydra_apps_run_dir_is_refused(tmp_path, sweep):
    theirs = tmp_path / ("S/1" if sweep else "X") / ".hydra"
    theirs.mkdir(parents=True)
    (theirs / "config.yaml").write_text("my: cfg\n")
    (theirs / "overrides.yaml").write_text("- my=cfg\n")
    before = snapshot(theirs)
    args = ["-m", "hydra.sweep.dir=S", "fusion=rrf,sum"] if sweep else ["hydra.run.dir=X"]
    line = one_line_error(fusebench(*args, *SMALL, cwd=tmp_path), "hydra.sweep.dir" if sweep else "hydra.run.dir",
                          "not a fusebench config")
    assert snapshot(theirs) == before and not list(tmp_path.rglob("metrics.json"))  # no job ran
    assert "job 1" in line if sweep else True


def test_foreign_hydra_recognises_a_fusebench_config(tmp_path):
    assert rundir.foreign_hydra(tmp_path) is None  # no .hydra
    (tmp_path / ".hydra").mkdir()
    assert rundir.foreign_hydra(tmp_path) is None  # empty
    config = tmp_path / ".hydra" / "config.yaml"
    for text in ("my: cfg\n", "- a\n", "not: [valid\n", "models: {}\nfusion: {}\n"):
        config.write_text(text)
        assert "not a fusebench config" in rundir.foreign_hydra(tmp_path)
    config.write_text("models: {}\nfusion: {method: rrf}\neval: {ks: [1]}\ndataset: {}\n")
    assert rundir.foreign_hydra(tmp_path) is None
    assert rundir.foreign_hydra(tmp_path, None) is None
    config.unlink()
    (tmp_path / ".hydra" / "hydra.yaml").write_text("hydra: {}\n")
    assert "without a fusebench config.yaml" in rundir.foreign_hydra(tmp_path)
    with pytest.raises(FusebenchError, match="choose another hydra.run.dir"):
        rundir.check_dir(tmp_path, "hydra.run.dir")


# ---------------------------------------------------------------- an empty output or data root

@pytest.mark.slow
@pytest.mark.parametrize("args,env,key,variable", [
    (["paths.output_dir="], {}, "paths.output_dir", "FUSEBENCH_OUTPUT"),
    (["-m", "fusion=rrf,sum"], {"FUSEBENCH_OUTPUT": ""}, "paths.output_dir", "FUSEBENCH_OUTPUT"),
    ([], {"FUSEBENCH_DATA": ""}, "paths.data_root", "FUSEBENCH_DATA"),
], ids=["output_dir_override", "output_env_sweep", "data_env"])
def test_an_empty_output_or_data_root_is_refused(tmp_path, args, env, key, variable):
    root_before = set(os.listdir("/"))
    one_line_error(fusebench(*args, *SMALL, cwd=tmp_path, env=env), key, variable, alone=True)
    assert set(os.listdir("/")) == root_before and not list(tmp_path.iterdir())


# ---------------------------------------------------------------- values that cannot be resolved

@pytest.mark.slow
@pytest.mark.parametrize("args,key,alone", [
    (["hydra.run.dir=${oc.env:NOPE_UNSET}"], "hydra.run.dir", True),
    (["-m", "hydra.sweep.dir=${oc.env:NOPE_UNSET}"], "hydra.sweep.dir", True),
    (["embed.cache.dir=${oc.env:NOPE_UNSET}", "hydra.run.dir=run"], "embed.cache.dir", False),
    (["eval.bootstrap.draws=${nope.key}", "hydra.run.dir=run"], "eval.bootstrap.draws", True),
], ids=["run_dir", "sweep_dir", "cache_dir", "report_setting"])
def test_a_value_that_cannot_be_resolved_is_one_line_naming_the_key(tmp_path, args, key, alone):
    env = {k: v for k, v in os.environ.items() if k != "NOPE_UNSET"}
    sweep = args[:1] == ["-m"]
    command = [FUSEBENCH, *args[:sweep], *SMALL, *args[sweep:]]  # after SMALL: its eval.bootstrap.draws too
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**env, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"})
    line = one_line_error(result, f"cannot resolve {key}:", alone=alone)
    assert "NOPE_UNSET" in line or "nope.key" in line


def test_config_error_message_names_the_override_when_omegaconf_gives_no_key():
    from omegaconf.errors import InterpolationKeyError

    message = cli.config_error_message(InterpolationKeyError("Interpolation key 'nope.key' not found"),
                                       ["dataset=sim", "eval.bootstrap.draws=${nope.key}"])
    assert message.startswith("cannot resolve eval.bootstrap.draws: Interpolation key 'nope.key' not found")
    assert "cannot resolve a config value:" in cli.config_error_message(InterpolationKeyError("x"), [])


# ---------------------------------------------------------------- a cache dir that cannot be created

def test_check_writable_names_the_key_of_the_folder(tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(FusebenchError) as err:
        rundir.check_writable(tmp_path / "a_file", "embed.cache.dir")
    assert str(err.value).startswith(f"the embedding cache {tmp_path / 'a_file'} cannot be written (it is a file")
    assert "embed.cache.dir=..." in str(err.value) and "hydra.run.dir" not in str(err.value)
    if Path("/proc/self").exists():
        with pytest.raises(FusebenchError, match=r"the embedding cache /proc/fusebench-x cannot be written .*"
                                                 r"embed\.cache\.dir=\.\.\."):
            rundir.check_writable("/proc/fusebench-x", "embed.cache.dir")
    with pytest.raises(FusebenchError, match=r"the run dir .* choose another with hydra\.run\.dir=\.\.\. "
                                             r"\(or paths\.output_dir=\.\.\.\)"):
        rundir.check_writable(tmp_path / "a_file")


def test_a_missing_path_in_a_folder_fusebench_writes_is_the_environment(monkeypatch):
    monkeypatch.setattr(cli, "PLACES", {"hydra.run.dir": "/runs/1", "embed.cache.dir": "/proc/x"})
    inside = FileNotFoundError(errno.ENOENT, "No such file or directory", "/proc/x/lists")
    assert cli.is_environment(inside)
    message = cli.os_error_message(inside)
    assert "embed.cache.dir=..." in message and "/proc/x/lists" in message
    assert not cli.is_environment(FileNotFoundError(errno.ENOENT, "No such file or directory", "/elsewhere/x"))
    assert not cli.is_environment(ValueError("x"))


@pytest.mark.slow
def test_a_cache_dir_that_cannot_be_created_is_one_line(tmp_path):
    if not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    result = fusebench(*SMALL, "embed.cache.dir=/proc/fusebench-x", "hydra.run.dir=run", cwd=tmp_path)
    line = one_line_error(result, "embed.cache.dir", "/proc/fusebench-x")
    assert "hydra.run.dir" not in line


# ---------------------------------------------------------------- a sweep without jobs

@pytest.mark.slow
@pytest.mark.parametrize("override", ["fusion=glob(*nomatch*)", "eval.bootstrap.seed=range(0,0)"],
                         ids=["glob", "empty_range"])
def test_a_sweep_without_jobs_is_refused(tmp_path, override):
    line = one_line_error(fusebench("-m", *SMALL, override, "hydra.sweep.dir=S", cwd=tmp_path),
                          "the sweep has no jobs", f"{override} matches nothing", alone=True)
    assert not (tmp_path / "S").exists()
    if override.startswith("fusion="):
        assert "rrf" in line  # the group's options


@pytest.mark.slow
def test_a_job_refused_for_a_users_error_txt_is_reported_as_failed(tmp_path):
    """A user's error.txt in a job dir refuses the job (never overwritten); the sweep's report and a later
    fusebench-report list the job as failed and leave the earlier run's results out, not report them as this
    sweep's."""
    assert fusebench("-m", *SMALL, "fusion=dbsf,rrf", "hydra.sweep.dir=S", cwd=tmp_path).returncode == 0
    (tmp_path / "S" / "1" / "error.txt").write_text("my notes")
    result = fusebench("-m", *SMALL, "fusion=dbsf,sum", "hydra.sweep.dir=S", cwd=tmp_path)
    assert result.returncode == 1
    assert "is not fusebench's, so it was left as it is" in result.stderr
    assert (tmp_path / "S" / "1" / "error.txt").read_text() == "my notes"
    summary = (tmp_path / "S" / "summary.md").read_text()
    assert "fused rrf" not in summary and "job 1 failed" in summary
    report = subprocess.run([str(Path(sys.executable).with_name("fusebench-report")), "S"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "fused rrf" not in (tmp_path / "S" / "summary.md").read_text()
    # the sweep run again with nothing refused: the job is finished again, reported
    (tmp_path / "S" / "1" / "error.txt").unlink()
    assert fusebench("-m", *SMALL, "fusion=dbsf,sum", "hydra.sweep.dir=S", cwd=tmp_path).returncode == 0
    assert "fused sum" in (tmp_path / "S" / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("jobs_file", ["cut short", "a user's"])
def test_a_failed_job_is_never_reported_whatever_multirun_jobs_json_holds(tmp_path, jobs_file):
    """With the sweep's multirun_jobs.json cut short (rebuilt) or a user's (left alone), the sweep's own report
    still lists the job it saw fail and leaves the earlier results in its dir out."""
    from fusebench.report.runs import read_jobs

    assert fusebench("-m", *SMALL, "fusion=dbsf,rrf", "hydra.sweep.dir=S", cwd=tmp_path).returncode == 0
    jobs = tmp_path / "S" / "multirun_jobs.json"
    jobs.write_bytes(jobs.read_bytes()[:40] if jobs_file == "cut short" else b"my own list\n")
    (tmp_path / "S" / "1" / "error.txt").write_text("my notes")
    result = fusebench("-m", *SMALL, "fusion=dbsf,sum", "hydra.sweep.dir=S", cwd=tmp_path)
    assert result.returncode == 1
    summary = (tmp_path / "S" / "summary.md").read_text()
    assert "fused rrf" not in summary and "fused sum" not in summary and "- 1: the sweep's job" in summary, summary
    if jobs_file == "cut short":
        assert read_jobs(jobs) is not None  # fusebench's own file, damaged: rebuilt
    else:
        assert jobs.read_bytes() == b"my own list\n"


@pytest.mark.slow
def test_a_file_where_a_job_dir_goes_stops_the_sweep_before_any_job(tmp_path):
    (tmp_path / "S").mkdir()
    (tmp_path / "S" / "1").write_text("mine")
    result = fusebench("-m", *SMALL, "fusion=rrf,sum", "hydra.sweep.dir=S", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "job 1's dir" in result.stderr and "is a file" in result.stderr
    assert (tmp_path / "S" / "1").read_text() == "mine" and not (tmp_path / "S" / "0").exists()
