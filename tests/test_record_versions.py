"""Every record version fusebench wrote reads as today's, through one function (``record_versions.migrate``).

The fixtures were written by fusebench itself, from this repository's history, with one small job
(``dataset.n_images=300 dataset.n_captions=1500 eval.bootstrap.draws=200 logger=none plots=false``):
``metrics_v1.json`` by the commit before the typed record (94d5282^, with ``fusion.method=rrf
eval.bootstrap.level=0.9``), ``metrics_v2_first.json`` by the first version-2 writer (94d5282),
``metrics_v2_last.json`` by the last one (the commit before version 3), ``metrics_v3.json`` by version 3 and
``metrics_v4.json`` by version 4 (issue 40, item 3), the last three from the same job. ``metrics_v2_tuned.json``
is a tuned job's record from 6528179.
"""

import json
import shutil
from pathlib import Path

import pytest

from fusebench.app import rundir
from fusebench.evaluation.record import RECORD_VERSION, RecordError, RecordVersionError, RunRecord, migrate
from fusebench.evaluation.record_versions import LATER_EVAL, LATER_FUSION
from fusebench.fusion.config import FusionConfig, flat_settings, moved_keys

FIXTURES = Path(__file__).parent / "fixtures"
TIMES = ("seconds", "search_seconds", "query_ms")  # what two runs of one job never share


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"metrics_{name}.json").read_text())


def without_times(data: dict) -> dict:
    data = json.loads(json.dumps(data))
    for key in TIMES:
        data["run"].pop(key, None)
    data["run"]["lists"] = {m: {k: v for k, v in entry.items() if k not in ("seconds", "hit")}
                            for m, entry in data["run"]["lists"].items()}
    return data


def test_the_last_version_2_record_migrates_to_what_version_3_writes_for_the_same_job():
    old, new = fixture("v2_last"), fixture("v3")
    assert old["version"] == 2 and new["version"] == 3
    assert "ties" not in old["fusion"] and "search_precision" not in old["eval"]  # left out at their defaults
    assert without_times(migrate(old)) == without_times(migrate(new))
    assert without_times(RunRecord.from_json(old).to_json()) == without_times(migrate(new))


def test_the_version_3_record_migrates_to_what_version_4_writes_for_the_same_job():
    """Version 4 (issue 40, item 3): a method's own settings in its params; dbsf's ddof there, rrf_k and
    rrf_weighting (which dbsf never read) dropped."""
    old, new = fixture("v3"), fixture("v4")
    assert old["version"] == 3 and new["version"] == RECORD_VERSION == 4
    assert old["fusion"]["ddof"] == 0 and old["fusion"]["params"] == {}
    assert new["fusion"]["params"] == {"ddof": 0} and not {"rrf_k", "ddof", "rrf_weighting"} & set(new["fusion"])
    assert without_stores(migrate(old)) == without_stores(new)
    assert without_stores(RunRecord.from_json(old).to_json()) == without_stores(new)


def without_stores(data: dict) -> dict:
    """``without_times``, less what the commits between the version 3 fixture's writer and the version 4 one changed
    beside the record (the list store's keys, the topk .npz files' bytes; every rank file and number the same)."""
    data = without_times(data)
    data["files"] = {k: v for k, v in data["files"].items() if not k.startswith("topk/")}
    for entry in data["run"]["lists"].values():
        entry.pop("key", None)
    return data


@pytest.mark.parametrize("method,params", [("rrf", {"rrf_k": 5.0, "rrf_weighting": "rank"}), ("zscore", {"ddof": 1}),
                                           ("dbsf", {"ddof": 1}), ("isr", {}), ("none", {})])
def test_version_3_flat_settings_become_the_params_of_the_method_that_read_them(method, params):
    flat = {"rrf_k": 5.0, "ddof": 1, "rrf_weighting": "rank"}
    data = fixture("v3")
    for block in [data["fusion"]] + [r["spec"] for r in data["retrievers"].values() if r["spec"]["kind"] == "fusion"]:
        block.update(method=method, **flat)
    current = migrate(data)
    for block in [current["fusion"]] + [r["spec"] for r in current["retrievers"].values()
                                        if r["spec"]["kind"] == "fusion"]:
        assert block["params"] == params and not set(flat) & set(block)


