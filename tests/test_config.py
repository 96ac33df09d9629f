from dataclasses import asdict

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from fusebench.fusion import METHODS, FusionConfig
from fusebench.schema import EmbedSchema, EvalSchema, SimDatasetSchema, WandbSchema


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
