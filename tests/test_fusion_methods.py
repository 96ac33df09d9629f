"""The fusion methods' registry (fusebench.fusion.methods): one module per method, every list of methods derived
from it, and each kind running on every fusion path. RBC (rank-biased centroids), the method added as a user
would add one, against a slow reference and against ranx itself; a general score map, registered here, runs on
the list path and the whole-rankings path with no code of its own."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.reference import integer_embeddings

from fusebench import FusebenchError
from fusebench.backends.retrieval import SearchSettings, retrieve
from fusebench.encoders.base import ModelEmbeddings
from fusebench.fusion import methods as registry
from fusebench.fusion.combine import fuse
from fusebench.fusion.config import METHODS, RANK_METHODS, FusionConfig
from fusebench.fusion.methods import Method, register

ROOT = Path(__file__).resolve().parents[1]


def test_every_list_of_methods_comes_from_the_registry():
    from fusebench.report.sweep import FACTOR_ORDER

    assert METHODS == ("none", *registry.names()) and FACTOR_ORDER["method"] == list(METHODS)
    assert set(RANK_METHODS) == {m for m in registry.REGISTRY.names() if registry.method(m).kind == "rank"}
    assert FACTOR_ORDER["method"][:7] == ["none", "sum", "minmax", "zscore", "isr", "rrf", "dbsf"]  # as before
    formulas = (ROOT / "docs" / "formulas.md").read_text()
    config_md = (ROOT / "docs" / "config.md").read_text()
    for method in registry.REGISTRY.items():
        name = method.name
        assert method.source and method.formula and method.kind in registry.KINDS
        assert re.search(rf"^\| `{name}` \|", formulas, re.M), f"docs/formulas.md has no row for {name}"
        yaml = (ROOT / "conf" / "fusion" / f"{name}.yaml").read_text()
        assert re.search(rf"^method: {name}$", yaml, re.M)
        row = re.search(rf"^\| `{name}` \|.*$", formulas, re.M).group(0)
        for key in (f.name for f in fields(method.params)) if method.params else ():
            assert f"fusion.params.{key}" in row, f"docs/formulas.md's {name} row does not name fusion.params.{key}"
            assert f"params.{key}" in config_md, f"docs/config.md does not name {name}'s params.{key}"
            assert re.search(rf"^  {key}: ", yaml, re.M), f"conf/fusion/{name}.yaml does not list params.{key}"
        assert (ROOT / "src" / "fusebench" / "fusion" / "methods" / f"{name}.py").is_file()  # one module each


def _lists(seed=0, queries=6, k=8, models=3, items=20):
    rng = np.random.default_rng(seed)
    ids = [torch.from_numpy(np.stack([rng.permutation(items)[:k] for _ in range(queries)])) for _ in range(models)]
    scores = [torch.from_numpy(np.sort(rng.random((queries, k)).astype(np.float32), axis=1)[:, ::-1].copy())
              for _ in range(models)]
    return ids, scores


def _slow_rbc(ids, phi, weights):
    """RBC written out: for each query, sum over lists of w (1 - phi) phi^(r - 1), r the 1-based position."""
    out = []
    for q in range(ids[0].shape[0]):
        total: dict[int, float] = {}
        for m, lists in enumerate(ids):
            for r, item in enumerate(lists[q].tolist(), start=1):
                total[item] = total.get(item, 0.0) + weights[m] * (1 - phi) * phi ** (r - 1)
        out.append(total)
    return out


@pytest.mark.parametrize("phi", [0.5, 0.8, 0.95])
def test_rbc_equals_the_obvious_sum(phi):
    ids, scores = _lists()
    weights = [1.0, 0.5, 2.0]
    config = FusionConfig(method="rbc", params={"phi": phi}, top_k=8)
    fused = fuse(ids, scores, config, final_k=24, weights=weights)
    for q, expected in enumerate(_slow_rbc(ids, phi, weights)):
        got = {int(i): float(s) for i, s in zip(fused.ids[q], fused.scores[q]) if i >= 0}
        assert got.keys() == expected.keys()
        assert all(abs(got[i] - expected[i]) <= 1e-6 * max(1.0, expected[i]) for i in got)
        order = [int(i) for i in fused.ids[q] if i >= 0]
        assert [got[i] for i in order] == sorted(got.values(), reverse=True)


@pytest.mark.slow  # ranx compiles its numba kernels on import (~40 s); test_rbc_equals_the_obvious_sum stays
def test_rbc_equals_ranx():
    ranx = pytest.importorskip("ranx")
    from ranx.fusion import rbc

    ids, scores = _lists(seed=3, queries=5, k=6, models=2, items=15)
    runs = [ranx.Run({f"q{q}": {f"d{int(i)}": float(s) for i, s in zip(ids[m][q].tolist(), scores[m][q].tolist())}
                      for q in range(5)}) for m in range(2)]
    theirs = rbc(runs, phi=0.7).to_dict()
    fused = fuse(ids, scores, FusionConfig(method="rbc", params={"phi": 0.7}, top_k=6), final_k=12)
    for q in range(5):
        ours = {f"d{int(i)}": float(s) for i, s in zip(fused.ids[q], fused.scores[q]) if i >= 0}
        assert ours.keys() == theirs[f"q{q}"].keys()
        assert all(abs(ours[d] - theirs[f"q{q}"][d]) < 1e-6 for d in ours)


@pytest.mark.parametrize("given,fragment", [
    ({"params": {"phi": 1.0}}, "fusion.params.phi=1.0 is not valid"),
    ({"params": {"phi": "x"}}, "fusion.params.phi='x'"),
    ({"params": {"psi": 0.5}}, "unknown key(s) psi; valid keys: phi"),
    ({"method": "rrf", "params": {"phi": 0.5}}, "fusion.params.phi=0.5 is never read with fusion.method=rrf"),
    ({"method": "isr", "params": {"psi": 0.5}}, "fusion.params.psi is not a setting of fusion.method=isr, which has no"),
    ({"score_map": "atan"}, "fusion.score_map='atan' is never read with fusion.method=rbc (it reads only ranks)"),
])
def test_rbc_settings_are_checked(given, fragment):
    with pytest.raises(FusebenchError) as err:
        FusionConfig(**{"method": "rbc", **given})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_rbc_records_what_ran():
    assert FusionConfig(method="rbc").params == {"phi": 0.8}
    assert FusionConfig(method="rrf").params == {"rrf_k": 60.0, "rrf_weighting": "multiply"}
    assert FusionConfig(method="zscore").params == FusionConfig(method="dbsf").params == {"ddof": 0}
    assert FusionConfig(method="isr").params == {}


def _cube(scores, valid, config):
    """A score map that is no affine map: s^3 (a method users could add; not shipped)."""
    return scores**3


@pytest.fixture
def cube():
    method = register(Method("cube_test", "score", "s^3", "tests/test_fusion_methods.py", _cube))
    yield method
    registry.REGISTRY.unregister("cube_test")


def _models(seed=5, n=30, captions=45, d=6):
    rng = np.random.default_rng(seed)
    caption_image = np.sort(rng.integers(0, n, captions))
    return [ModelEmbeddings(name, integer_embeddings(rng, n, d), integer_embeddings(rng, captions, d))
            for name in "ab"], caption_image


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("top_k", [None, 7])
def test_a_general_score_map_runs_on_every_path(cube, top_k):
    """Registered, it is a valid fusion.method; its evidence is its own map on the list path and over whole
    rankings (top_k: null), with no kernel code: each fused t2i list equals the obvious sum of s^3."""
    models, caption_image = _models()
    config = FusionConfig(method="cube_test", top_k=top_k, final_top_k=10)
    out = retrieve(models, caption_image, config, keep_k=10, settings=SearchSettings(chunk_size=8, item_chunk_size=9))
    scores = [(m.text @ m.image.T).astype(np.float64) for m in models]
    for q in range(len(caption_image)):
        depth = scores[0].shape[1] if top_k is None else top_k
        total: dict[int, float] = {}
        for s in scores:
            for item in sorted(range(s.shape[1]), key=lambda j: (-s[q, j], j))[:depth]:
                total[item] = total.get(item, 0.0) + s[q, item] ** 3
        expected = sorted(total.values(), reverse=True)[:10]
        got = out["fused"]["t2i"].scores[q].tolist()
        assert np.allclose(got[:len(expected)], expected, rtol=1e-5)


def test_an_unregistered_method_is_refused():
    with pytest.raises(FusebenchError, match="fusion.method='cube_test' is not valid"):
        FusionConfig(method="cube_test")
    assert "cube_test" not in METHODS


@pytest.mark.parametrize("given,fragment", [
    ({"method": "dbsf", "params": {"rrf_k": 5}}, "fusion.params.rrf_k=5 is never read with fusion.method=dbsf; "
     "fusion.params.rrf_k is read only with fusion.method=rrf"),
    ({"method": "rrf", "params": {"ddof": 1}}, "fusion.params.ddof=1 is never read with fusion.method=rrf"),
    ({"method": "rbc", "params": {"rrf_k": 10}}, "fusion.params.rrf_k=10 is never read with fusion.method=rbc"),
    ({"method": "rbc", "rrf_k": 10}, "fusion.params.rrf_k=10 is never read with fusion.method=rbc"),  # the old key
    ({"method": "rrf", "flat_score": 0.5}, "fusion.flat_score=0.5 is never read with fusion.method=rrf"),
])
def test_a_setting_the_method_never_reads_is_refused(given, fragment):
    with pytest.raises(FusebenchError) as err:
        FusionConfig(**given)
    assert fragment in str(err.value)


def test_a_preset_turned_into_another_method_drops_what_that_method_never_reads():
    from fusebench.fusion.presets import definition, package_conf, true_label

    assert definition("qdrant_dbsf", [package_conf()])["ddof"] == 1
    preset = FusionConfig(method="rrf", params={"ddof": 1}, preset="qdrant_dbsf")  # fusion=qdrant_dbsf fusion.method=rrf
    ran = true_label(preset, [package_conf()])
    assert ran.preset is None and ran.method == "rrf" and ran.params == {"rrf_k": 60.0, "rrf_weighting": "multiply"}
    # Qdrant's rank weighting (rrf_weighting=rank) belongs to rrf: with the preset turned into dbsf and a mean it is
    # dropped with the label, never named as the setting to change (found by the hostile probe of issue 39)
    preset = FusionConfig(method="dbsf", combine="mean", preset="qdrant_rrf",
                          params={"rrf_k": 1, "rrf_weighting": "rank"})  # fusion=qdrant_rrf fusion.method=dbsf
    ran = true_label(preset, [package_conf()])
    assert ran.preset is None and ran.method == "dbsf" and ran.params == {"ddof": 0}
    with pytest.raises(FusebenchError, match="use fusion.params.rrf_weighting=multiply"):  # rrf reads it: refused
        FusionConfig(method="rrf", params={"rrf_weighting": "rank"}, combine="mean")


# -- fusion=none reads only top_k: every other setting is refused, naming it (issue 39, item 6) ----------------------

# a valid value other than the default for each setting; a setting added to FusionConfig without one fails the test
# below, so what fusion=none refuses is never left unchecked
NOT_DEFAULT = {"fuse_on": "document", "final_top_k": 5, "rrf_k": 5.0, "ddof": 1, "rrf_weighting": "rank",  # old keys
               "combine": "max", "score_map": "atan", "flat_score": 0.5, "floor": 0.001, "rrf_ranks": "concatenated",
               "ties": "id", "preset": "qdrant_rrf", "params": {"phi": 0.5}}


def test_what_each_method_reads_comes_from_the_registry():
    from fusebench.fusion.config import NO_FUSION_READS, fusion_reads, method_reads, moved_keys, param_owners
    from fusebench.runtime.checks import config_keys

    keys = set(config_keys(FusionConfig))
    assert set(NOT_DEFAULT) == keys - {"method", "top_k"}  # every setting but the selector and what none reads
    assert fusion_reads("none") == NO_FUSION_READS == ("top_k",)
    some = {key for name in registry.names() for key in method_reads(name)}
    for name in registry.names():
        reads = set(fusion_reads(name))
        assert reads - some == keys - some - {"method", "params", *moved_keys()}  # what every method reads
        assert reads & some == set(method_reads(name))  # and its own, from its Method in the registry
        assert not reads & set(moved_keys())  # the old flat keys: read into params, never as settings
    assert moved_keys() == ("rrf_k", "ddof", "rrf_weighting")
    assert param_owners("rrf_k") == ("rrf",) and set(param_owners("ddof")) == {"dbsf", "zscore"}


@pytest.mark.parametrize("key", sorted(NOT_DEFAULT))
def test_no_fusion_refuses_every_setting_it_never_reads(key):
    from fusebench.fusion.config import fusion_reads, moved_keys, param_owners

    with pytest.raises(FusebenchError) as err:
        FusionConfig(method="none", **{key: NOT_DEFAULT[key]})
    message = str(err.value)
    moved = key in moved_keys()  # an old flat key: read as fusion.params.KEY, and refused as that
    assert f"fusion.{'params.' if moved else ''}{key}" in message and "\n" not in message
    if key not in ("preset", "params"):  # the one rule: never read with none, and who reads it
        assert message.startswith(f"fusion.{'params.' if moved else ''}{key}={NOT_DEFAULT[key]!r} is never read with "
                                  "fusion.method=none (no fusion: each model is evaluated alone"), message
        readers = param_owners(key) if moved else [m for m in registry.names() if key in fusion_reads(m)]
        assert (f"read only with fusion.method={' | '.join(readers)}" in message if len(readers) < len(registry.names())
                else "read with every fusion.method but none" in message), message


def test_no_fusion_takes_its_list_length_and_the_defaults():
    assert FusionConfig(method="none").top_k == 100
    assert FusionConfig(method="none", top_k=None).top_k is None
    assert FusionConfig(method="none", top_k=7, fuse_on="source_object", rrf_k=60).top_k == 7  # defaults set again


def test_a_record_of_no_fusion_written_before_the_rule_is_read():
    """A metrics.json of a fusion=none run holding a setting nothing read (written before they were refused) is read,
    with those settings at their defaults; a fusion's settings are read as written."""
    from fusebench.evaluation.subrecords import fusion_from_json
    from fusebench.fusion.config import settings_json

    old = {**settings_json(FusionConfig(method="none")), "fuse_on": "document", "params": {"rrf_k": 5.0}, "top_k": 20}
    read = fusion_from_json(old, "metrics.json: 'fusion'")
    assert read == FusionConfig(method="none", top_k=20)
    fused = {**settings_json(FusionConfig(method="rrf")), "fuse_on": "document",
             "params": {"rrf_k": 5.0, "rrf_weighting": "multiply"}}
    assert settings_json(fusion_from_json(fused, "metrics.json: 'fusion'")) == fused


@pytest.mark.parametrize("overrides", [["fusion.rrf_k=30", "fusion.params.rrf_k=50"],
                                       ["+fusion.params.ddof=1", "fusion.ddof=0"],
                                       ["fusion.rrf_weighting=rank", "++fusion.params.rrf_weighting=multiply"]])
def test_an_old_key_and_its_new_place_given_together_are_refused(overrides):
    from fusebench import FusebenchError
    from fusebench.app.api import compose
    from fusebench.fusion.config import check_moved_overrides

    key = overrides[0].lstrip("+").split("=")[0].rsplit(".", 1)[-1]
    with pytest.raises(FusebenchError, match=rf"fusion.{key} and fusion.params.{key} are both given"):
        check_moved_overrides(overrides)
    with pytest.raises(FusebenchError, match=rf"fusion.{key} and fusion.params.{key} are both given"):
        compose(["fusion=rrf", *overrides])
    check_moved_overrides(overrides[:1])  # one of them alone is read (the old key with a warning)
    check_moved_overrides(overrides[1:])
