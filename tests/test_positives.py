"""ECCV Caption and CxC extra positives: fusebench's per-query values against eccv_caption.Metrics, fed the same
ranked lists, on a corpus with the real COCO 5k test ids (and ten sixth captions outside the gallery)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.app.tracking import summary_metrics
from fusebench.data.corpus import Corpus
from fusebench.data.manifest import load_manifest
from fusebench.evaluation.positives import (
    data_dir,
    load_positives,
    map_at_r_values,
    positive_matrix,
    query_values,
    r_precision_values,
    summarise,
)
from fusebench.evaluation.record import RunRecord
from fusebench.report.notebook import positive_misses
from fusebench.report.runs import load_runs
from fusebench.report.table import format_table

eccv_caption = pytest.importorskip("eccv_caption", reason="eccv-caption is a dependency")


def coco_corpus(extra: int = 10, nonstandard: bool = False) -> Corpus:
    """The 5,000 test images and their 25,000 gallery captions by COCO id, plus ``extra`` sixth captions."""
    folder = data_dir()
    caption_to_image = json.loads((folder / "original_caption_to_image.json").read_text())
    image_ids = sorted({v[0] for v in caption_to_image.values()})
    index = {image: i for i, image in enumerate(image_ids)}
    caption_ids = [int(c) for c in np.load(folder / "coco_test_ids.npy")]
    caption_image = [index[caption_to_image[str(c)][0]] for c in caption_ids]
    caption_ids += [10_000_000 + i for i in range(extra)]  # not in the gallery
    caption_image += list(range(extra))
    order = np.argsort(caption_image, kind="stable")  # grouped by image, as a manifest lists them
    caption_ids, caption_image = [caption_ids[c] for c in order], [caption_image[c] for c in order]
    return Corpus(name="coco5k", image_ids=[str(i) for i in image_ids], captions=[""] * len(caption_ids),
                  caption_image=np.asarray(caption_image, dtype=np.int64), caption_ids=caption_ids,
                  meta={"nonstandard": nonstandard})


@pytest.fixture(scope="module")
def corpus():
    return coco_corpus()


def ranked(rng, n_queries: int, n_items: int, depth: int, favour: list[np.ndarray] | None = None) -> np.ndarray:
    """Random ranked lists; with ``favour``, each query's positives are pushed near the top (so metrics vary)."""
    out = np.empty((n_queries, depth), dtype=np.int64)
    for q in range(n_queries):
        reachable = favour[q][favour[q] >= 0] if favour is not None else np.array([], dtype=np.int64)
        head = rng.permutation(reachable)[: rng.integers(0, len(reachable) + 1)]
        rest = rng.choice(n_items, size=depth + len(head) + 5, replace=False)
        row = list(dict.fromkeys([*head, *rest]))[:depth]
        rng.shuffle(row[: min(len(row), 3 * len(head) + 1)])
        out[q] = row
    return out


@pytest.mark.slow  # against eccv_caption's own metrics (the fast tier keeps test_map_at_r_and_r_precision_by_hand)
@pytest.mark.parametrize("name", ["eccv", "cxc"])
def test_values_equal_eccv_caption_metrics(corpus, name):
    positives = load_positives(name, corpus)
    assert positives.left_out == 10
    if name == "eccv":  # the query sets the data defines
        assert (len(positives.t2i_queries), len(positives.i2t_queries)) == (1332, 1261)
    rng = np.random.default_rng(0)
    t2i = ranked(rng, len(positives.t2i_queries), corpus.n_images, 60, positives.t2i_sets)
    i2t = ranked(rng, len(positives.i2t_queries), corpus.n_captions, 80, positives.i2t_sets)
    i2t[:, 0] = np.flatnonzero(~positives.caption_gallery)[0]  # a sixth caption at rank 1: outside the gallery
    ours = {d: summarise(query_values(positives, d, lists, [1, 5, 10])) for d, lists in (("t2i", t2i), ("i2t", i2t))}

    images = [int(i) for i in corpus.image_ids]
    gallery = positives.caption_gallery
    t2i_items = {corpus.caption_ids[c]: [images[i] for i in row] for c, row in zip(positives.t2i_queries, t2i)}
    i2t_items = {images[i]: [corpus.caption_ids[c] for c in row if gallery[c]] for i, row in zip(positives.i2t_queries, i2t)}
    metrics = eccv_caption.Metrics()
    if name == "eccv":
        # the reference evaluates every query of its files: ours covers them all here
        theirs = metrics.eccv_metrics({"t2i": t2i_items, "i2t": i2t_items}, "all")
        for d in ("t2i", "i2t"):
            assert ours[d]["mAP@R"] == pytest.approx(100 * theirs["eccv_map_at_r"][d], abs=1e-9)
            assert ours[d]["R-P"] == pytest.approx(100 * theirs["eccv_rprecision"][d], abs=1e-9)
            assert ours[d]["R@1"] == pytest.approx(100 * theirs["eccv_r1"][d], abs=1e-9)
    else:
        for k in (1, 5, 10):
            theirs = metrics.cxc_recalls({"t2i": t2i_items, "i2t": i2t_items}, "all", K=k)
            for d in ("t2i", "i2t"):
                assert ours[d][f"R@{k}"] == pytest.approx(100 * theirs[d], abs=1e-9)


