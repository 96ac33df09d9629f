import copy
from dataclasses import asdict
from pathlib import Path

import pytest
from helpers.tiers import fast_first
from hydra.errors import HydraException
from omegaconf import OmegaConf

from fusebench.config.schema import EmbedConfig, EvalConfig, WandbConfig
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.fusion.config import METHODS, FusionConfig


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_default_job_takes_every_default_from_the_schemas(compose_cfg):
    """One home per default: the composed default job is exactly the schemas' defaults (no YAML restates them)."""
    cfg = compose_cfg()
    assert list(cfg.models) == ["sim_siglip2_like", "sim_dfn5b_like"]
    plain = OmegaConf.to_container(cfg, resolve=False)
    assert plain["fusion"] == asdict(FusionConfig())
    assert plain["eval"] == asdict(EvalConfig())
    assert plain["embed"] == asdict(EmbedConfig())
    assert plain["dataset"] == asdict(SimDatasetConfig())
    assert plain["logger"] == asdict(WandbConfig())


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_wrong_type_is_refused_while_composing(compose_cfg):
    with pytest.raises(HydraException, match="eval.bootstrap.draws"):
        compose_cfg(["eval.bootstrap.draws=abc"])
    with pytest.raises(HydraException, match="fusion.top_k"):
        compose_cfg(["fusion.top_k=all"])


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_models_multi_select_and_by_hand(compose_cfg):
    cfg = compose_cfg(["models=[sim_dfn5b_like,sim_third]"])
    assert list(cfg.models) == ["sim_dfn5b_like", "sim_third"]
    cfg = compose_cfg(["models=[]", "+models.a.kind=vectors", "+models.a.image_embeddings=A.npy",
                       "+models.b.kind=vectors", "+models.b.image_embeddings=B.npy"])
    assert OmegaConf.to_container(cfg.models) == {"a": {"kind": "vectors", "image_embeddings": "A.npy"},
                                                   "b": {"kind": "vectors", "image_embeddings": "B.npy"}}


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("method", fast_first(METHODS, 2))  # a composition each ("none", then a fusion)
def test_every_fusion_method_has_a_config(compose_cfg, method):
    cfg = compose_cfg([f"fusion={method}"])
    assert cfg.fusion.method == method
    own = asdict(FusionConfig(method=method))["params"]  # the method's own parameters, at their defaults
    assert {k: v for k, v in cfg.fusion.items() if k != "method"} == {
        **{k: v for k, v in asdict(FusionConfig()).items() if k != "method"}, "params": own}  # one schema


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_dataset_manifest_group(compose_cfg):
    cfg = compose_cfg(["dataset=manifest", "dataset.manifest=M.jsonl"])
    assert cfg.dataset.kind == "manifest" and cfg.dataset.image_root is None


def test_hydra_dirs_under_output_dir(compose_cfg, monkeypatch):
    monkeypatch.setenv("FUSEBENCH_OUTPUT", "/tmp/fb-out")
    cfg = compose_cfg(return_hydra_config=True)
    assert cfg.paths.output_dir == "/tmp/fb-out"
    assert cfg.hydra.job.chdir is False


FUSED_STUDIES = ("pair_dbsf_source", "pair_rrf_document", "pair_rrf_source", "four_dbsf_source")


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("study", fast_first(FUSED_STUDIES))
def test_fused_article_jobs_use_lowercased_siglip2_as_published(compose_cfg, study):
    """The article fused lowercased SigLIP 2 queries (its gains are over lowercased SigLIP 2)."""
    cfg = compose_cfg(["experiment=article_coco", f"study={study}"])
    siglip2 = [name for name in cfg.models if name.startswith("siglip2_")]
    assert siglip2 and all(cfg.models[name].text.case == "lowercase" for name in siglip2)
    assert cfg.reference.study == study and cfg.reference.dataset == "coco5k"


@pytest.mark.slow  # > 0.1 s: outside the unit tier
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
    from fusebench.config.reference import article

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


