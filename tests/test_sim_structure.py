"""dataset.structure (issue 31, item 4): the isotropic default exactly as before, and the clustered option's
statistics as docs/simulated.md states them (cone, modality gap, topics), its galleries nesting, its refusals, and
IVF finding its neighbours with fewer lists than on the isotropic one."""

import json

import numpy as np
import pytest
from helpers.isotropic_sim import old_distractor_block, old_latents, old_model

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig
from fusebench.config.specs import SimParams
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import (
    DISTRACTOR_BLOCK,
    make_sim_corpus,
    modality_placement,
    sim_latents,
    sim_model_embeddings,
    sim_subtopics,
    spectrum,
)
from fusebench.encoders.simulated import _key, sim_distractor_rows

CLIP_LIKE = SimParams(dim=96, image_noise=0.24, text_noise=0.21, seed=2, score_scale=0.4, score_shift=0.12)
SIGLIP_LIKE = SimParams(dim=96, image_noise=0.22, text_noise=0.22, seed=1, score_scale=0.3, score_shift=0.0)
UNPLACED = SimParams(dim=96, image_noise=0.22, text_noise=0.22, seed=1)


def clustered(**changes):
    return make_sim_corpus(SimDatasetConfig(n_images=2000, n_captions=6000, structure="clustered", **changes))


def unit(rows):
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


# --- the isotropic default is what it was --------------------------------------------------------------------

@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_isotropic_default_rows_equal_the_old_formula():
    """Latents, each model's rows (placed or not) and distractor rows (relevance < 1 and = 1, across a block
    boundary): equal, bit for bit, to the simulator before structures existed (tests/helpers/isotropic_sim.py)."""
    settings = SimDatasetConfig(n_images=300, n_captions=1500, seed=2)
    corpus = make_sim_corpus(settings)
    images, captions = sim_latents(corpus)
    old_i, old_t = old_latents(2, 300, corpus.caption_image, 64, 1.3, 1.36)
    assert np.array_equal(images, old_i) and np.array_equal(captions, old_t)
    for params in (CLIP_LIKE, UNPLACED):
        new = sim_model_embeddings(corpus, params.dim, params.image_noise, params.text_noise, params.seed, params.score)
        old = old_model(2, old_i, old_t, params.dim, params.image_noise, params.text_noise, params.seed, params.score)
        assert all(np.array_equal(a, b) for a, b in zip(new, old))
    for relevance in (0.8, 1.0):
        gallery = GalleryConfig(kind="sim", size=DISTRACTOR_BLOCK + 500, seed=1, near_duplicate=None,
                                sim={"relevance": relevance})
        rows = sim_distractor_rows(CLIP_LIKE, corpus, gallery).read(DISTRACTOR_BLOCK - 100, DISTRACTOR_BLOCK + 500)
        old = np.vstack([old_distractor_block(2, 1, b, old_i, 0.01, 0.8, 2, 96, 0.24, (0.4, 0.12), relevance)
                         for b in (0, 1)])[DISTRACTOR_BLOCK - 100:DISTRACTOR_BLOCK + 500]
        assert np.array_equal(rows, old)


def test_isotropic_default_keys_are_unchanged():
    """The corpus meta (content digest, embedding and list keys) and the distractor key hold no structure key."""
    corpus = make_sim_corpus(SimDatasetConfig())
    assert corpus.meta == {"simulated": True, "sim_seed": 0, "sim_latent_dim": 64, "sim_caption_noise": 1.3,
                           "sim_shared_caption_noise": 1.36}
    assert _key(CLIP_LIKE, corpus) == json.dumps({
        "dim": 96, "image_noise": 0.24, "text_noise": 0.21, "seed": 2, "score": (0.4, 0.12), "sim_seed": 0,
        "sim_latent_dim": 64, "sim_caption_noise": 1.3, "sim_shared_caption_noise": 1.36, "n": [5000, 25010]},
        sort_keys=True)
    key = sim_distractor_rows(CLIP_LIKE, corpus, GalleryConfig(kind="sim", size=10, near_duplicate=None)).key
    assert key["version"] == 1 and key["corpus"] == {**{k: v for k, v in corpus.meta.items() if k != "simulated"},
                                                     "n_images": 5000, "n_captions": 25010}


