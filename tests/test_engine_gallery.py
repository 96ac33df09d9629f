"""The embedded engines over a gallery (``search=lancedb|milvus|qdrant gallery=sim``): the rows they load are the
gallery's, block by block, in its index order (against the rows read whole); a flat engine's lists over the test
images and the distractors are the exact gallery lists; an engine asked for more than it holds is refused before
any work, with the measurement and the server form."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.backends import base
from fusebench.backends.engine_steps import GalleryRows, item_blocks


class _Distractors:
    """Distractor rows as the gallery gives them (``n``, ``read(start, stop)``, ``key``), counting the reads."""

    def __init__(self, rows: np.ndarray):
        self.rows, self.n, self.key, self.reads = rows, len(rows), {"source": "test"}, []

    def read(self, start: int, stop: int) -> np.ndarray:
        self.reads.append((start, stop))
        return np.ascontiguousarray(self.rows[start:stop])


@pytest.mark.parametrize("size", [1, 5, 7, 13, 40, 1000])
@pytest.mark.parametrize("tile", [7, 16, 64])
def test_item_blocks_are_the_gallery_rows_in_index_order(size, tile):
    rng = np.random.default_rng(size * 100 + tile)
    image = {m: rng.standard_normal((23, d)).astype(np.float32) for m, d in (("a", 6), ("b", 4))}
    extra = {m: rng.standard_normal((58, x.shape[1])).astype(np.float32) for m, x in image.items()}
    whole = {m: np.concatenate([image[m], extra[m]]) for m in image}  # the obvious way: every row at once
    sources = {"a": GalleryRows(image["a"], _Distractors(extra["a"]), tile), "b": whole["b"]}  # a gallery, an array
    got = {m: [] for m in whole}
    expected_start = 0
    for start, stop, block in item_blocks(sources, size):
        assert start == expected_start and stop == min(start + size, 81)
        for m, rows in block.items():
            assert rows.dtype == np.float32 and rows.flags.c_contiguous and len(rows) == stop - start
            got[m].append(rows)
        expected_start = stop
    assert expected_start == 81
    for m in whole:
        np.testing.assert_array_equal(np.concatenate(got[m]), whole[m])
    reads = sources["a"].distractors.reads  # each distractor row read once, in order: never the source whole
    assert sum(b - a for a, b in reads) == 58 and all(b - a <= tile for a, b in reads)


def _job(compose_cfg, tmp_path: Path, engine: str, preset: str, *extra: str) -> dict:
    from fusebench.app.pipeline import run

    cfg = compose_cfg(["dataset=sim", "dataset.n_images=120", "dataset.n_captions=240", "gallery=sim",
                       "gallery.size=900", "gallery.near_duplicate=null", f"search={engine}", f"fusion={preset}", "fusion.top_k=20",
                       "eval.lists.depth=20", "search.latency_queries=2", "logger=none", "plots=false",
                       "eval.bootstrap.draws=50", f"paths.output_dir={tmp_path}",
                       f"embed.cache.dir={tmp_path / 'cache'}", *extra])
    run(cfg, str(tmp_path / "run"))
    return json.loads((tmp_path / "run" / "metrics.json").read_text())


ENGINES = [("lancedb", "lancedb_rrf"), ("milvus", "milvus_rrf"), ("qdrant", "qdrant_rrf")]


@pytest.mark.slow
@pytest.mark.parametrize("engine,preset", ENGINES)
def test_flat_engine_over_a_gallery_gives_the_exact_gallery_lists(compose_cfg, tmp_path, engine, preset):
    """The engine holds the 120 test images and 900 distractors: each model's t2i list is the exact gallery list
    (neighbour recall 1 against the exact path's, which ranks distractors), and its fused list the preset's."""
    pytest.importorskip({"lancedb": "lancedb", "milvus": "milvus_lite", "qdrant": "qdrant_client"}[engine])
    record = _job(compose_cfg, tmp_path, engine, preset)
    search = record["search"]
    assert record["gallery"]["kind"] == "sim" and record["gallery"]["distractors"] == 900
    assert any("gallery: t2i over the test images and every distractor (1,020 items)" in n for n in search["notes"])
    for model, directions in search["models"].items():
        for direction, quality in directions.items():
            assert quality["neighbour_recall"] == pytest.approx(1.0), (model, direction)
    assert search["parity"]["t2i"]["identical_top1"] == pytest.approx(1.0)
    fused, exact = record["retrievers"]["fused"]["t2i"], record["retrievers"]["exact_fused"]["t2i"]
    assert fused["R@1"] == pytest.approx(exact["R@1"])
    # the distractors compete: the gallery's R@1 is below the test split's alone
    alone = _job(compose_cfg, tmp_path / "alone", engine, preset, "gallery=none", "gallery.size=0")
    assert alone["retrievers"]["fused"]["t2i"]["R@1"] > fused["R@1"]


@pytest.mark.slow
def test_ivf_engine_over_a_gallery_is_approximate_and_measured(compose_cfg, tmp_path):
    """An index over the gallery: its neighbour recall against the exact gallery lists is measured, not assumed."""
    pytest.importorskip("milvus_lite")
    record = _job(compose_cfg, tmp_path, "milvus", "milvus_rrf", "search.index=ivf_flat", "search.nlist=16",
                  "search.nprobe=2")
    recall = [q["t2i"]["neighbour_recall"] for q in record["search"]["models"].values()]
    assert all(0.2 < r < 1.0 for r in recall)
    assert record["search"]["engine"]["t2i"]["build_seconds"] > 0


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("engine", ["milvus", "qdrant"])
def test_engine_past_its_capacity_refused_before_any_work(compose_cfg, tmp_path, engine):
    """The config's distractors alone past the engine's measured capacity: one line naming the measurement and
    the server form; nothing embedded or written."""
    from fusebench.app.run_config import run_config

    cap = base.get(engine).capacity
    preset = dict(ENGINES)[engine]
    cfg = compose_cfg(["dataset=sim", "gallery=sim", f"gallery.size={cap.items + 1}", f"search={engine}",
                       f"fusion={preset}", "logger=none", f"paths.output_dir={tmp_path}"])
    with pytest.raises(FusebenchError) as err:
        run_config(cfg)
    message = str(err.value)
    assert "\n" not in message and f"{cap.items:,}" in message and cap.server in message and "measured" in message
    assert not list(tmp_path.rglob("*"))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_capacity_counts_the_test_images_too(compose_cfg, tmp_path):
    """Distractors within the capacity but the whole gallery past it: refused once the corpus is read, before any
    embedding work (the pipeline's check, with the test images)."""
    from fusebench.app.pipeline import run

    stock = base.get("qdrant")
    base.REGISTRY.unregister("qdrant")
    base.REGISTRY.register(replace(stock, capacity=base.Capacity(items=1000, measured="a test's", server="Qdrant server")))
    try:
        _refused_past_capacity(compose_cfg, tmp_path, run)
    finally:
        base.REGISTRY.unregister("qdrant")
        base.REGISTRY.register(stock)


def _refused_past_capacity(compose_cfg, tmp_path, run):
    cfg = compose_cfg(["dataset=sim", "dataset.n_images=200", "dataset.n_captions=400", "gallery=sim",
                       "gallery.size=900", "gallery.near_duplicate=null", "search=qdrant", "fusion=qdrant_rrf", "logger=none",
                       "plots=false",
                       f"paths.output_dir={tmp_path}", f"embed.cache.dir={tmp_path / 'cache'}"])
    with pytest.raises(FusebenchError, match=r"200 images and 900 distractors, 400 captions \(1,100 items in one collection\) "
                                             r"is past the 1,000 its embedded form serves.*valid: gallery.size at most 800.*Qdrant server"):
        run(cfg, str(tmp_path / "run"))
    assert not list(tmp_path.rglob("*.npy")) and not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_document_collection_counts_a_point_per_model(compose_cfg, tmp_path):
    """fuse_on=document holds each model's vector as its own point: half the capacity in distractors is past it with
    two models, and within it as one point per image."""
    from fusebench.app.run_config import run_config

    cap = base.get("qdrant").capacity.items
    assert base.engine_points(100, 400, 2, False) == 400 and base.engine_points(500, 400, 3, True) == 1500
    common = ["dataset=sim", "gallery=sim", f"gallery.size={cap // 2 + 1}", "search=qdrant", "fusion=qdrant_rrf",
              "logger=none", f"paths.output_dir={tmp_path}"]
    assert run_config(compose_cfg(common)).gallery.size == cap // 2 + 1
    with pytest.raises(FusebenchError, match=rf"\({cap + 2:,} items in one collection\).*valid: gallery.size well "
                                             rf"under {cap // 2:,}"):
        run_config(compose_cfg(common + ["fusion.fuse_on=document"]))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_lancedb_has_no_capacity_and_takes_the_million_image_study(compose_cfg, tmp_path):
    """LanceDB keeps its table on disk: measured at 1,001,000 items (2.1-3.1 GB peak), it has no capacity, so the
    study's largest gallery is accepted when the config is checked."""
    from fusebench.app.run_config import run_config

    assert base.get("lancedb").capacity is None
    config = run_config(compose_cfg(["dataset=sim_clustered", "gallery=sim", "gallery.size=1000000",
                                     "search=lancedb_ivf_pq", "logger=none", f"paths.output_dir={tmp_path}"]))
    assert config.search.refine_factor == 4 and config.fusion.preset == "lancedb_rrf"
