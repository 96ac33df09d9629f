"""The Python API: ``fusebench.evaluate`` over arrays equals the ``fusebench`` command over the same rows written
as the README's "embeddings you already have" files (every rank and every metric), ``fusebench.run`` equals the
command on the same overrides, and every bad argument is one FusebenchError naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.tiers import fast_first

import fusebench
from fusebench import DIRECTIONS, FusebenchError

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
SETTINGS = ["fusion.top_k=40", "eval.bootstrap.draws=300", "eval.bootstrap.seed=3", "eval.ks=[1,5,10]"]


def _models(seed: int = 0, n: int = 60, per: int = 3, d: int = 12):
    rng = np.random.default_rng(seed)
    caption_image = np.repeat(np.arange(n), per)
    latent = rng.standard_normal((n, d))
    models = {name: (latent + noise * rng.standard_normal((n, d)),
                     (latent[caption_image] + 1.0 * rng.standard_normal((n * per, d))).astype(np.float32))
              for name, noise in (("a", 0.3), ("b", 0.5))}
    return models, caption_image


def _write_inputs(folder: Path, models, caption_image) -> list[str]:
    """The README's files for the same rows: a manifest and two .npy per model; the command's overrides."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "m.jsonl").open("w") as fh:
        for i in range(int(caption_image.max()) + 1):
            fh.write(json.dumps({"image_id": str(i), "captions": [f"c{q}" for q in np.flatnonzero(caption_image == i)]})
                     + "\n")
    overrides = ["dataset=manifest", f"dataset.manifest={folder / 'm.jsonl'}", "models=[]"]
    for name, (image, text) in models.items():
        np.save(folder / f"{name}_img.npy", image)
        np.save(folder / f"{name}_txt.npy", text)
        overrides += [f"+models.{name}.kind=vectors", f"+models.{name}.image_embeddings={folder / f'{name}_img.npy'}",
                      f"+models.{name}.text_embeddings={folder / f'{name}_txt.npy'}"]
    return overrides


def _cli(out: Path, overrides: list[str]) -> dict:
    done = subprocess.run([FUSEBENCH, *overrides, "logger=none", "plots=false", f"hydra.run.dir={out}"],
                          capture_output=True, text=True, timeout=300, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "metrics.json").read_text())


def _measured(record_json: dict) -> dict:
    """What a run measured, less what names its inputs (specs, corpus name and digest) and its timings."""
    return {"retrievers": {n: {d: r[d] for d in (*DIRECTIONS, "mean")} for n, r in record_json["retrievers"].items()},
            "comparisons": record_json["comparisons"], "oracle": record_json["oracle"],
            "fusion": record_json["fusion"], "eval": record_json["eval"]}


def _same_ranks(result, out: Path) -> None:
    for name, by_direction in result.ranks.items():
        for direction, ranks in by_direction.items():
            np.testing.assert_array_equal(ranks, np.load(out / "ranks" / f"{name}.{direction}.npy"))


@pytest.mark.slow
@pytest.mark.parametrize("fusion,extra", [("dbsf", []), ("rrf", ["fusion.rrf_k=20"])])
def test_evaluate_equals_the_command_on_the_same_rows(tmp_path, fusion, extra):
    models, caption_image = _models()
    overrides = [*SETTINGS, *extra]
    result = fusebench.evaluate(models, caption_image, fusion=fusion, overrides=overrides, weights={"b": 0.5})
    cli = _cli(tmp_path / "cli", [*_write_inputs(tmp_path / "in", models, caption_image), f"fusion={fusion}",
                                  *overrides, "+models.b.weight=0.5", "eval.lists.store=false"])  # evaluate's default
    assert _measured(result.record.to_json()) == _measured(cli)
    _same_ranks(result, tmp_path / "cli")
    assert result.out_dir is None and set(result.ranks) == {"a", "b", "fused"}
    assert result.record.retrievers["b"].spec.weight == 0.5
    frame = result.recall()
    row = frame[(frame.retriever == "fused") & (frame.direction == "t2i") & (frame.k == 1)]
    assert float(row.recall.iloc[0]) == result.record.retrievers["fused"].recall("t2i", 1)
    assert len(result.comparisons()) == len(result.record.comparisons)