@pytest.mark.parametrize("name", fast_first(ENGINE_PRESETS))
def test_engine_presets_compose(compose_cfg, name):
    cfg = compose_cfg([f"fusion={name}"])
    assert cfg.fusion.preset == name and FusionConfig(**OmegaConf.to_container(cfg.fusion)).method in METHODS


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_engines_sweep_runs_every_engine_preset(compose_cfg):
    sweep = compose_cfg(["experiment=fusion_engines", "dataset=sim"], return_hydra_config=True)
    assert set(ENGINE_PRESETS) <= set(sweep.hydra.sweeper.params["fusion"].split(","))


@pytest.fixture(scope="module")
def plain_wandb_config() -> dict:
    """A composed config as plain data, to change by hand (what Hydra's own checks would refuse first): composed
    once for the module, each case below changes a deep copy."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fusebench.config import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
        cfg = compose(config_name="config", overrides=["logger=wandb", "fusion.top_k=100"])
    GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_composed_config_converts_once_into_its_types(compose_cfg):
    from fusebench.app.run_config import run_config
    from fusebench.config.run import RunConfig
    from fusebench.config.schema import NoLoggerConfig
    from fusebench.data.kinds.sim import SimDatasetConfig
    from fusebench.encoders.kinds.hf import HFModel
    from fusebench.encoders.kinds.open_clip import OpenClipModel
    from fusebench.encoders.kinds.sim import SimModel

    config = run_config(compose_cfg(["logger=none", "tune=weights"]))
    assert isinstance(config, RunConfig) and isinstance(config.dataset, SimDatasetConfig)
    assert config.eval.bootstrap.draws == 2000 and config.eval.lists.depth == 100 and config.fusion.method == "dbsf"
    assert isinstance(config.logger, NoLoggerConfig) and config.tune.split == "seeded" and config.tune.k == 1
    sim = config.models["sim_dfn5b_like"]
    assert isinstance(sim, SimModel) and sim.params.score == (0.4, 0.12) and sim.weight == 1.0
    assert config.resolved["models"]["sim_dfn5b_like"]["dim"] == 1024  # the composed config, for trackers
    real = run_config(compose_cfg(["experiment=article_coco", "study=pair_rrf_document", "dataset=sim", "logger=none"]))
    siglip, dfn = real.models["siglip2_so400m_p14_384"], real.models["dfn5b_h14_224"]
    assert isinstance(siglip, HFModel) and siglip.text.case == "lowercase" and siglip.text.max_length == 64
    assert siglip.stand_in.text_noise == 0.22  # the sim: block's noise for its text case
    assert isinstance(dfn, OpenClipModel) and dfn.pretrained == "dfn5b" and real.reference["study"] == "pair_rrf_document"


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("change,message", [
    (lambda c: c.update(bogus=1), "unknown top-level key(s) bogus (nothing reads them); valid: paths, dataset, gallery, models,"),
    (lambda c: c["eval"]["bootstrap"].update(drawz=5), "eval.bootstrap: unknown key(s) drawz; valid keys: draws, level, seed."),
    (lambda c: c["eval"]["lists"].pop("depth"), "eval.lists.depth is missing"),
    (lambda c: c["eval"].update(ks=5), "eval.ks=5 is not valid"),
    (lambda c: c["eval"].update(device="gpu"), "eval.device='gpu' is not a torch device"),
    (lambda c: c["dataset"].update(n_imgs=5),
     "dataset: unknown key(s) n_imgs; valid keys: caption_noise, caption_noise_decay, cone, gap, kind,"),
    (lambda c: c["dataset"].update(n_images=0), "dataset.n_images=0 is not valid"),
    (lambda c: c["models"]["sim_dfn5b_like"].update(wieght=0),
     "models.sim_dfn5b_like (kind sim): unknown key(s) wieght (nothing reads them); valid keys: dim, image_noise,"),
    (lambda c: c["models"]["sim_dfn5b_like"].update(text={"cas": "lowercase"}),
     "models.sim_dfn5b_like.text: unknown key(s) cas (nothing reads them); valid keys: case, template."),
    (lambda c: c["models"]["sim_dfn5b_like"].update(weight=1e9), "models.sim_dfn5b_like.weight=1000000000.0 is not valid"),
    (lambda c: c["models"].update(x={"kind": "hf", "checkpoint": "a/b", "sim": {"dimm": 3}}),
     "models.x.sim: unknown key(s) dimm (nothing reads them)"),
    (lambda c: c["models"].update(x={"kind": "hf", "checkpoint": "a/b", "text": {"case": "lowercase"},
                                     "sim": {"dim": 8, "image_noise": 0.1, "text_noise": {"as_typed": 0.3}, "seed": 1}}),
     "models.x.sim.text_noise has no value for text.case='lowercase'"),
    (lambda c: c["models"].update(x={"kind": "open_clip"}), "models.x.model is not set"),
    (lambda c: c["fusion"].update(top_k=0), "fusion.top_k=0 is not valid"),
    (lambda c: c["fusion"].update(top_k=5), "fusion.top_k=5 is below the largest eval.ks (10)"),
    (lambda c: c.update(logger={"kind": "none", "project": "x"}), "logger (logger=none): unknown key(s) project"),
    (lambda c: c["logger"].update(mode="live"), "logger.mode='live' is not valid"),
    (lambda c: c["embed"]["cache"].update(dtype="int8"), "embed.cache.dtype='int8' is not valid"),
    (lambda c: (c["tune"].update(enabled=True, criterion="t2i R@20"), c["fusion"].update(top_k=10)),
     "fusion.top_k=10 is below the largest tune.criterion (20)"),
    (lambda c: c.update(reference={"dataset": "coco5k"}), "reference.study is missing"),
    (lambda c: c["paths"].update(cache="x"), "paths: unknown key(s) cache; valid keys: data_root, output_dir."),
    # a setting the run never reads (issue 39, item 6): no fusion, a weight without a fusion, a preset's unread one
    (lambda c: c["fusion"].update(method="none", rrf_k=5), "fusion.params.rrf_k=5 is never read with fusion.method=none"),
    (lambda c: c["fusion"].update(method="none", params={"ddof": 1}),
     "fusion.params.ddof=1 is never read with fusion.method=none"),
    (lambda c: c["fusion"].update(method="none", fuse_on="document"),
     "fusion.fuse_on='document' is never read with fusion.method=none"),
    (lambda c: (c["fusion"].update(method="none"), c["models"]["sim_dfn5b_like"].update(weight=0.5)),
     "models.sim_dfn5b_like.weight=0.5 is never read: no fusion runs (fusion.method=none)"),
    (lambda c: (c["models"].pop("sim_siglip2_like"), c["models"]["sim_dfn5b_like"].update(weight=2)),
     "models.sim_dfn5b_like.weight=2 is never read: no fusion runs (one model selected (sim_dfn5b_like))"),
    (lambda c: c["fusion"].update(method="sum", score_map="cosine01", ties="id", preset="milvus_weighted", params={"rrf_k": 5}),
     "fusion.params.rrf_k=5 is never read with fusion.method=sum (with fusion.preset=milvus_weighted, fusion.method=sum reads, "
     "of the settings only some methods read, fusion.score_map and fusion.flat_score)"),
])
def test_a_config_mistake_is_one_line_naming_the_key(plain_wandb_config, change, message):
    """Every key nothing reads, at any level, and every bad value: one FusebenchError naming it, from the one
    conversion (the dataclasses' fields are the valid keys)."""
    from fusebench import FusebenchError
    from fusebench.app.run_config import run_config

    config = copy.deepcopy(plain_wandb_config)
    change(config)
    with pytest.raises(FusebenchError) as err:
        run_config(config)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # a fresh interpreter (the fast tier keeps test_api's test_the_api_is_imported_on_first_use)
def test_converting_a_config_imports_nothing_heavy():
    """The CLI converts the config before any run starts: a mistake is reported without torch and the rest."""
    import subprocess
    import sys

    code = ("import sys\nfrom hydra import compose, initialize_config_dir\nfrom fusebench.config import CONFIG_DIR, schema\n"
            "from fusebench.app.run_config import run_config\nschema.register()\n"
            "with initialize_config_dir(version_base='1.3', config_dir=CONFIG_DIR):\n"
            "    cfg = compose(config_name='config', overrides=['experiment=article_coco', 'study=pair_rrf_document',"
            " 'dataset=sim', 'tune=weights'])\n"
            "run_config(cfg)\n"
            "print(sorted(m for m in ('torch', 'numba', 'matplotlib', 'transformers', 'open_clip', 'wandb', 'numpy')"
            " if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
