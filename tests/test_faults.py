"""Fault injection: hostile inputs, damaged files and interrupted runs, each checked for the exit code, a
message that names the file/line/key, no traceback, and what is left on disk.

Every on-disk format fusebench reads gets a truncated, a byte-flipped and a wrong-type variant here (or
in test_list_store.py for the list and score stores): user inputs (manifest, Karpathy JSON, Flickr txt,
.npy vectors) end in exit 2 naming the file; files fusebench wrote (cache chunks and entries, run outputs)
are reported and rebuilt or listed as damaged, never trusted.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.tiers import fast_first
from hydra.errors import HydraException

from fusebench import FusebenchError
from fusebench.app.cache_cli import main as cache_main
from fusebench.app.cli import CONFIG_DIR, hydra_error_message, unknown_models
from fusebench.app.pipeline import run
from fusebench.data.karpathy import read_annotations
from fusebench.data.manifest import load_manifest
from fusebench.evaluation.record import RunRecord
from fusebench.report.cli import main as report_main
from fusebench.report.sweep import scan_runs
from fusebench.report.table import format_table
from fusebench.stores.embeddings import EmbeddingCache

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
SMALL = ["dataset.n_images=200", "dataset.n_captions=1000", "eval.bootstrap.draws=100", "logger=none", "plots=false"]


def fusebench(*args, cwd, env=None, timeout=300):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(Path(cwd) / "out"), "WANDB_MODE": "disabled", **(env or {})}
    return subprocess.run([FUSEBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def user_error(result, *fragments):
    """Exit 2, one ``fusebench: error:`` message holding every fragment, no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "fusebench: error:" in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip(path: Path, at: float = 0.5, offset: int | None = None) -> None:
    """Replace one byte (at a fraction of the file, or at ``offset``) with 0xFF: never valid UTF-8, so text
    files fail to decode; binaries fail their checks."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at) if offset is None else offset
    data[i] = 0xFF if data[i] != 0xFF else 0x00
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- user inputs: manifest, annotations, vectors

def _manifest(tmp_path: Path, n: int = 6) -> Path:
    path = tmp_path / "M.jsonl"
    path.write_text("".join(json.dumps({"image_id": f"i{i}", "captions": [f"caption of image {i}"]}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def test_manifest_not_utf8_names_the_line(tmp_path):
    path = _manifest(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"caption", "caf\u00e9".encode("latin-1"))  # Latin-1 bytes on line 4
    path.write_bytes(b"".join(lines))
    with pytest.raises(FusebenchError, match=r"M\.jsonl:4: not valid UTF-8 \(byte 0xe9 at column \d+\)"):
        load_manifest(path)


@pytest.mark.parametrize("damage,fragment", [
    (lambda p: truncate(p, 0.55), "not valid JSON"),
    (lambda p: flip(p, 0.55), "not valid UTF-8"),
    (lambda p: p.write_text('[1, 2]\n'), "expected a JSON object"),
    (lambda p: p.write_bytes(np.arange(50, dtype=np.float64).tobytes()), "M.jsonl:1"),
])
def test_damaged_manifest_names_file_and_line(tmp_path, damage, fragment):
    path = _manifest(tmp_path)
    damage(path)
    with pytest.raises(FusebenchError, match=r"M\.jsonl:\d+: ") as err:
        load_manifest(path)
    assert fragment in str(err.value)


@pytest.mark.parametrize("damage,fragment", [
    (lambda p: truncate(p, 0.5), "not valid JSON"),
    (lambda p: flip(p, 0.5), "not valid UTF-8"),
    (lambda p: p.write_text("[1, 2]"), "missing key 'images'"),
])
def test_damaged_karpathy_json_names_the_file(tmp_path, damage, fragment):
    path = tmp_path / "dataset_coco.json"
    images = [{"filename": f"{i}.jpg", "filepath": "val2014", "split": "test",
               "sentences": [{"raw": f"a caption of image {i}"}]} for i in range(20)]
    path.write_text(json.dumps({"images": images}), encoding="utf-8")
    damage(path)
    with pytest.raises(FusebenchError, match=str(path).replace(".", r"\.")) as err:
        read_annotations(path)
    assert fragment in str(err.value)


def test_flickr_txt_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "flickr30k_test_karpathy.txt"
    path.write_bytes(b"image,caption\n1.jpg,a dog\n2.jpg,a caf\xe9\n")
    with pytest.raises(FusebenchError, match=r"karpathy\.txt:3: not valid UTF-8"):
        read_annotations(path)


def _vectors_args(vectors_case, image: Path) -> list[str]:
    return ["dataset=manifest", f"dataset.manifest={vectors_case['manifest']}", "models=[]", "+models.a.kind=vectors",
            f"+models.a.image_embeddings={image}", f"+models.a.text_embeddings={vectors_case['files']['A'][1]}",
            "eval.bootstrap.draws=50", "logger=none", "plots=false"]


@pytest.mark.slow
@pytest.mark.parametrize("damage,fragment", [
    (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    (lambda p: p.write_text("0.1 0.2 0.3\n0.4 0.5 0.6\n"), "is not a .npy file"),
    (lambda p: truncate(p, 0.5), "is not a readable .npy array"),
    (lambda p: flip(p, 0.02), "is not a readable .npy array"),  # inside NumPy's header
    (lambda p: np.save(p, np.array([{"a": 1}], dtype=object)), "is not a readable .npy array"),
    (lambda p: np.save(p, np.zeros(40, dtype=np.float32)), "image embeddings"),  # 1-D: wrong shape
])
def test_damaged_vectors_exit_2_naming_the_file(vectors_case, tmp_path, damage, fragment):
    bad = tmp_path / "bad.npy"
    shutil.copy(vectors_case["files"]["A"][0], bad)
    damage(bad)
    result = fusebench(*_vectors_args(vectors_case, bad), "hydra.run.dir=run", cwd=tmp_path)
    user_error(result, str(bad), fragment)
    assert not (tmp_path / "run" / "metrics.json").exists() and not (tmp_path / "run" / "ranks").exists()


# ---------------------------------------------------------------- config values

@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("override,key", fast_first([
    ("models.sim_siglip2_like.weight=nan", "models.sim_siglip2_like.weight=nan"),  # refused by the run's checks
    ("eval.bootstrap.draws=abc", "eval.bootstrap.draws='abc'"),  # by Hydra, composing
    ("models.sim_siglip2_like.weight=inf", "models.sim_siglip2_like.weight=inf"),
    ("models.sim_siglip2_like.weight=-1", "models.sim_siglip2_like.weight=-1"),
    ("models.sim_siglip2_like.weight=heavy", "models.sim_siglip2_like.weight='heavy'"),
    ("eval.bootstrap.level=1.5", "eval.bootstrap.level=1.5"),
    ("eval.bootstrap.seed=x", "eval.bootstrap.seed='x'"),
    ("eval.ks=5", "eval.ks=5"),
    ("eval.ks=[1,a]", "eval.ks=[1, 'a']"),
    ("eval.chunk_size=big", "eval.chunk_size='big'"),
    ("eval.lists.depth=1.5", "eval.lists.depth=1.5"),
    ("eval.lists.store=maybe", "eval.lists.store='maybe'"),
    ("eval.save_topk=all", "eval.save_topk='all'"),
    ("fusion.rrf_k=abc", "fusion.rrf_k='abc'"),
    ("fusion.rrf_k=nan", "fusion.params.rrf_k=nan"),  # the old key, read as the new and checked alike
    ("fusion.ddof=true", "fusion.ddof=True"),  # refused by Hydra (the old key's schema type)
    ("fusion.params.ddof=true", "fusion.params.ddof=True"),
    ("fusion.top_k=[5]", "fusion.top_k=[5]"),
    ("dataset.n_images=many", "dataset.n_images='many'"),
    ("dataset.caption_noise=-1", "dataset.caption_noise=-1"),
    ("models.sim_siglip2_like.dim=wide", "models.sim_siglip2_like.dim='wide'"),
    ("embed.batch_size=abc", "embed.batch_size='abc'"),
    ("embed.cache.dtype=int8", "embed.cache.dtype='int8'"),
    ("embed.on_bad_image=ignore", "embed.on_bad_image='ignore'"),
    ("plots=sometimes", "plots='sometimes'"),
    ("logger.mode=cloud", "logger.mode='cloud'"),
    ("logger.init_timeout=0", "logger.init_timeout=0"),
    ("+logger.colour=red", "logger: unknown key(s) colour"),
    ("+eval.bootstrap.reps=5", "eval.bootstrap: unknown key(s) reps"),
], 2, unpack=True))  # a composition each: the fast tier checks the first two (one of each kind); make test all
def test_every_config_value_is_checked_before_any_work(compose_cfg, tmp_path, override, key):
    """A value of the wrong type is refused by Hydra while composing (the schemas in fusebench.config.schema); a value
    out of range, or in a free-form block (models), by the run's own checks. Either way the message names
    the key and what is valid, and nothing is written."""
    (tmp_path / "run").mkdir()
    try:
        cfg = compose_cfg(["dataset.n_images=50", "dataset.n_captions=100", "logger=wandb", override])
    except HydraException as err:
        message = hydra_error_message(err)
        assert f"full_key: {key.split('=')[0]}" in message, message
        assert any(word in message for word in ("could not be converted", "Invalid value", "is not a valid")), message
    else:
        with pytest.raises(FusebenchError) as err:
            run(cfg, str(tmp_path / "run"))
        assert str(err.value).startswith(key) or key in str(err.value)
        assert "valid" in str(err.value)
    assert [p.name for p in (tmp_path / "run").iterdir()] == []  # nothing written, not even a half


@pytest.mark.slow
@pytest.mark.parametrize("override,fragment", [
    ("eval.bootstrap.draws=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
    ("eval.bootstrap.draws=0", "eval.bootstrap.draws=0 is not valid; valid: an integer >= 1"),
    ("eval.ks=5", "eval.ks=5"),
    ("models.sim_dfn5b_like.weight=nan", "models.sim_dfn5b_like.weight=nan"),
    ("eval.nope=1", "Could not override 'eval.nope'"),  # Hydra's own config errors: exit 2, no traceback
    ("fusion=condorcet", "Could not find 'fusion/condorcet'"),
    ("eval.ks=[1", "no viable alternative"),
    ("embed.device=tpu", "embed.device='tpu'"),
    ("+bogus=1", "unknown top-level key(s) bogus"),
])
def test_config_mistakes_through_the_cli(tmp_path, override, fragment):
    result = fusebench(*SMALL, override, "hydra.run.dir=run", cwd=tmp_path)
    user_error(result, fragment)
    if "could not be converted" in fragment:  # OmegaConf's three-line value error comes out as one line
        (line,) = [x for x in result.stderr.splitlines() if "fusebench: error:" in x]
        assert fragment in line and "full_key: eval.bootstrap.draws" in line
    if "Could not find" in fragment:  # one line; the options listed are the group's YAML files: not its schema
        (line,) = [x for x in result.stderr.splitlines() if "fusebench: error:" in x]
        valid = ", ".join(sorted(p.stem for p in (Path(CONFIG_DIR) / "fusion").glob("*.yaml")))
        assert line.endswith(f"valid: {valid}."), line
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_nan_weight_never_reaches_metrics(compose_cfg, tmp_path):
    with pytest.raises(FusebenchError, match="weight=nan is not valid; valid: a finite number >= 0"):
        run(compose_cfg(["dataset.n_images=50", "dataset.n_captions=100", "models.sim_dfn5b_like.weight=nan"]),
            str(tmp_path))
    assert not (tmp_path / "metrics.json").exists()


def test_hydra_sweep_syntax_for_models_is_accepted():
    assert unknown_models(["models=glob(sim_*)"]) == []
    assert unknown_models(["models=choice([sim_siglip2_like],[sim_dfn5b_like,sim_third])"]) == []
    assert unknown_models(["models=choice([sim_siglip2_like],[typo])"]) == ["typo"]
    assert unknown_models(["models=[sim_siglip2_like],[typo2]", "models=sim_third,typo3"]) == ["typo2", "typo3"]
    assert unknown_models(["models=[]", "+models.a.kind=sim", "models=glob(*"]) == []  # Hydra reports bad syntax


@pytest.mark.slow
def test_models_glob_sweep_runs_and_unknown_choice_is_named(tmp_path):
    result = fusebench("-m", *SMALL, "models=glob(sim_*,exclude=sim_third)", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/metrics.json"))]
    assert sorted(n for m in jobs for n in m["retrievers"]) == ["sim_dfn5b_like", "sim_siglip2_like"]  # one each
    result = fusebench("-m", *SMALL, "models=choice([sim_third],[nope])", "hydra.sweep.dir=sweep2", cwd=tmp_path)
    user_error(result, "unknown model(s) nope", "sim_siglip2_like")
    assert not (tmp_path / "sweep2").exists()  # refused before any job ran


# ---------------------------------------------------------------- sweeps, reruns, interrupts, unwritable dirs

@pytest.mark.slow
def test_sweep_exit_code_names_failed_jobs(tmp_path):
    result = fusebench("-m", *SMALL, "fusion.top_k=5,3", "hydra.sweep.dir=all_fail", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "2 job(s) of the sweep failed: 0, 1" in result.stderr
    assert (tmp_path / "all_fail" / "summary.md").is_file()  # the report is still written
    result = fusebench("-m", *SMALL, "fusion.top_k=100,5", "hydra.sweep.dir=some_fail", cwd=tmp_path)
    assert result.returncode == 1 and "1 job(s) of the sweep failed: 1" in result.stderr
    assert (tmp_path / "some_fail" / "0" / "metrics.json").is_file()  # finished work is kept


@pytest.mark.slow
def _interrupted(args: list[str], cwd, ready, settle: float = 0.0, wait: float = 120) -> str:
    """Run fusebench with ``args``, press Ctrl-C once ``ready()`` holds (then ``settle`` seconds more), and
    return its stderr after checking it exited 130 with one message and no traceback."""
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(cwd / "out"), "WANDB_MODE": "disabled"}
    # Ctrl-C's default action in the child even when this test runs in the background (a shell starts
    # background jobs with SIGINT ignored, the child would inherit that, and Python then never raises
    # KeyboardInterrupt)
    proc = subprocess.Popen([FUSEBENCH, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + wait
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(settle)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    return stderr


@pytest.mark.slow
def test_ctrl_c_exits_130_without_traceback_or_outputs(tmp_path):
    _interrupted(["dataset.n_images=20000", "dataset.n_captions=100000", "logger=none", "hydra.run.dir=run"],
                 tmp_path, (tmp_path / "run" / ".hydra" / "config.yaml").exists,
                 settle=2.0)  # inside the run (corpus, embeddings or search)
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert not list((tmp_path / "run").glob(".staging-*"))


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_with_plots_on_the_background_thread(tmp_path):
    """Ctrl-C during a logger=none sweep (each job draws its own plots): exit 130 at once, no traceback, the
    finished jobs kept; no plot is left half-written as a .png."""
    _interrupted(["-m", "fusion=rrf,dbsf,sum,minmax,zscore", "dataset.n_images=2000", "dataset.n_captions=10000",
                  "eval.bootstrap.draws=100", "logger=none", "hydra.sweep.dir=sweep"],
                 tmp_path, (tmp_path / "sweep" / "1" / "metrics.json").exists, wait=240)
    assert (tmp_path / "sweep" / "0" / "metrics.json").is_file()
    for png in (tmp_path / "sweep").glob("*/plots/*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.slow
def test_unwritable_run_dir_fails_before_the_work(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    result = fusebench(*SMALL, f"hydra.run.dir={blocker}/run", cwd=tmp_path)
    user_error(result, str(blocker))


@pytest.mark.slow
def test_write_probe_and_disk_full_are_one_message(compose_cfg, tmp_path, monkeypatch):
    cfg = compose_cfg(["dataset.n_images=50", "dataset.n_captions=100", "logger=none", "plots=false",
                       "eval.lists.store=false"])

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    with monkeypatch.context() as m:
        m.setattr("fusebench.app.rundir.tempfile.mkstemp", refuse)
        with pytest.raises(FusebenchError, match=r"run dir .* cannot be written \(Permission denied\)"):
            run(cfg, str(tmp_path / "ro"))

    calls = []

    def disk_full(*args, **kwargs):
        calls.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("fusebench.report.outputs.np.savez", disk_full)
    with pytest.raises(FusebenchError, match="could not write the outputs .* No space left on device"):
        run(cfg, str(tmp_path / "full"))
    assert calls and sorted(p.name for p in (tmp_path / "full").iterdir()) == []  # nothing half-written


# ---------------------------------------------------------------- files fusebench wrote: cache entries

MATERIAL = {"kind": "image", "model": {"backend": "faults"}, "images": "abc"}


def _rows(rows, calls=None):
    for start in range(0, len(rows), 3):
        part = rows[start:start + 3]
        if calls is not None:
            calls.extend(part.tolist())
        yield np.stack([np.arange(4, dtype=np.float32) + r for r in part]), {"seen": len(part)}


def _partial_entry(tmp_path) -> tuple[EmbeddingCache, Path]:
    """A cache entry killed after its first two chunks (rows 0-7 of 10)."""
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)

    def dies(rows):
        for i, item in enumerate(_rows(rows)):
            if i == 3:
                raise KeyboardInterrupt
            yield item

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute(MATERIAL, 10, dies)
    folder = next(p for p in tmp_path.glob("??/*") if p.is_dir())
    return cache, folder


@pytest.mark.parametrize("damage", [lambda p: truncate(p, 0.6), lambda p: flip(p, offset=200),  # in the rows
                                    lambda p: p.write_text('{"not": "an npz"}'),
                                    lambda p: p.write_bytes(b"")], ids=["truncated", "flipped", "wrong_type", "empty"])
def test_damaged_cache_chunk_is_removed_and_recomputed(tmp_path, caplog, damage):
    cache, folder = _partial_entry(tmp_path)
    assert (folder / "chunk-000000.npz").is_file()
    damage(folder / "chunk-000000.npz")
    calls = []
    with caplog.at_level("WARNING"):
        result = cache.get_or_compute(MATERIAL, 10, lambda r: _rows(r, calls))
    assert "chunk-000000.npz is unreadable" in caplog.text
    assert calls[:4] == [0, 1, 2, 3]  # the bad chunk was recomputed ...
    assert np.array_equal(result.embeddings[:, 0], np.arange(10))  # ... and the entry is right
    assert cache.get_or_compute(MATERIAL, 10, lambda r: _rows(r)).hit


@pytest.mark.parametrize("meta", ["[1, 2, 3]", '"text"', "{cut", "\xff"])
def test_cache_entry_meta_not_an_object_heals_and_lists(tmp_path, caplog, capsys, meta):
    cache = EmbeddingCache(tmp_path, dtype="fp32", chunk_rows=4)
    first = cache.get_or_compute(MATERIAL, 10, _rows)
    (cache.entry_dir(first.key) / "meta.json").write_text(meta, encoding="latin-1")
    assert cache_main(["--dir", str(tmp_path), "list"]) == 0
    assert "partial" in capsys.readouterr().out  # listed, not a crash
    with caplog.at_level("WARNING"):
        again = cache.get_or_compute(MATERIAL, 10, _rows)
    assert not again.hit and "is corrupt" in caplog.text and np.array_equal(again.embeddings, first.embeddings)
    (cache.entry_dir(first.key) / "meta.json").write_text(meta, encoding="latin-1")
    assert cache_main(["list", "--dir", str(tmp_path)]) == 0  # the form the help shows
    assert cache_main(["remove", first.key[:8], "--dir", str(tmp_path)]) == 0
    assert not cache.entry_dir(first.key).exists()


# ---------------------------------------------------------------- files fusebench wrote: run outputs and reports

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    result = fusebench("-m", *SMALL, "fusion=rrf,dbsf", "hydra.sweep.dir=sweep", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "sweep"


def _damaged_copy(two_runs, tmp_path, relative: str, damage) -> Path:
    folder = tmp_path / "sweep"
    shutil.copytree(two_runs, folder)
    for name in ("summary.md", "summary.csv", "gains.csv", "cost.csv"):
        (folder / name).unlink(missing_ok=True)
    damage(folder / "1" / relative)
    return folder


RUN_FILE_DAMAGE = [
    ("metrics.json", lambda p: truncate(p, 0.5), "metrics.json is damaged"),
    ("metrics.json", lambda p: flip(p, 0.5), "metrics.json is damaged"),
    ("metrics.json", lambda p: p.write_text("[]"), "not an object"),
    ("metrics.json", lambda p: p.write_text('{"dataset": {}}'), "'dataset' lacks"),
    ("ranks/fused.t2i.npy", lambda p: truncate(p, 0.5), "ranks/fused.t2i.npy"),
    ("ranks/fused.t2i.npy", lambda p: flip(p, 0.9), "ranks/fused.t2i.npy does not match the checksum"),
    ("ranks/fused.t2i.npy", lambda p: p.write_text("garbage"), "ranks/fused.t2i.npy"),
    ("ranks/queries.npz", lambda p: flip(p, 0.5), "ranks/queries.npz"),
    ("topk/fused.t2i.npz", lambda p: p.unlink(), "topk/fused.t2i.npz is missing"),
]


@pytest.mark.slow
@pytest.mark.parametrize("relative,damage,reason", RUN_FILE_DAMAGE,
                         ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(RUN_FILE_DAMAGE)])
def test_report_lists_a_damaged_run_and_reports_the_others(two_runs, tmp_path, capsys, relative, damage, reason):
    """Listed as damaged, as docs/guarantees.md says, never as failed (issue 39, item 8): its job finished."""
    folder = _damaged_copy(two_runs, tmp_path, relative, damage)
    scan = scan_runs(folder)
    assert [r.path.name for r in scan.runs] == ["0"] and reason in scan.failed["1"] and scan.damaged == ["1"]
    assert report_main([str(folder), "--draws", "50"]) == 0
    summary = (folder / "summary.md").read_text()
    assert summary.splitlines()[2] == "1 finished runs, 1 damaged: 1."
    assert any(line.startswith("- 1: ") and reason in line for line in summary.splitlines())
    assert "Traceback" not in capsys.readouterr().err


def test_report_on_a_folder_of_garbage(tmp_path, capsys):
    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    (tmp_path / "run" / ".hydra" / "config.yaml").write_text("a: 1\n")
    (tmp_path / "run" / "metrics.json").write_bytes(os.urandom(300))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.json").write_text('"just a string"')
    assert report_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no finished runs" in err and "metrics.json is damaged" in err and "not an object" in err
    assert "Traceback" not in err


def test_table_headers_stay_apart_for_large_k():
    record = RunRecord.from_json({
        "eval": {"ks": [1, 5, 10000]}, "dataset": {"name": "d", "n_images": 1, "n_captions": 1}, "comparisons": [],
        "retrievers": {"m": {**{d: {"R@1": 50.0, "R@5": 60.0, "R@10000": 100.0} for d in ("t2i", "i2t", "mean")},
                             "spec": {"kind": "sim"}}}})
    header = format_table(record).splitlines()[1]
    assert "R@5 " in header and " t2i R@10000" in header and " i2t R@10000" in header
    row = format_table(record).splitlines()[3]
    assert len(row) == len(header)


# ---------------------------------------------------------------- W&B online without a network

@pytest.mark.slow
def test_wandb_online_without_network_fails_fast_and_logs_offline(tmp_path):
    env = {"WANDB_MODE": "", "WANDB_API_KEY": "0" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9",
           "WANDB_DIR": str(tmp_path)}
    started = time.monotonic()
    result = fusebench(*SMALL[:3], "logger=wandb", "logger.mode=online", "logger.init_timeout=3", "plots=false",
                       "hydra.run.dir=run", cwd=tmp_path, env=env, timeout=200)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert took < 80, took  # W&B alone would wait 90 s
    assert "could not start online" in result.stdout + result.stderr  # Hydra logs to the console
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert (tmp_path / "run" / "metrics.json").is_file()