def test_map_at_r_and_r_precision_by_hand():
    # positives {a, b, c} (R = 3); ranked: a x b -> precisions at the hits 1/1, 2/3; mAP@R = (1 + 0 + 2/3) / 3
    hits = np.array([[True, False, True, False]])
    counts = np.array([3])
    assert map_at_r_values(hits, counts)[0] == pytest.approx((1 + 2 / 3) / 3)
    assert r_precision_values(hits, counts)[0] == pytest.approx(2 / 3)
    lists = np.array([[5, 9, 7, 3]])
    keep = np.ones(10, dtype=bool)
    keep[9] = False  # 9 is outside the gallery: the list reads 5 7 3
    assert positive_matrix(lists, [np.array([3, 7])], keep, 3).tolist() == [[False, True, True]]


def test_corpus_without_caption_ids_is_explained():
    corpus = coco_corpus()
    bare = Corpus(corpus.name, corpus.image_ids, corpus.captions, corpus.caption_image)
    with pytest.raises(FusebenchError, match="dataset_coco.json"):
        load_positives("eccv", bare)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_ids_the_corpus_lacks_name_the_file_unless_a_subset():
    corpus = coco_corpus(extra=0)
    keep = np.ones(corpus.n_images, dtype=bool)
    keep[:100] = False
    smaller, _, _ = corpus.without_images(~keep)
    with pytest.raises(FusebenchError, match=r"eccv_caption_to_image\.json: .* id \d+ is not in the corpus"):
        load_positives("eccv", smaller)
    smaller.meta["nonstandard"] = True
    positives = load_positives("eccv", smaller)
    assert positives.skipped > 0 and len(positives.t2i_queries) < 1332
    with pytest.raises(FusebenchError, match="valid: eccv, cxc"):
        load_positives("pm", corpus)


def coco_vectors(tmp_path, corpus: Corpus) -> list[str]:
    """A manifest of ``corpus`` (COCO ids, caption_ids) and two models' vectors whose rankings put related
    images near each other (a shared latent), as overrides for a run."""
    rng = np.random.default_rng(3)
    lines = []
    for i, image_id in enumerate(corpus.image_ids):
        caps = np.flatnonzero(corpus.caption_image == i)
        lines.append(json.dumps({"image_id": int(image_id), "captions": [f"c{c}" for c in caps],
                                 "caption_ids": [corpus.caption_ids[c] for c in caps]}))
    (tmp_path / "coco.jsonl").write_text("\n".join(lines) + "\n")
    order = np.arange(corpus.n_captions)  # coco_corpus lists captions image by image, as the manifest does
    z = rng.standard_normal((corpus.n_images, 6))
    overrides = ["dataset=manifest", f"dataset.manifest={tmp_path / 'coco.jsonl'}", "models=[]"]
    for name, noise in (("a", 1.0), ("b", 1.2)):
        proj = rng.standard_normal((6, 8))
        image = (z + 0.5 * rng.standard_normal(z.shape)) @ proj
        text = (z[corpus.caption_image[order]] + noise * rng.standard_normal((len(order), 6))) @ proj
        np.save(tmp_path / f"{name}_img.npy", image.astype(np.float32))
        np.save(tmp_path / f"{name}_txt.npy", text.astype(np.float32))
        overrides += [f"+models.{name}.kind=vectors", f"+models.{name}.image_embeddings={tmp_path / f'{name}_img.npy'}",
                      f"+models.{name}.text_embeddings={tmp_path / f'{name}_txt.npy'}"]
    return overrides


