import pytest
from omegaconf import OmegaConf

from fusebench.fusion import METHODS


def test_default_config_two_sim_models_and_dbsf(compose_cfg):
    cfg = compose_cfg()
    assert list(cfg.models) == ["sim_siglip2_like", "sim_dfn5b_like"]
    assert cfg.models.sim_siglip2_like.kind == "sim" and cfg.models.sim_siglip2_like.dim == 1152
    assert cfg.dataset.kind == "sim" and cfg.dataset.n_images == 5000 and cfg.dataset.n_captions == 25010
    assert cfg.fusion.method == "dbsf" and cfg.fusion.fuse_on == "source_object" and cfg.fusion.top_k == 100
    assert list(cfg.eval.ks) == [1, 5, 10] and cfg.eval.bootstrap.draws == 2000
    assert cfg.logger.kind == "wandb" and cfg.logger.mode is None  # offline unless WANDB_MODE says otherwise


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
    assert cfg.fusion.method == method and cfg.fusion.rrf_k == 60 and cfg.fusion.ddof == 0


def test_dataset_manifest_group(compose_cfg):
    cfg = compose_cfg(["dataset=manifest", "dataset.manifest=M.jsonl"])
    assert cfg.dataset.kind == "manifest" and cfg.dataset.manifest == "M.jsonl"


def test_hydra_dirs_under_output_dir(compose_cfg, monkeypatch):
    monkeypatch.setenv("FUSEBENCH_OUTPUT", "/tmp/fb-out")
    cfg = compose_cfg(return_hydra_config=True)
    assert cfg.paths.output_dir == "/tmp/fb-out"
    assert cfg.hydra.job.chdir is False