@pytest.mark.slow
def test_run_equals_the_command_and_writes_where_asked(tmp_path):
    overrides = ["dataset=sim", "dataset.n_images=150", "dataset.n_captions=450", "fusion=rrf", *SETTINGS]
    result = fusebench.run(overrides, out_dir=tmp_path / "api")
    cli = _cli(tmp_path / "cli", overrides)
    assert _measured(result.record.to_json()) == _measured(cli)
    _same_ranks(result, tmp_path / "cli")
    assert result.out_dir == tmp_path / "api" and (tmp_path / "api" / "metrics.json").is_file()
    _same_ranks(result, tmp_path / "api")
    again = fusebench.run(overrides, out_dir=tmp_path / "api")  # a rerun into its own dir is allowed
    assert _measured(again.record.to_json()) == _measured(result.record.to_json())


@pytest.mark.slow  # whole jobs through the API
def test_evaluate_writes_nothing_without_out_dir_or_cache_dir(tmp_path, monkeypatch):
    """No out_dir and no cache_dir: no file anywhere (the cwd, the home folder and its caches, the temporary folder;
    numba's kernel cache aside), where the API once wrote a temporary run dir and a list store under the cwd."""
    import tempfile

    home, scratch, cwd = tmp_path / "home", tmp_path / "tmp", tmp_path / "cwd"
    for folder in (home, scratch, cwd):
        folder.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.chdir(cwd)
    models, caption_image = _models(n=20)
    before = sorted(tmp_path.rglob("*"))
    result = fusebench.evaluate(models, caption_image, draws=50)
    assert sorted(p for p in tmp_path.rglob("*") if "numba" not in str(p)) == before
    assert set(result.ranks) == {"a", "b", "fused"} and result.out_dir is None
    assert all(not r.get("stored") for r in result.record.run.lists.values())
    # a cache_dir keeps each model's lists there, found by the next call on the same rows
    again = [fusebench.evaluate(models, caption_image, draws=50, cache_dir=tmp_path / "lists") for _ in range(2)]
    assert [again[1].record.run.lists[m]["hit"] for m in ("a", "b")] == [True, True]
    assert (tmp_path / "lists").is_dir() and not list(cwd.iterdir())
    for name in result.ranks:
        for d in DIRECTIONS:
            np.testing.assert_array_equal(again[1].ranks[name][d], result.ranks[name][d])


@pytest.mark.slow  # two evaluate jobs
def test_keyword_settings_equal_the_override_strings(tmp_path):
    models, caption_image = _models(n=30)
    keywords = fusebench.evaluate(models, caption_image, fusion="rrf", top_k=40, ks=(1, 5), draws=np.int64(300),
                                  eval__bootstrap__seed=3, fusion__params__rrf_k=20.0)
    strings = fusebench.evaluate(models, caption_image, fusion="rrf", overrides=[
        "fusion.top_k=40", "eval.ks=[1,5]", "eval.bootstrap.draws=300", "eval.bootstrap.seed=3", "fusion.params.rrf_k=20"])
    assert _measured(keywords.record.to_json()) == _measured(strings.record.to_json())
    assert keywords.record.eval.bootstrap.draws == 300 and keywords.record.fusion.top_k == 40


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_evaluate_refuses_a_users_file_in_out_dir(tmp_path, monkeypatch):
    models, caption_image = _models(n=20)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "ranks").write_text("a user's file")
    with pytest.raises(FusebenchError, match="ranks"):
        fusebench.evaluate(models, caption_image, out_dir=tmp_path / "mine", overrides=["eval.bootstrap.draws=50"])
    assert (tmp_path / "mine" / "ranks").read_text() == "a user's file"


