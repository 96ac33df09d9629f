"""Config values that would label, weigh or tune a run wrongly are refused (or relabelled) before any work.

Each case ran with exit 0 and a misleading result before: a preset's label on a fusion that is not the preset,
keys nothing reads, all-zero weights, settings a method ignores, a tuning grid with nothing to choose.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.tiers import fast_first
from hydra.errors import ConfigCompositionException

from fusebench import FusebenchError
from fusebench.app.pipeline import run
from fusebench.fusion.config import FusionConfig
from fusebench.fusion.presets import definition, package_conf, preset_files, true_label

SMALL = ["dataset.n_images=60", "dataset.n_captions=300", "logger=none", "plots=false", "eval.bootstrap.draws=50"]


def _refused(compose_cfg, tmp_path: Path, overrides: list[str], *fragments: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(FusebenchError) as err:
        run(compose_cfg(SMALL + [f"embed.cache.dir={tmp_path / 'cache'}"] + overrides), str(out))
    for fragment in fragments:
        assert fragment in str(err.value)
    assert not (out / "metrics.json").exists()


# -- presets: the name labels a fusion only while it is that preset ---------------------------------------------

def _composed(name: str, change: dict | None = None) -> dict:
    """The fusion group as Hydra composes ``fusion=NAME`` (its YAML file over the schema's defaults), with ``change``
    over it (its ``params`` over the file's)."""
    from fusebench.fusion.presets import _read

    values = {k: v for k, v in _read(preset_files([package_conf()])[name]).items() if k != "defaults"}
    change = change or {}
    return {**values, **change, "params": {**values.get("params", {}), **change.get("params", {})}}


@pytest.mark.parametrize("preset, change", [
    ("qdrant_dbsf", {"method": "zscore"}),  # another method (which reads the preset's ddof=1)
    ("qdrant_dbsf", {"method": "rrf"}),  # one that does not read it: the preset's own value, dropped with the label
    ("qdrant_dbsf", {"params": {"ddof": 0}}),  # another field of the same preset
    ("qdrant_dbsf", {"ddof": 0}),  # the same, by its old flat key (read until the next release)
    ("qdrant_rrf", {"params": {"rrf_k": 60.0}}),
    ("opensearch_minmax", {"floor": None}),  # a field the preset sets to non-default, put back to the default
    ("ranx_combmnz", {"combine": "sum"}),
    ("milvus_rrf", {"score_map": "none", "rrf_ranks": "concatenated"}),  # a field the preset leaves at its default
    ("qdrant_rrf", {"params": {"rrf_k": 5.0}}),  # a setting the method reads: it changes what runs
])
def test_a_changed_preset_loses_its_label(preset, change):
    fusion = FusionConfig(**_composed(preset, change))
    assert true_label(fusion, [package_conf()]).preset is None
    assert true_label(FusionConfig(**_composed(preset)), [package_conf()]).preset == preset


def _unread_cases() -> list[tuple[str, str, object]]:
    """(preset, setting, value) for every preset and every setting only some methods read that its method never
    reads, at a valid value other than the default and the preset's own: from the preset files and the registry."""
    from fusebench.fusion.config import method_dependent, method_reads, param_names, param_owners

    other = {"flat_score": 0.25, "score_map": "atan", "rrf_ranks": "concatenated"}
    params = {"rrf_k": 5.0, "ddof": 1, "rrf_weighting": "rank", "phi": 0.5}  # fusion.params.KEY
    assert set(other) == set(method_dependent()) and set(params) == set(param_names())  # a new one gets a value here
    cases = []
    for name in sorted(preset_files([package_conf()])):
        own = definition(name, [package_conf()])
        cases += [(name, key, other[key]) for key in method_dependent() if key not in method_reads(own["method"])]
        cases += [(name, f"params.{key}", params[key]) for key in param_names() if own["method"] not in param_owners(key)]
    assert {"milvus_weighted", "qdrant_rrf"} <= {c[0] for c in cases} and len(cases) >= 44
    return cases


@pytest.mark.parametrize("name,key,value", fast_first(_unread_cases(), 4, unpack=True))
def test_a_preset_setting_its_method_never_reads_is_refused(name, key, value, caplog):
    """fusion=milvus_weighted fusion.rrf_k=5 and fusion=qdrant_rrf fusion.ddof=1 ran as the plain preset, with a
    warning that the preset's settings had changed (issue 39, item 6): refused, naming the setting and what the preset's
    method reads; never a warning."""
    from fusebench.fusion.config import method_reads

    own = definition(name, [package_conf()])
    change = {"params": {key.removeprefix("params."): value}} if key.startswith("params.") else {key: value}
    with pytest.raises(FusebenchError) as err:
        fusion = FusionConfig(**_composed(name, change))  # as composed: before the preset's file is read
        true_label(fusion, [package_conf()])
    message = str(err.value)
    assert f"fusion.{key}=" in message and "\n" not in message and "dropped" not in caplog.text
    if "is never read" in message:  # else another rule of the combination names it (rank weighting with a mean)
        assert message.startswith(f"fusion.{key}={value!r} is never read with fusion.method={own['method']} "
                                  f"(with fusion.preset={name}, fusion.method={own['method']} reads"), message
        assert all(f"fusion.{read}" in message for read in method_reads(own["method"]))
    else:
        assert key == "params.rrf_weighting" and own["combine"] in ("mean", "geometric", "harmonic"), message


def test_a_preset_turned_into_a_method_that_never_reads_its_values_drops_them():
    """The preset's own values the new method never reads (milvus_weighted's score_map, ties aside) are dropped with
    the label; the record holds what ran."""
    fusion = FusionConfig(**_composed("milvus_weighted", {"method": "rrf"}))
    ran = true_label(fusion, [package_conf()])
    assert ran == FusionConfig(method="rrf", ties="id")


def test_a_preset_turned_into_another_method_warns_only_of_what_changed_what_runs(caplog):
    """The preset's ddof=1 that rrf never reads, set back to the default by hand, is not named as a change."""
    fusion = FusionConfig(**_composed("qdrant_dbsf", {"method": "rrf", "params": {"ddof": 0}}))
    ran = true_label(fusion, [package_conf()])
    assert ran.preset is None and ran.method == "rrf" and ran.params == {"rrf_k": 60.0, "rrf_weighting": "multiply"}
    assert "changes the preset's own settings (method=rrf)" in caplog.text and "ddof" not in caplog.text


@pytest.mark.slow  # composes every fusion option (the fast tier composes presets in test_config.py)
def test_every_preset_file_composes_to_its_own_definition(compose_cfg):
    """The YAML read by hand (presets.definition) is what Hydra composes: each preset keeps its label, with
    either fuse_on and any list length (run settings, not part of a preset)."""
    files = preset_files([package_conf()])
    assert {"qdrant_dbsf", "qdrant_rrf", "lancedb_rrf", "milvus_rrf", "opensearch_zscore"} <= set(files)
    labelled = 0
    for option in sorted(p.stem for p in (package_conf() / "fusion").glob("*.yaml")):
        fusion = dict(compose_cfg([f"fusion={option}", "fusion.top_k=37", "fusion.final_top_k=20"]).fusion)
        if fusion["preset"] is not None:
            labelled += 1
            assert true_label(FusionConfig(**fusion), [package_conf()]).preset == fusion["preset"], option
    assert labelled == 22


def test_unequal_weights_leave_a_preset_whose_engine_takes_none():
    fusion = FusionConfig(method="dbsf", params={"ddof": 1}, preset="qdrant_dbsf")
    assert true_label(fusion, [package_conf()], weights=[1.0, 2.0]).preset is None
    assert true_label(fusion, [package_conf()], weights=[2.0, 2.0]).preset == "qdrant_dbsf"  # only ratios matter
    rrf = FusionConfig(method="rrf", params={"rrf_k": 1, "rrf_weighting": "rank"}, preset="qdrant_rrf")  # Qdrant weighs RRF
    assert true_label(rrf, [package_conf()], weights=[1.0, 2.0]).preset == "qdrant_rrf"


@pytest.mark.slow  # whole jobs
def test_a_weighted_or_tuned_run_of_an_unweighted_preset_loses_its_label(compose_cfg, tmp_path):
    base = SMALL + [f"embed.cache.dir={tmp_path / 'c'}", "fusion=qdrant_dbsf"]
    weighted = run(compose_cfg(base + ["models.sim_dfn5b_like.weight=2"]), str(tmp_path / "w"))
    assert weighted.fusion.preset is None
    tuned = run(compose_cfg(base + ["tune=weights", "tune.weights=[0.5,4]"]), str(tmp_path / "t"))
    chosen = tuned.tune.chosen.weights
    assert (tuned.fusion.preset is None) == (len(set(chosen.values())) > 1)


def test_an_unknown_preset_name_is_refused():
    with pytest.raises(FusebenchError, match=r"fusion.preset='qdrant_dbfs' names no engine preset.*qdrant_dbsf"):
        true_label(FusionConfig(preset="qdrant_dbfs"), [package_conf()])


@pytest.mark.slow  # whole jobs
def test_a_run_of_a_changed_preset_is_recorded_without_it(compose_cfg, tmp_path, caplog):
    record = run(compose_cfg(SMALL + [f"embed.cache.dir={tmp_path / 'c'}", "fusion=qdrant_dbsf",
                                      "fusion.method=rrf"]), str(tmp_path / "r"))
    assert record.fusion.preset is None and record.fusion.method == "rrf"
    assert record.retrievers["fused"].spec.fusion.preset is None
    assert "fusion.preset=qdrant_dbsf dropped" in caplog.text and "method=rrf" in caplog.text
    kept = run(compose_cfg(SMALL + [f"embed.cache.dir={tmp_path / 'c'}", "fusion=qdrant_dbsf_document"]),
               str(tmp_path / "kept"))
    assert kept.fusion.preset == "qdrant_dbsf"


# -- keys nothing reads ---------------------------------------------------------------------------------------

@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("override, fragments", fast_first([  # a composition each
    ("+bogus=1", ["unknown top-level key(s) bogus", "valid: paths, dataset"]),
    ("+evals.ks=[1]", ["unknown top-level key(s) evals"]),
    ("+models.sim_dfn5b_like.wieght=0", ["models.sim_dfn5b_like (kind sim): unknown key(s) wieght", "weight"]),
    ("+models.sim_siglip2_like.text.cse=lowercase", ["models.sim_siglip2_like.text: unknown key(s) cse", "case"]),
    ("+models.sim_third.dim=8", ["models.sim_third.dim was set but model 'sim_third' is not selected",
                                 "models=[...,sim_third]"]),
    ("+models.mine.dim=8", ["models.mine has no kind", "+models.mine.kind="]),
], unpack=True))
def test_keys_nothing_reads_are_errors(compose_cfg, tmp_path, override, fragments):
    _refused(compose_cfg, tmp_path, [override], *fragments)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_real_models_sim_block_and_vectors_keys_are_checked(compose_cfg, tmp_path):
    _refused(compose_cfg, tmp_path, ["models=[dfn5b_h14_224,sim_third]", "+models.dfn5b_h14_224.sim.noise=1"],
             "models.dfn5b_h14_224.sim: unknown key(s) noise")
    _refused(compose_cfg, tmp_path, ["models=[]", "+models.a.kind=vectors", "+models.a.image_embedings=x.npy"],
             "models.a (kind vectors): unknown key(s) image_embedings", "image_embeddings")


# -- combinations that cannot mean anything -------------------------------------------------------------------

@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_tuning_without_a_fusion_is_one_line(compose_cfg, tmp_path):
    _refused(compose_cfg, tmp_path, ["tune=weights", "fusion=none"], "tune tunes a fusion", "fusion=dbsf")
    _refused(compose_cfg, tmp_path, ["tune=weights", "models=[sim_third]"], "select at least two models")


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_all_zero_weights_are_refused(compose_cfg, tmp_path):
    _refused(compose_cfg, tmp_path, ["models.sim_siglip2_like.weight=0", "models.sim_dfn5b_like.weight=0.0"],
             "every model weight is 0")


@pytest.mark.parametrize("overrides, key", fast_first([
    (["models.sim_siglip2_like.weight=1e39", "models.sim_dfn5b_like.weight=1e39"], "models.sim_siglip2_like.weight"),
    (["models.sim_dfn5b_like.weight=1e-300"], "models.sim_dfn5b_like.weight"),
    (["models.sim_dfn5b_like.weight=2e6"], "models.sim_dfn5b_like.weight"),
    (["tune=weights", "tune.weights=[1,1e300]"], "tune.weights"),
], unpack=True))
def test_weights_whose_float32_products_overflow_are_refused(compose_cfg, tmp_path, overrides, key):
    """Equal weights of 1e39 became inf in float32 and the fusion collapsed to the first model's ranking."""
    _refused(compose_cfg, tmp_path, overrides, f"{key}=", "valid: 0 or a number between 1e-06 and 1e+06")


@pytest.mark.slow  # a whole job
def test_weights_at_the_ends_of_the_range_run(compose_cfg, tmp_path):
    record = run(compose_cfg(SMALL + [f"embed.cache.dir={tmp_path / 'c'}", "models.sim_siglip2_like.weight=1e6",
                                      "models.sim_dfn5b_like.weight=1e-6"]), str(tmp_path / "r"))
    assert record.retrievers["fused"].recall("t2i", 1) == record.retrievers["sim_siglip2_like"].recall("t2i", 1)


def test_keys_added_to_logger_none_are_errors(compose_cfg, tmp_path):
    _refused(compose_cfg, tmp_path, ["logger=none", "+logger.project=x"], "logger (logger=none): unknown key(s) project")


@pytest.mark.parametrize("method, key, value", [
    ("dbsf", "rrf_ranks", "concatenated"), ("sum", "rrf_ranks", "concatenated"),
    ("rrf", "score_map", "cosine01"), ("isr", "score_map", "atan"),
    ("dbsf", "params.rrf_weighting", "rank"), ("borda", "params.rrf_weighting", "rank"),
])
def test_settings_the_method_never_reads_are_refused(method, key, value):
    given = {"params": {key.removeprefix("params."): value}} if key.startswith("params.") else {key: value}
    with pytest.raises(FusebenchError, match=rf"fusion.{key}='{value}' is never read with fusion.method={method}"):
        FusionConfig(method=method, **given)


@pytest.mark.slow  # a whole job
def test_one_model_with_a_fusion_says_the_fusion_is_skipped(compose_cfg, tmp_path, caplog):
    record = run(compose_cfg(SMALL + [f"embed.cache.dir={tmp_path / 'c'}", "models=[sim_third]", "fusion=rrf"]),
                 str(tmp_path / "r"))
    assert list(record.retrievers) == ["sim_third"]
    assert "fusion.method=rrf is skipped: one model is selected (sim_third)" in caplog.text


@pytest.mark.parametrize("overrides, fragment", fast_first([
    (["tune.weights=[]"], "tune.weights=[] is not valid"),
    (["tune.weights=[2.0]"], "the tuning grid has 1 setting"),
    (["tune.criterion='mean R@1000'"], "fusion.top_k=100 is below the largest tune.criterion (1000)"),
    (["tune.criterion='t2i R@101'", "fusion.top_k=100"], "below the largest tune.criterion (101)"),
], unpack=True))
def test_tuning_that_cannot_choose_is_refused(compose_cfg, tmp_path, overrides, fragment):
    _refused(compose_cfg, tmp_path, ["tune=weights", *overrides], fragment)


# -- the schemas are not options -------------------------------------------------------------------------------

@pytest.mark.parametrize("override", ["fusion=schema", "logger=schema", "dataset=sim_schema", "eval=schema",
                                      "tune=schema"])
def test_schemas_are_not_selectable(compose_cfg, override):
    with pytest.raises(ConfigCompositionException, match="Could not find"):
        compose_cfg([override])