@pytest.mark.slow  # 5,000 images x 25,010 captions, two models and their fusion
def test_run_records_corrected_metrics_for_single_and_fused(compose_cfg, tmp_path):
    """eval.positives=[eccv,cxc] through a whole run: every retriever's block equals eccv_caption.Metrics fed the
    run's own saved lists (topk/, whole lists), and fused-vs-single comparisons exist for every metric."""
    from fusebench.app.pipeline import run

    corpus = coco_corpus()
    overrides = coco_vectors(tmp_path, corpus) + ["eval.positives=[eccv,cxc]", "eval.save_topk=null",
                                                  "eval.bootstrap.draws=200", "logger=none"]
    result = run(compose_cfg(overrides), str(tmp_path / "run"))
    record = result.to_json()
    assert (tmp_path / "run" / "plots" / "corrected_metrics.png").is_file()
    printed = format_table(result)
    assert "eccv positives (false negatives corrected; 1332 t2i / 1261 i2t queries" in printed
    assert "fused vs a  t2i mAP@R:" in printed
    summary = summary_metrics(result)
    assert summary["eccv/t2i/mAP@R"] == record["retrievers"]["fused"]["eccv"]["t2i"]["mAP@R"]
    assert "gain/cxc/i2t/R@5" in summary
    assert RunRecord.from_json(json.loads((tmp_path / "run" / "metrics.json").read_text())).positive_comparisons
    # the notebook's view: split "misses" whose first image is an ECCV positive, checked against the files
    runs, _ = load_runs(tmp_path / "run")
    manifest_corpus = load_manifest(tmp_path / "coco.jsonl")
    misses = positive_misses(runs[0], "eccv", "fused", "t2i", corpus=manifest_corpus)
    positives = load_positives("eccv", manifest_corpus)
    ranks = np.load(tmp_path / "run" / "ranks" / "fused.t2i.npy")
    t2i = np.load(tmp_path / "run" / "topk" / "fused.t2i.npz")["ids"]
    expected = [c for c, s in zip(positives.t2i_queries, positives.t2i_sets) if ranks[c] != 1 and t2i[c][0] in s]
    assert [m["caption_id"] for m in misses] == [manifest_corpus.caption_ids[c] for c in expected] and expected
    assert record["positives"]["eccv"] == {"t2i_queries": 1332, "i2t_queries": 1261, "captions_left_out": 10,
                                           "queries_not_in_corpus": 0, "positives_outside_gallery": 2}
    images = [int(i) for i in corpus.image_ids]
    i2t_rows = np.flatnonzero(np.bincount(corpus.caption_image, minlength=corpus.n_images) > 0)
    gallery = load_positives("eccv", corpus).caption_gallery
    metrics = eccv_caption.Metrics()
    for name in ("a", "b", "fused"):
        t2i = np.load(tmp_path / "run" / "topk" / f"{name}.t2i.npz")["ids"]
        i2t = np.load(tmp_path / "run" / "topk" / f"{name}.i2t.npz")["ids"]
        items = {"t2i": {corpus.caption_ids[c]: [images[i] for i in row if i >= 0] for c, row in enumerate(t2i)},
                 "i2t": {images[i]: [corpus.caption_ids[c] for c in row if c >= 0 and gallery[c]]
                         for i, row in zip(i2t_rows, i2t)}}
        theirs = metrics.eccv_metrics(items, "all")
        block = record["retrievers"][name]["eccv"]
        for d in ("t2i", "i2t"):
            assert block[d]["mAP@R"] == pytest.approx(100 * theirs["eccv_map_at_r"][d], abs=1e-9), (name, d)
            assert block[d]["R-P"] == pytest.approx(100 * theirs["eccv_rprecision"][d], abs=1e-9)
            assert block[d]["R@1"] == pytest.approx(100 * theirs["eccv_r1"][d], abs=1e-9)
        for k in (1, 5, 10):
            cxc = metrics.cxc_recalls(items, "all", K=k)
            for d in ("t2i", "i2t"):
                assert record["retrievers"][name]["cxc"][d][f"R@{k}"] == pytest.approx(100 * cxc[d], abs=1e-9)
    compared = {(c["candidate"], c["baseline"], c["direction"], c["metric"]) for c in record["positive_comparisons"]}
    assert ("fused", "a", "t2i", "eccv mAP@R") in compared and ("fused", "b", "i2t", "cxc R@10") in compared
    assert len(compared) == 2 * 2 * (3 + 3)  # 2 baselines x 2 directions x (ECCV 3 + CxC 3 metrics)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_positives_on_sim_are_explained(compose_cfg, tmp_path):
    from fusebench.app.pipeline import run

    with pytest.raises(FusebenchError, match="needs COCO ids"):
        run(compose_cfg(["eval.positives=[eccv]", "dataset.n_images=50", "dataset.n_captions=250", "logger=none"]),
            str(tmp_path / "run"))
    with pytest.raises(FusebenchError, match="eval.positives"):
        run(compose_cfg(["eval.positives=[pm]", "logger=none"]), str(tmp_path / "run"))