def test_clustered_parameters_enter_every_key():
    base = clustered()
    assert base.meta["sim_structure"] == "clustered" and base.meta["sim_cone"] == 0.35
    for change in ({"cone": 0.3}, {"topics": 8}, {"own_spread": 0.5}, {"spectrum_decay": 0.5}):
        other = clustered(**change)
        assert other.content_digest() != base.content_digest()
        assert _key(CLIP_LIKE, other) != _key(CLIP_LIKE, base)
        gallery = GalleryConfig(kind="sim", size=10, near_duplicate=None)
        assert (sim_distractor_rows(CLIP_LIKE, other, gallery).key
                != sim_distractor_rows(CLIP_LIKE, base, gallery).key)


# --- the clustered option's statistics (docs/simulated.md) ----------------------------------------------------

def test_spectrum_decays_and_averages_one():
    sd = spectrum(64, 1.0)
    assert np.isclose((sd ** 2).mean(), 1.0) and np.all(np.diff(sd) < 0)
    assert np.allclose(sd[0] ** 2 / sd[9] ** 2, 10.0)
    assert np.allclose(spectrum(8, 0.0), 1.0)


def test_clustered_rows_sit_in_a_cone_with_a_modality_gap():
    """Image rows: mean pairwise cosine near dataset.cone (0.35); a model with no score placement: its centroids
    dataset.gap (0.8) apart; a placed model: the gap its placement implies, sqrt(cone + beta - 2 shift)."""
    corpus = clustered()
    for params, gap in ((UNPLACED, 0.8), (CLIP_LIKE, None), (SIGLIP_LIKE, None)):
        image, text = (unit(r) for r in sim_model_embeddings(corpus, params.dim, params.image_noise,
                                                               params.text_noise, params.seed, params.score))
        n = len(image)
        cosine = (image.sum(0) @ image.sum(0) - n) / (n * (n - 1))
        assert 0.3 < cosine < 0.45
        if gap is None:
            (scale, shift) = params.score
            beta = 1 - scale ** 2 / (1 - 0.35)
            gap = np.sqrt(0.35 + beta - 2 * shift)
        assert abs(np.linalg.norm(image.mean(0) - text.mean(0)) - gap) < 0.05
    assert 0.75 < np.linalg.norm(image.mean(0) - text.mean(0)) < 1.2  # SigLIP-like: a larger gap than CLIP-like


def test_placement_is_exactly_affine_so_rankings_are_the_unplaced_rows():
    """Every text-image cosine of a placed model is scale * the unplaced cosine + shift (its score placement, or
    1 - cone and cone - gap**2 / 2 with none)."""
    corpus = clustered(cone=0.3, gap=0.7)
    for params in (CLIP_LIKE, UNPLACED):
        image, text = sim_model_embeddings(corpus, params.dim, params.image_noise, params.text_noise, params.seed,
                                           params.score)
        content = unit(text[:50, :-2]) @ unit(image[:, :-2]).T  # the unplaced rows' cosines
        scale, shift = params.score or (0.7, 0.3 - 0.7 ** 2 / 2)
        assert np.allclose(text[:50] @ image.T, scale * content + shift, atol=2e-6)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_captions_nearest_images_are_mostly_of_its_topic():
    """With the preset's caption noise, 2,000 images: a caption's nearest image is of its topic most of the time,
    its 10 nearest over ten times chance (1/32), and an image's 10 nearest images mostly."""
    corpus = make_sim_corpus(SimDatasetConfig(n_images=2000, n_captions=2000, structure="clustered",
                                              caption_noise=1.65, shared_caption_noise=0.36))
    topic = sim_subtopics(corpus) // corpus.meta["sim_subtopics"]
    image, text = (unit(r) for r in sim_model_embeddings(corpus, UNPLACED.dim, UNPLACED.image_noise,
                                                           UNPLACED.text_noise, UNPLACED.seed, None))
    nearest = np.argsort(-(text[:1000] @ image.T), axis=1)[:, :10]
    same = topic[nearest] == topic[corpus.caption_image[:1000], None]
    assert same[:, 0].mean() > 0.7 and same.mean() > 10 / 32
    nearest = np.argsort(-(image[:1000] @ image.T), axis=1)[:, 1:11]
    assert (topic[nearest] == topic[:1000, None]).mean() > 0.6
    with pytest.raises(FusebenchError, match="isotropic sim corpus has no topics"):
        sim_subtopics(make_sim_corpus(SimDatasetConfig(n_images=10, n_captions=10)))


