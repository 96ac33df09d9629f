"""The typed run record: what metrics.json serialises, read back by every consumer."""

import json
from pathlib import Path

import pytest

from fusebench.evaluation.record import RECORD_VERSION, RecordError, RunRecord, migrate
from fusebench.fusion.config import FusionConfig, moved_keys


def _record_json(**changes) -> dict:
    data = {
        "version": RECORD_VERSION,
        "dataset": {"name": "d", "n_images": 10, "n_captions": 20},
        "retrievers": {
            "a": {"t2i": {"R@1": 40.0, "R@5": 70.0, "median_rank": 2.0, "n_queries": 20},
                  "i2t": {"R@1": 60.0, "R@5": 80.0, "median_rank": 1.0, "n_queries": 10},
                  "mean": {"R@1": 50.0, "R@5": 75.0}, "spec": {"kind": "sim", "dim": 8}},
            "fused_x": {"t2i": {"R@1": 45.0, "R@5": 70.0, "median_rank": 2.0, "n_queries": 20},  # a model, by its spec
                        "i2t": {"R@1": 50.0, "R@5": 90.0, "median_rank": 1.0, "n_queries": 10},
                        "mean": {"R@1": 47.5, "R@5": 80.0}, "spec": {"kind": "vectors", "dim": 8}},
            "fused": {"t2i": {"R@1": 50.0, "R@5": 75.0, "median_rank": 1.0, "n_queries": 20},
                      "i2t": {"R@1": 60.0, "R@5": 90.0, "median_rank": 1.0, "n_queries": 10},
                      "mean": {"R@1": 55.0, "R@5": 82.5}, "spec": {"kind": "fusion", "members": ["a", "fused_x"]}},
        },
        "comparisons": [{"baseline": "a", "candidate": "fused", "direction": "t2i", "k": 1, "gain": 10.0, "ci_low": 1.0,
                         "ci_high": 19.0, "wins": 3, "losses": 1, "cluster_ci_low": 0.5, "cluster_ci_high": 19.5,
                         "p_value": 0.625, "baseline_recall": 40.0, "candidate_recall": 50.0, "n_queries": 20,
                         "level": 0.9, "draws": 100}],
        "oracle": None, "fusion": {"method": "dbsf"}, "eval": {"ks": [1, 5], "level": 0.9}, "run": {"seconds": 1.0},
        "files": {"ranks/a.t2i.npy": "0" * 64},
    }
    data.update(changes)
    return data


FIXTURE = Path(__file__).parent / "fixtures" / "metrics_v2_tuned.json"  # written by fusebench before the typed record


def test_a_file_written_before_the_typed_record_reads_and_writes_back_as_todays_form():
    """Every sub-record (dataset, eval, run, fusion, tune, each retriever's spec) serialises as metrics.json held it:
    the same keys, values and order, at today's record version, with the settings it lacked filled in
    (record_versions.migrate); without its version and files (record version 1) it still reads."""
    text = FIXTURE.read_text()
    record = RunRecord.from_json(json.loads(text))
    written, held = record.to_json(), json.loads(text)
    assert written == migrate(held)
    assert written["version"] == RECORD_VERSION == 4 and held["version"] == 2
    assert list(written) == list(held) and list(written["eval"]) == [*held["eval"], "search_precision"]
    assert list(written["fusion"]) == [k for k in FusionConfig.__dataclass_fields__ if k not in moved_keys()]  # in order
    for key in set(held) - {"version", "fusion", "eval", "retrievers"}:
        assert written[key] == held[key], key
    assert {n: {k: v for k, v in r.items() if k != "spec"} for n, r in written["retrievers"].items()} \
        == {n: {k: v for k, v in r.items() if k != "spec"} for n, r in held["retrievers"].items()}
    assert record.version == RECORD_VERSION and record.dataset.simulated and record.dataset.n_images == 4000
    assert record.eval.bootstrap.draws == 2000 and record.eval.lists.depth == 100 and record.fusion.method == "dbsf"
    assert record.tune.chosen.weights == {"sim_siglip2_like": 1.0, "sim_dfn5b_like": 0.75}
    assert record.tune.curve[record.tune.chosen_index].weights == record.tune.chosen.weights
    assert record.retrievers["sim_dfn5b_like"].spec.weight == 0.75 and record.retrievers["fused"].spec.fusion.params == {"ddof": 0}
    assert record.run.device == "cpu" and record.run.lists["sim_siglip2_like"]["depth"] == 100
    old = json.loads(text)
    del old["version"], old["files"]
    older = RunRecord.from_json(old)
    assert older.version == RECORD_VERSION and older.files == {}
    assert older.tune == record.tune and older.retrievers == record.retrievers