@pytest.mark.parametrize("name", ["v1", "v2_first", "v2_last", "v2_tuned", "v3", "v4"])
def test_each_version_reads_as_the_current_form_and_round_trips(name):
    data = fixture(name)
    before = json.dumps(data)
    current = migrate(data)
    assert json.dumps(data) == before  # the caller's dict is left as it was
    assert current["version"] == RECORD_VERSION and migrate(current) == current  # today's form is a fixed point
    for block in [current["fusion"]] + [r["spec"] for r in current["retrievers"].values()
                                        if r["spec"]["kind"] == "fusion"]:
        assert set(FusionConfig.__dataclass_fields__) - set(moved_keys()) <= set(block)  # every setting, none by default
        assert not set(moved_keys()) & set(block)  # a method's own settings: in its params
        assert block["method"] != "rrf" or isinstance(block["params"]["rrf_k"], float)
    assert set(LATER_EVAL) <= set(current["eval"])
    record = RunRecord.from_json(data)
    written = record.to_json()
    assert written == current  # what it reads is what today's writer writes for it, key for key
    assert list(written) == list(current)
    assert RunRecord.from_json(written) == record


def test_a_version_1_record_keeps_what_it_ran_with():
    data = fixture("v1")
    assert "version" not in data and data["fusion"]["rrf_k"] == 60 and data["eval"]["level"] == 0.9
    record = RunRecord.from_json(data)
    assert record.fusion.method == "rrf" and record.fusion.params["rrf_k"] == 60.0 and record.fusion.ties == "first"
    assert record.level == 0.9 and all(c.level == 0.9 and c.draws == 200 for c in record.comparisons)
    assert record.files == data["files"] and record.version == RECORD_VERSION
    oldest = json.loads(json.dumps(data))  # the first writers: no files, comparisons without level and draws
    del oldest["files"]
    for comparison in oldest["comparisons"]:
        del comparison["level"], comparison["draws"]
    first = RunRecord.from_json(oldest)
    assert first.files == {} and first.comparisons == record.comparisons  # their level and draws: the eval block's


def test_the_fill_values_are_what_ran_before_each_setting_existed():
    """Frozen in the table, not read from today's defaults; today's defaults still agree (a changed default
    must not change what an old record means, so this fails to make someone look)."""
    defaults = flat_settings(FusionConfig())  # rrf_weighting: rrf's default (params: the methods' other settings)
    assert {k: defaults[k] for k in LATER_FUSION} == LATER_FUSION
    from fusebench.config.schema import EvalConfig

    settings = EvalConfig()
    assert settings.item_chunk_size == LATER_EVAL["item_chunk_size"] and settings.positives == []
    assert settings.search_precision == LATER_EVAL["search_precision"]
    assert vars(settings.lists) == LATER_EVAL["lists"]


@pytest.mark.parametrize("version", [RECORD_VERSION + 1, 99, 0, "3", 2.0, True, None])
def test_a_version_this_fusebench_does_not_read_is_refused(version):
    data = {**fixture("v3"), "version": version}
    with pytest.raises(RecordVersionError, match=f"record version {version!r}; this fusebench reads record "
                                                 f"versions 1 to {RECORD_VERSION} \\(upgrade fusebench"):
        RunRecord.from_json(data)


def test_a_damaged_record_is_still_named_by_the_typed_readers():
    with pytest.raises(RecordError, match="not an object"):
        migrate([1])
    with pytest.raises(RecordError, match="metrics.json lacks 'retrievers'"):
        RunRecord.from_json({"version": 2, "dataset": {"name": "d", "n_images": 1, "n_captions": 1}})
    with pytest.raises(RecordError, match="the fusion settings cannot be read"):
        RunRecord.from_json({**fixture("v2_last"), "fusion": {"method": "nosuch"}})
    with pytest.raises(RecordError, match="a comparison lacks level"):  # every version 2 comparison holds it
        data = fixture("v2_last")
        del data["comparisons"][0]["level"]
        RunRecord.from_json(data)