def test_clustered_galleries_nest_and_follow_the_structure():
    corpus = clustered()
    small = sim_distractor_rows(CLIP_LIKE, corpus, GalleryConfig(kind="sim", size=3000, near_duplicate=None))
    large = sim_distractor_rows(CLIP_LIKE, corpus, GalleryConfig(kind="sim", size=6000, near_duplicate=None))
    rows = small.read(0, 3000)
    assert np.array_equal(rows, large.read(0, 3000)) and rows.shape == (3000, 98)
    n = len(rows)
    cosine = (rows.sum(0) @ rows.sum(0) - n) / (n * (n - 1))
    assert 0.25 < cosine < 0.45  # the test images' cone (the off-caption part of most distractors widens it a little)
    assert np.allclose(rows[:, -2:], [np.sqrt(0.35), 0.0], atol=1e-6)  # the images' common direction


# --- refusals ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes,message", [
    ({"structure": "gaussian"}, "dataset.structure='gaussian' is not valid; valid: isotropic, clustered."),
    ({"structure": "clustered", "topics": 0}, "dataset.topics=0 is not valid; valid: an integer >= 1"),
    ({"structure": "clustered", "topic_spread": -1.0}, "dataset.topic_spread=-1.0 is not valid"),
    ({"structure": "clustered", "own_spread": 0.0}, "dataset.own_spread=0.0 is not valid; valid: a finite number > 0"),
    ({"structure": "clustered", "spectrum_decay": float("nan")}, "dataset.spectrum_decay=nan is not valid"),
    ({"structure": "clustered", "cone": 1.0}, "dataset.cone=1.0 is not valid; valid: a finite number > 0 and < 1"),
    ({"structure": "clustered", "cone": 0.25, "gap": 1.2}, "dataset.gap=1.2 is not valid; valid: a finite number >= 0 "
                                                           "and <= 1.0 (at most 2 * sqrt(dataset.cone) = 1)"),
    ({"topics": 8}, "dataset.topics=8 is never read with dataset.structure=isotropic"),
    ({"cone": 0.2}, "dataset.cone=0.2 is never read with dataset.structure=isotropic"),
])
def test_bad_structure_settings_are_one_line(changes, message):
    with pytest.raises(FusebenchError) as err:
        SimDatasetConfig(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_score_placement_the_cone_cannot_hold_is_refused():
    assert modality_placement(0.35, 0.8, (0.4, 0.12))[0] == (0.65, 0.0)
    with pytest.raises(FusebenchError, match=r"score_scale=0.9 and score_shift=0.0 do not fit dataset.cone=0.35"):
        modality_placement(0.35, 0.8, (0.9, 0.0))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_preset_selects_the_clustered_structure(compose_cfg):
    from fusebench.app.run_config import run_config

    dataset = run_config(compose_cfg(["dataset=sim_clustered", "logger=none"])).dataset
    assert dataset.structure == "clustered" and dataset.name == "sim_clustered"
    assert run_config(compose_cfg(["logger=none"])).dataset == SimDatasetConfig()


# --- what an index sees ------------------------------------------------------------------------------------------

@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_ivf_finds_clustered_neighbours_with_fewer_lists():
    """IVF-Flat (64 lists, 4 visited) over 16k gallery rows: neighbour recall@20 of caption queries is far
    higher on the clustered structure than on the isotropic one, whose neighbours spread over every list."""
    faiss = pytest.importorskip("faiss")
    recall = {}
    for structure in ("isotropic", "clustered"):
        corpus = make_sim_corpus(SimDatasetConfig(n_images=1000, n_captions=1000, structure=structure))
        _, text = sim_model_embeddings(corpus, CLIP_LIKE.dim, CLIP_LIKE.image_noise, CLIP_LIKE.text_noise,
                                       CLIP_LIKE.seed, CLIP_LIKE.score)
        gallery = GalleryConfig(kind="sim", size=4 * DISTRACTOR_BLOCK, near_duplicate=None)
        base = np.ascontiguousarray(sim_distractor_rows(CLIP_LIKE, corpus, gallery).read(0, gallery.size))
        queries = np.ascontiguousarray(unit(text[:300]))
        flat = faiss.IndexFlatIP(base.shape[1])
        flat.add(base)
        exact = flat.search(queries, 20)[1]
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(base.shape[1]), base.shape[1], 64, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.seed = 0
        ivf.train(base)
        ivf.add(base)
        ivf.nprobe = 4
        found = ivf.search(queries, 20)[1]
        recall[structure] = np.mean([len(np.intersect1d(a, b)) / 20 for a, b in zip(found, exact)])
    assert recall["clustered"] > 0.6 and recall["clustered"] > recall["isotropic"] + 0.3, recall
