"""The gallery group: its options compose, every key is checked, and what cannot run is refused before any work."""

from dataclasses import asdict

import pytest
from helpers.tiers import fast_first
from omegaconf import OmegaConf

from fusebench import FusebenchError
from fusebench.app.run_config import run_config
from fusebench.config.gallery import GALLERY_KINDS, GalleryConfig
from fusebench.data.distractor_items import check_no_overlap, check_size, seeded_order, with_distractors
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import make_sim_corpus


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_default_job_has_no_distractors(compose_cfg):
    cfg = compose_cfg()
    assert OmegaConf.to_container(cfg.gallery) == asdict(GalleryConfig())
    assert not run_config(cfg).gallery.active


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("kind", fast_first(GALLERY_KINDS))
def test_every_kind_has_an_option(compose_cfg, kind):
    cfg = compose_cfg([f"gallery={kind}"])
    assert cfg.gallery.kind == kind


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("overrides, message", fast_first([  # a composition each: the fast tier keeps one
    (["gallery=sim", "gallery.size=-1"], "gallery.size=-1 is not valid"),
    (["gallery=sim", "gallery.near_duplicate=2"], "gallery.near_duplicate=2"),
    (["gallery=sim", "gallery.shard_size=0"], "gallery.shard_size=0"),
    (["gallery=sim", "gallery.sim.hard_fraction=1.5"], "gallery.sim.hard_fraction=1.5"),
    (["gallery=folder"], "gallery=folder needs gallery.source"),
    (["gallery=vectors"], "gallery=vectors needs gallery.vectors"),
    (["gallery=vectors", "dataset=tiny", "+gallery.vectors.bogus=/x"], "not a model: bogus"),
    (["gallery=sim", "dataset=tiny"], "gallery=sim simulates distractors of a simulated corpus"),
    (["gallery=folder", "gallery.source=/x"], "gallery=folder holds real images, but dataset=sim"),
    (["gallery=sim", "fusion.top_k=null"], "fusion.top_k=null fuses whole rankings"),
    (["gallery=sim", "tune=weights"], "tune=weights with distractors is not supported"),
    (["gallery=none", "gallery.size=5"], "gallery.size=5 needs a source"),
    # a setting the chosen kind never reads is refused, naming the kinds that read it
    (["gallery=sim", "gallery.source=/x"], "gallery.source='/x' is never read with gallery.kind=sim"),
    (["gallery.near_duplicate=0.5"], "gallery.near_duplicate=0.5 is never read with gallery.kind=none"),
    (["gallery=none", "gallery.seed=3"], "gallery.seed is read with every gallery.kind but none"),
    (["gallery=folder", "gallery.source=/x", "gallery.sim.closeness=0.5"],
     "gallery.sim.closeness=0.5 is never read with gallery.kind=folder"),
    (["gallery=sim", "gallery.shard=2"], "gallery.shard is read only with gallery.kind=folder | webdataset | paths"),
    (["gallery=sim", "gallery.shard_size=50"], "gallery.shard_size=50 is never read with gallery.kind=sim"),
    (["gallery=vectors", "dataset=tiny", "+gallery.vectors.a=/x", "gallery.source=/y"],
     "gallery.source='/y' is never read with gallery.kind=vectors"),
], unpack=True))
def test_a_gallery_mistake_is_one_line_naming_the_key(compose_cfg, overrides, message):
    with pytest.raises(FusebenchError) as err:
        run_config(compose_cfg(overrides))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("overrides", fast_first([
    ["gallery=sim", "gallery.size=0", "gallery.near_duplicate=0.9"],  # a sweep's size 0 keeps the kind's settings
    ["gallery=sim", "gallery.near_duplicate=null", "gallery.seed=2"],
    ["gallery=none", "gallery.near_duplicate=null"],  # null is unset
    ["gallery=folder", "dataset=tiny", "gallery.source=/x", "gallery.shard_size=50", "gallery.near_duplicate=0.9"],
]))
def test_settings_the_kind_reads_are_accepted(compose_cfg, overrides):
    run_config(compose_cfg(overrides))


def test_sizes_nest_and_one_seed_one_order():
    order = seeded_order(1000, 3)
    assert sorted(order) == list(range(1000))
    assert (order == seeded_order(1000, 3)).all() and not (order == seeded_order(1000, 4)).all()


def test_size_and_overlap_checks_name_what_is_wrong():
    with pytest.raises(FusebenchError, match="gallery.size=11 but src holds 10 distractor images"):
        check_size(11, 10, "src")
    with pytest.raises(FusebenchError, match="'b'"):
        check_no_overlap(["a", "b"], ["c", "b"], "src")


def test_distractors_join_after_the_test_images_and_ask_no_query():
    corpus = make_sim_corpus(SimDatasetConfig(n_images=4, n_captions=8))
    extended = with_distractors(corpus, ["d0", "d1", "d2"], {"gallery_size": 3})
    assert extended.image_ids[:4] == corpus.image_ids and extended.image_ids[4:] == ["d0", "d1", "d2"]
    assert (extended.caption_image == corpus.caption_image).all()
    assert list(extended.i2t_query_images) == [0, 1, 2, 3]
    assert extended.summary()["n_images_without_captions"] == 3 and extended.meta["gallery_size"] == 3


def test_kept_rows_read_the_kept_positions_in_bounded_windows():
    import numpy as np

    from fusebench.encoders.distractors import ArrayRows, KeptRows

    class Counting(ArrayRows):
        widest = 0

        def read(self, start, stop):
            Counting.widest = max(Counting.widest, stop - start)
            return super().read(start, stop)

    rows = np.random.default_rng(0).standard_normal((50_000, 4)).astype(np.float32)
    base = Counting(rows)
    keep = np.array([0, 1, 7, 30_000, 30_001, 49_999])
    kept = KeptRows(base, keep)
    assert (kept.read(0, 6) == base.rows[keep]).all() and (kept.read(2, 5) == base.rows[keep[2:5]]).all()
    assert Counting.widest <= 1024  # never the whole span between the first and last kept rows
    assert kept.read(6, 6).shape == (0, 4)
