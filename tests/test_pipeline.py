import json

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.app.pipeline import run
from fusebench.evaluation.metrics import recall_at_k
from fusebench.evaluation.record import RunRecord

pytestmark = pytest.mark.slow  # whole jobs and subprocesses: not in the fast tier

SMALL_SIM = ["dataset.n_images=300", "dataset.n_captions=1510", "eval.bootstrap.draws=300"]


def test_run_writes_consistent_outputs(compose_cfg, tmp_path, capsys):
    cfg = compose_cfg(SMALL_SIM + ["eval.save_topk=20"])
    metrics = run(cfg, str(tmp_path)).to_json()
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk["dataset"]["simulated"] is True and on_disk["dataset"]["n_captions"] == 1510
    assert set(on_disk["retrievers"]) == {"sim_siglip2_like", "sim_dfn5b_like", "fused"}
    for name, entry in on_disk["retrievers"].items():
        for direction, queries in (("t2i", 1510), ("i2t", 300)):
            ranks = np.load(tmp_path / "ranks" / f"{name}.{direction}.npy")
            assert ranks.shape == (queries,)
            for k in (1, 5, 10):
                assert entry[direction][f"R@{k}"] == pytest.approx(recall_at_k(ranks, k))
            assert entry["mean"]["R@1"] == pytest.approx((entry["t2i"]["R@1"] + entry["i2t"]["R@1"]) / 2)
            topk = np.load(tmp_path / "topk" / f"{name}.{direction}.npz")
            assert topk["ids"].shape == (queries, 20) and topk["scores"].shape == (queries, 20)
    assert on_disk["retrievers"]["fused"]["spec"]["method"] == "dbsf"
    comparisons = on_disk["comparisons"]
    assert len(comparisons) == 2 * 2 * 3
    for c in comparisons:
        cand = on_disk["retrievers"][c["candidate"]][c["direction"]][f"R@{c['k']}"]
        base = on_disk["retrievers"][c["baseline"]][c["direction"]][f"R@{c['k']}"]
        assert c["gain"] == pytest.approx(cand - base)
        assert c["ci_low"] <= c["gain"] <= c["ci_high"] and c["cluster_ci_low"] <= c["cluster_ci_high"]
        assert c["gain"] == pytest.approx(100 * (c["wins"] - c["losses"]) / c["n_queries"])
    oracle = on_disk["oracle"]["t2i"]["R@1"]
    assert oracle >= max(on_disk["retrievers"][n]["t2i"]["R@1"] for n in ("sim_siglip2_like", "sim_dfn5b_like"))
    assert metrics == on_disk  # metrics.json is the run record, serialised
    assert RunRecord.from_json(on_disk).to_json() == on_disk
    assert "SIMULATED" in capsys.readouterr().out
    assert not list(tmp_path.glob(".staging-*"))


def test_sim_defaults_land_near_article_and_fusion_helps(compose_cfg, tmp_path):
    """The default job (COCO-sized sim): singles near the article's ~54-56 t2i R@1, fusion gains a few points."""
    metrics = run(compose_cfg(["eval.bootstrap.draws=200"]), str(tmp_path)).to_json()
    singles = [metrics["retrievers"][n]["t2i"]["R@1"] for n in ("sim_siglip2_like", "sim_dfn5b_like")]
    assert all(48 < s < 62 for s in singles)
    gain = metrics["retrievers"]["fused"]["t2i"]["R@1"] - max(singles)
    assert 0.5 < gain < 5


@pytest.mark.parametrize("overrides,fragment", [
    (["fusion.top_k=5"], "fusion.top_k=5 is below the largest eval.ks"),
    (["fusion.final_top_k=3"], "fusion.final_top_k=3 is below the largest eval.ks"),
    (["fusion.method=condorcet"], "valid: none, sum, minmax, zscore, isr, rrf, dbsf, l2, borda, rbc"),
    (["fusion.fuse_on=pixel"], "valid: document, source_object"),
    (["+fusion.colour=red"], "fusion: unknown key"),
    (["models=[]"], "no models selected"),
    (["eval.ks=[]"], "eval.ks"),
    (["eval.ks=[1,0]"], "eval.ks"),
    (["eval.save_topk=0"], "eval.save_topk"),
    (["eval.chunk_size=0"], "eval.chunk_size"),
    (["eval.bootstrap.draws=0"], "eval.bootstrap"),
    (["+models.fused.kind=sim"], "not allowed"),
])
def test_bad_config_fails_before_writing_anything(compose_cfg, tmp_path, overrides, fragment):
    with pytest.raises(FusebenchError, match=fragment):
        run(compose_cfg(SMALL_SIM + overrides), str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_bad_embeddings_leave_no_outputs_and_keep_earlier_results(compose_cfg, tmp_path, vectors_case):
    (img_a, txt_a), _ = vectors_case["files"]["A"], vectors_case["files"]["B"]
    base = ["dataset=manifest", f"dataset.manifest={vectors_case['manifest']}", "models=[]",
            "+models.a.kind=vectors", f"+models.a.image_embeddings={img_a}", f"+models.a.text_embeddings={txt_a}",
            "eval.bootstrap.draws=100"]
    out = tmp_path / "run"
    run(compose_cfg(base), str(out))
    before = (out / "metrics.json").read_bytes()
    bad = np.load(img_a)
    bad[3] = np.nan
    np.save(tmp_path / "bad.npy", bad)
    with pytest.raises(FusebenchError, match="row 3 contains NaN"):
        run(compose_cfg(base[:-3] + [f"+models.a.image_embeddings={tmp_path / 'bad.npy'}",
                                     f"+models.a.text_embeddings={txt_a}", "eval.bootstrap.draws=100"]), str(out))
    assert (out / "metrics.json").read_bytes() == before


def test_table_prints_published_numbers_beside_the_run(compose_cfg, tmp_path, capsys):
    cfg = compose_cfg(SMALL_SIM + ["+models.sim_siglip2_like.published.sim.t2i_r1=55.81",
                                   "+models.sim_siglip2_like.published.source=the article"])
    metrics = run(cfg, str(tmp_path)).to_json()
    out = capsys.readouterr().out
    ours = metrics["retrievers"]["sim_siglip2_like"]["t2i"]["R@1"]
    assert f"sim_siglip2_like t2i R@1: {ours:.2f} here, 55.81 published (the article)" in out
    cfg = compose_cfg(SMALL_SIM + ["+models.sim_dfn5b_like.published.sim={t2i_r1: 50.0, protocol: paper, source: P}"])
    run(cfg, str(tmp_path / "b"))
    assert "55.81" not in (out := capsys.readouterr().out) and "50.00 published (paper protocol, P)" in out