def _bad_cases():
    models, ci = _models(n=10)
    a_img, a_txt = models["a"]
    return [
        ({}, ci, {}, "models must be a non-empty mapping"),
        ({"a": a_img}, ci, {}, "models['a'] must be (image rows, text rows)"),
        ({"a": {"image": a_img}}, ci, {}, "models['a'] must hold 'image' and 'text'"),
        ({"a": (a_img[0], a_txt)}, ci, {}, "models['a'] image rows must be a 2-D real array"),
        ({"a": (a_img, a_txt.astype(str))}, ci, {}, "models['a'] text rows must be a 2-D real array"),
        ({"a": (a_img, a_txt), "b": (a_img[:5], a_txt)}, ci, {}, "different numbers of rows"),
        (models, ci.astype(float), {}, "caption_image must be a non-empty 1-D integer array"),
        (models, np.where(ci == 3, 10, ci), {}, "is not an image index; valid: 0..9"),
        (models, ci, {"weights": {"c": 1.0}}, "weights names ['c']"),
        (models, ci, {"fusion": "nosuch"}, "fusion=nosuch is not an option of fusion; valid: borda, dbsf, "),
        (models, ci, {"overrides": ["eval.bootstrap.draws=-1"]}, "eval.bootstrap.draws"),
        (models, ci, {"overrides": ["gallery=sim", "gallery.size=10"]}, "takes the whole gallery in its arrays"),
        (models, ci, {"image_ids": ["x"] * 10}, "image_ids holds duplicate ids"),
        (models, ci, {"image_ids": ["x"]}, "image_ids holds 1 ids for 10 images"),
        (models, ci, {"out_dir": " "}, "out_dir=' ' is empty"),
        (models, ci, {"name": ""}, "name='' must be a non-empty string"),
        (models, ci, {"topk": 5}, "fusebench.evaluate(topk=...) is not a setting; valid: a config group"),
        (models, ci, {"seed": 5}, "fusebench.evaluate(seed=...) names several settings"),
        (models, ci, {"top_k": "many"}, "fusion.top_k"),
        (models, ci, {"cache_dir": 5}, "cache_dir must be a folder"),
        ({"a": (a_img, a_txt[:-1])}, ci, {}, "text"),  # one caption short: the rows' own check names it
        ({"a": (np.zeros_like(a_img), a_txt)}, ci, {}, "a"),  # all-zero rows: refused by the vectors checks
        # a wrong type is one error naming the argument, and so is a setting the run never reads (issue 39, items 6, 8)
        (models, ci, {"overrides": "fusion.top_k=50"}, "overrides='fusion.top_k=50' is one string; overrides takes a "
                                                        "list of override strings, e.g. overrides=['fusion.top_k=50']"),
        (models, ci, {"overrides": ["hydra.run.dir=x"]}, "'hydra.run.dir=x' sets Hydra's own hydra.run.dir, which the "
                                                         "Python API never reads"),
        (models, ci, {"overrides": ["hydra.run.dir=x"]}, "use out_dir=..."),
        (models, ci, {"overrides": ["+hydra.job.chdir=true"]}, "sets Hydra's own hydra.job.chdir"),
        (models, ci, {"overrides": ["hydra/launcher=basic"]}, "sets Hydra's own hydra/launcher"),
        (models, ci, {"overrides": [5]}, "overrides must be a list of override strings"),
        (models, ci, {"overrides": {"fusion.top_k": 5}}, "overrides must be a list of override strings"),
        (models, ci, {"weights": [0.5, 1.0]}, "weights must be a mapping: model name -> weight"),
        (models, ci, {"fusion": None}, "fusion=None must be a conf/fusion option's name"),
        (models, ci, {"out_dir": 5}, "out_dir must be a folder (a str or a Path)"),
        (models, ci, {"image_ids": 5}, "image_ids must be a list of 10 ids"),
        (models, ci, {"caption_ids": "abc"}, "caption_ids must be a list of 30 ids"),
        (models, ci, {"caption_ids": ["x"] * 30}, "caption_ids must hold integers"),
        (models, ci, {"fusion": "none", "weights": {"a": 0.5}}, "models.a.weight=0.5 is never read: no fusion runs"),
        (models, ci, {"fusion": "none", "overrides": ["fusion.fuse_on=document"]},
         "fusion.fuse_on='document' is never read with fusion.method=none"),
        (models, ci, {"fusion": "milvus_weighted", "overrides": ["fusion.rrf_k=5"]},
         "fusion.params.rrf_k=5.0 is never read with fusion.method=sum (with fusion.preset=milvus_weighted, fusion.method=sum"),
    ]


