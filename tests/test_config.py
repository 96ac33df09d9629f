from dataclasses import asdict
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from fusebench.config.schema import EmbedSchema, EvalSchema, SimDatasetSchema, WandbSchema
from fusebench.fusion.combine import METHODS, FusionConfig


def test_default_job_takes_every_default_from_the_schemas(compose_cfg):
    """One home per default: the composed default job is exactly the schemas' defaults (no YAML restates them)."""
    cfg = compose_cfg()
    assert list(cfg.models) == ["sim_siglip2_like", "sim_dfn5b_like"]
    plain = OmegaConf.to_container(cfg, resolve=False)
    assert plain["fusion"] == asdict(FusionConfig())
    assert plain["eval"] == asdict(EvalSchema())
    assert plain["embed"] == asdict(EmbedSchema())
    assert plain["dataset"] == asdict(SimDatasetSchema())
    assert plain["logger"] == asdict(WandbSchema())


def test_a_wrong_type_is_refused_while_composing(compose_cfg):
    with pytest.raises(HydraException, match="eval.bootstrap.draws"):
        compose_cfg(["eval.bootstrap.draws=abc"])
    with pytest.raises(HydraException, match="fusion.top_k"):
        compose_cfg(["fusion.top_k=all"])


def test_models_multi_select_and_by_hand(compose_cfg):
    cfg = compose_cfg(["models=[sim_dfn5b_like,sim_third]"])
    assert list(cfg.models) == ["sim_dfn5b_like", "sim_third"]
    cfg = compose_cfg(["models=[]", "+models.a.kind=vectors", "+models.a.image_embeddings=A.npy",
                       "+models.b.kind=vectors", "+models.b.image_embeddings=B.npy"])
    assert OmegaConf.to_container(cfg.models) == {"a": {"kind": "vectors", "image_embeddings": "A.npy"},
                                                   "b": {"kind": "vectors", "image_embeddings": "B.npy"}}


@pytest.mark.parametrize("method", METHODS)
def test_every_fusion_method_has_a_config(compose_cfg, method):
    cfg = compose_cfg([f"fusion={method}"])
    assert cfg.fusion.method == method
    assert {k: v for k, v in cfg.fusion.items() if k != "method"} == {
        k: v for k, v in asdict(FusionConfig()).items() if k != "method"}  # every option shares the schema


def test_dataset_manifest_group(compose_cfg):
    cfg = compose_cfg(["dataset=manifest", "dataset.manifest=M.jsonl"])
    assert cfg.dataset.kind == "manifest" and cfg.dataset.image_root is None


def test_hydra_dirs_under_output_dir(compose_cfg, monkeypatch):
    monkeypatch.setenv("FUSEBENCH_OUTPUT", "/tmp/fb-out")
    cfg = compose_cfg(return_hydra_config=True)
    assert cfg.paths.output_dir == "/tmp/fb-out"
    assert cfg.hydra.job.chdir is False


FUSED_STUDIES = ("pair_dbsf_source", "pair_rrf_document", "pair_rrf_source", "four_dbsf_source")


@pytest.mark.parametrize("study", FUSED_STUDIES)
def test_fused_article_jobs_use_lowercased_siglip2_as_published(compose_cfg, study):
    """The article fused lowercased SigLIP 2 queries (its gains are over lowercased SigLIP 2)."""
    cfg = compose_cfg(["experiment=article_coco", f"study={study}"])
    siglip2 = [name for name in cfg.models if name.startswith("siglip2_")]
    assert siglip2 and all(cfg.models[name].text.case == "lowercase" for name in siglip2)
    assert cfg.reference.study == study and cfg.reference.dataset == "coco5k"


def test_four_model_job_is_the_articles_four_models(compose_cfg):
    cfg = compose_cfg(["experiment=article_flickr", "study=four_dbsf_source"])
    assert set(cfg.models) == {"siglip2_so400m_p14_384", "siglip2_so400m_p16_384", "dfn5b_h14_224",
                               "metaclip_h14_fullcc"}
    assert cfg.reference.dataset == "flickr1k"


def test_published_numbers_say_their_protocol_and_source(compose_cfg):
    import yaml

    from fusebench.app.cli import CONFIG_DIR, registry

    for name in registry():
        spec = yaml.safe_load((Path(CONFIG_DIR) / "models" / f"{name}.yaml").read_text())
        for dataset, numbers in (spec.get("published") or {}).items():
            assert numbers["protocol"] in ("paper", "clip_benchmark") and numbers["source"], (name, dataset)
            assert 0 < numbers["t2i_r1"] < 100 and 0 < numbers["i2t_r1"] < 100
    spec = yaml.safe_load((Path(CONFIG_DIR) / "models" / "siglip2_so400m_p14_384.yaml").read_text())
    assert spec["published"]["coco5k"]["t2i_r1"] == 55.8 and spec["published"]["coco5k"]["protocol"] == "paper"


def test_article_reference_rows_point_at_real_study_jobs():
    from fusebench.config import CONFIG_DIR
    from fusebench.report.article import article

    studies = {p.stem for p in (Path(CONFIG_DIR) / "study").glob("*.yaml")}
    for dataset in ("coco5k", "flickr1k"):
        rows = {k: v for k, v in article()[dataset].items() if isinstance(v, dict)}
        assert rows and set(rows) <= studies
        for row in rows.values():
            assert row.get("baseline") is None or row["baseline"] in studies
            if row.get("ci"):
                assert row["ci"][0] <= row["gain_t2i_r1"] <= row["ci"][1]
    assert article()["coco5k"]["pair_dbsf_source"]["t2i_r1"] == 58.10


ENGINE_PRESETS = ["qdrant_rrf", "qdrant_dbsf", "elasticsearch_rrf", "ranx_combmnz", "ranx_combmax", "ranx_isr"]


@pytest.mark.parametrize("name", ENGINE_PRESETS)
def test_engine_presets_compose(compose_cfg, name):
    cfg = compose_cfg([f"fusion={name}"])
    assert cfg.fusion.preset == name and FusionConfig(**OmegaConf.to_container(cfg.fusion)).method in METHODS


def test_engines_sweep_runs_every_engine_preset(compose_cfg):
    sweep = compose_cfg(["experiment=fusion_engines", "dataset=sim"], return_hydra_config=True)
    assert set(ENGINE_PRESETS) <= set(sweep.hydra.sweeper.params["fusion"].split(","))


def test_long_lived_objects_are_frozen_once_per_process(monkeypatch):
    """The CLI moves the imported modules out of the collector's reach once (a sweep's later jobs must not
    freeze their own garbage with them) and once more at exit."""
    import gc

    from fusebench.app import cli

    freezes, at_exit = [], []
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(1))
    monkeypatch.setattr(cli.atexit, "register", lambda fn: at_exit.append(fn))
    monkeypatch.delattr(cli.freeze_long_lived, "done", raising=False)
    for _ in range(3):  # three jobs of a sweep in one process
        cli.freeze_long_lived()
    assert len(freezes) == 1 and at_exit == [gc.freeze]