def test_round_trip_is_exact_and_fusions_are_a_field():
    data = _record_json()
    record = RunRecord.from_json(json.loads(json.dumps(data)))
    again = RunRecord.from_json(record.to_json())
    assert again == record and again.to_json() == record.to_json()
    assert record.fusion.method == "dbsf" and record.fusion.params == {"ddof": 0}  # a setting it lacks: the default
    assert record.fusions == ["fused"] and record.singles == ["a", "fused_x"]  # never decided by the name
    assert record.retrievers["fused"].members == ["a", "fused_x"] and record.level == 0.9 and record.ks == [1, 5]
    assert record.comparison("fused", "a", "t2i", 1).wins == 3 and record.comparison("fused", "a", "i2t", 1) is None


def test_best_single_is_one_definition():
    record = RunRecord.from_json(_record_json())
    assert record.best_single("t2i", 1) == "fused_x"  # 45 > 40; the fusion (50) is not a single model
    assert record.best_single("i2t", 1) == "a"
    assert record.best_single("t2i", 5) == "a"  # a tie (70 = 70): the first in config order
    assert record.best_single("mean", 5) == "fused_x"
    assert record.best_single("t2i", 1, among=["a"]) == "a"
    assert record.best_single("t2i", 10) is None  # a k the run did not measure: never guessed (was: the first model)


def test_a_version_1_file_reads_and_a_newer_one_says_its_version():
    old = _record_json()
    del old["version"], old["files"]
    for c in old["comparisons"]:
        del c["level"], c["draws"]
    record = RunRecord.from_json(old)
    assert record.version == RECORD_VERSION and record.files == {}
    assert record.comparisons[0].level == 0.9 and record.comparisons[0].draws == 2000  # the record's eval block's
    with pytest.raises(RecordError, match="record version 9; this fusebench reads record versions 1 to"):
        RunRecord.from_json(_record_json(version=9))


@pytest.mark.parametrize("change,fragment", [
    ({"dataset": {"name": "d"}}, "'dataset' lacks"),
    ({"retrievers": {}}, "'retrievers' is missing or empty"),
    ({"retrievers": {"a": {"t2i": {}, "i2t": {}, "mean": {}}}}, "retriever 'a' lacks 'spec'"),
    ({"retrievers": {"a": {"t2i": [], "i2t": {}, "mean": {}, "spec": {}}}}, "retriever 'a' t2i is not an object"),
    ({"comparisons": [{"baseline": "a"}]}, "a comparison lacks"),
    ({"comparisons": {}}, "'comparisons' is not a list"),
    ({"files": ["x"]}, "'files' is not a mapping"),
    ({"fusion": {"method": "nosuch"}}, "the fusion settings cannot be read"),
    ({"tune": {"split": "val"}}, "'tune' lacks 'criterion'"),
])
def test_a_damaged_record_says_what_is_wrong(change, fragment):
    with pytest.raises(RecordError, match=fragment):
        RunRecord.from_json(_record_json(**change))
    with pytest.raises(RecordError, match="not an object"):
        RunRecord.from_json([1, 2])