@pytest.mark.parametrize("index", fast_first(range(len(_bad_cases())), 3))  # a refused job each
def test_bad_arguments_are_one_error_naming_them(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    models, caption_image, keywords, fragment = _bad_cases()[index]
    with pytest.raises(FusebenchError) as err:
        fusebench.evaluate(models, caption_image, **{"overrides": ["eval.bootstrap.draws=50"], **keywords})
    assert fragment in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.slow  # two evaluate jobs
def test_numpy_scalar_weights_are_the_numbers_they_hold(tmp_path, monkeypatch):
    """weights={"b": np.float32(0.5)} (a weight from a NumPy grid) ended in omegaconf's UnsupportedValueType from
    deep inside: it runs as 0.5, ranks and record those of the float; a NumPy bool is refused as a bool is."""
    monkeypatch.chdir(tmp_path)
    models, caption_image = _models(n=20)
    overrides = ["eval.bootstrap.draws=50", f"embed.cache.dir={tmp_path / 'cache'}"]
    plain = fusebench.evaluate(models, caption_image, weights={"b": 0.5}, overrides=overrides)
    numpy = fusebench.evaluate(models, caption_image, weights={"b": np.float32(0.5), "a": np.int64(1)},
                               overrides=overrides)
    assert numpy.record.retrievers["b"].spec.to_json()["weight"] == 0.5
    np.testing.assert_array_equal(numpy.ranks["fused"]["t2i"], plain.ranks["fused"]["t2i"])
    with pytest.raises(FusebenchError, match="models.a.weight=True is not valid"):
        fusebench.evaluate(models, caption_image, weights={"a": np.bool_(True)}, overrides=overrides)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_run_takes_a_list_of_overrides_and_no_hydra_key(tmp_path, monkeypatch):
    """fusebench.run("a=b") split the string into characters; hydra.run.dir=... was ignored silently (issue 39,
    item 8): each refused before any work, saying what to use."""
    monkeypatch.chdir(tmp_path)
    for overrides, fragment in (("fusion=rrf", "overrides='fusion=rrf' is one string"),
                                (["hydra.run.dir=R"], "use out_dir=..."),
                                (["hydra.sweep.dir=S"], "one call per job, each with its out_dir=..."),
                                (["fusion=rrf", None], "None (NoneType) is not a string")):
        with pytest.raises(FusebenchError) as err:
            fusebench.run(overrides)
        assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(FusebenchError, match="out_dir must be a folder"):
        fusebench.run(["fusion=rrf"], out_dir=3)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_api_is_imported_on_first_use():
    done = subprocess.run([sys.executable, "-c", "import sys, fusebench; assert 'fusebench.app.api' not in "
                           "sys.modules and 'torch' not in sys.modules; fusebench.evaluate; "
                           "assert 'fusebench.app.api' in sys.modules"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        fusebench.nosuch  # noqa: B018


@pytest.mark.parametrize(("named", "overrides", "fragment"), [
    ([("fusion.top_k", 10)], ["fusion.top_k=20"], "fusion.top_k is given twice"),
    ([("eval.bootstrap.draws", 50)], ["++eval.bootstrap.draws=60"], "eval.bootstrap.draws is given twice"),
    ([("dataset", "sim")], [], "dataset is never read"),
    ([], ["dataset.n_images=5"], "dataset.n_images is never read"),
])
def test_a_setting_given_twice_or_a_dataset_setting_is_refused(named, overrides, fragment):
    """evaluate's keyword and override for one key, or a dataset setting it would ignore, are one error each."""
    from fusebench import FusebenchError
    from fusebench.app.api import check_given_once

    with pytest.raises(FusebenchError, match=fragment):
        check_given_once(named, overrides)
    check_given_once([("fusion.top_k", 10)], ["eval.bootstrap.draws=60"])  # two settings, each once: read