def _newer_run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(json.dumps({**fixture("v3"), "version": RECORD_VERSION + 1}, indent=2))
    return run_dir


def test_a_rerun_into_a_dir_a_newer_fusebench_wrote_is_refused_naming_the_file(tmp_path):
    run_dir = _newer_run_dir(tmp_path)
    with pytest.raises(rundir.RecordTooNew, match=f"{run_dir / 'metrics.json'}: metrics.json is record version "
                                                  f"{RECORD_VERSION + 1}; this fusebench reads record versions"):
        rundir.check_outputs(run_dir)
    rundir.keep_earlier_config(run_dir)  # nothing kept, nothing raised: check_outputs refuses it


def test_fusebench_report_refuses_a_newer_record_in_one_line(tmp_path, capsys):
    from fusebench.report.cli import main

    run_dir = _newer_run_dir(tmp_path)
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(run_dir / "metrics.json") in err
    assert f"reads record versions 1 to {RECORD_VERSION}" in err and "upgrade fusebench" in err


def as_written_by(version: int, data: dict) -> dict:
    """A record of today's as an older fusebench wrote that job's (the fixtures show these are the only
    differences): versions 1-3 wrote rrf_k, ddof and rrf_weighting as flat fusion keys, each one (version 4 holds a
    method's own in params); version 2 left ties, params and search_precision out at their defaults; version 1
    wrote no version and rrf_k as the YAML gave it."""
    old = json.loads(json.dumps(data))
    for block in [old["fusion"]] + [r["spec"] for r in old["retrievers"].values() if r["spec"]["kind"] == "fusion"]:
        flat = {"rrf_k": 60.0, "ddof": 0, "rrf_weighting": "multiply"}  # versions 1-3: flat, every one written
        flat.update({k: block["params"].pop(k) for k in flat if k in block["params"]})
        block.update(flat)
        if version == 3:
            continue
        for key in ("ties", "params"):
            if block[key] == LATER_FUSION[key]:
                del block[key]
        if version == 1:
            block["rrf_k"] = int(block["rrf_k"])
    if version < 3:
        del old["eval"]["search_precision"]
    old["version"] = version
    if version == 1:
        del old["version"]
    return old


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_sweep_mixing_old_and_new_job_dirs_reports_each_retriever_once(compose_cfg, tmp_path, version):
    from fusebench.app import pipeline
    from fusebench.report.sweep import build_report

    small = ["dataset.n_images=100", "dataset.n_captions=400", "eval.bootstrap.draws=100", "logger=none",
             "plots=false", "eval.ks=[1,5]", "fusion=rrf", f"embed.cache.dir={tmp_path / 'cache'}"]
    pipeline.run(compose_cfg(small), str(tmp_path / "new" / "0"))
    shutil.copytree(tmp_path / "new" / "0", tmp_path / "mixed" / "0")
    shutil.copytree(tmp_path / "new" / "0", tmp_path / "mixed" / "1")
    path = tmp_path / "mixed" / "0" / "metrics.json"
    path.write_text(json.dumps(as_written_by(version, json.loads(path.read_text())), indent=2) + "\n")
    assert RunRecord.from_json(json.loads(path.read_text())) == RunRecord.from_json(
        json.loads((tmp_path / "mixed" / "1" / "metrics.json").read_text()))
    mixed, new = build_report(tmp_path / "mixed", draws=100), build_report(tmp_path / "new", draws=100)
    assert not mixed.failed and len(mixed.runs) == 2
    assert len(mixed.article) == 3 and mixed.article == new.article  # one row per retriever, the same labels
    assert mixed.gains == new.gains  # the fusion against its best single model once, not twice
