"""How out of distribution the sim's caption queries are for an index built on its images (issue 41, item 3):
scripts/bench_sim_ood.py's measures against a slow reference (a FAISS IVF-Flat search), the calibrated preset's
ratio in its stated band, and dataset.caption_noise_decay changing nothing where it is left unset."""

import hashlib
import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.simulated import (
    distractor_latents,
    make_sim_corpus,
    sim_latents,
    sim_model_embeddings,
    sim_subtopics,
    spectrum,
    topic_world,
)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def bench():
    """scripts/bench_sim_ood.py as a module (it imports its sibling scripts by name, as when run)."""
    pytest.importorskip("faiss")
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("bench_sim_ood")
    finally:
        sys.path.remove(str(SCRIPTS))


def clustered_small(**changes):
    return SimDatasetConfig(n_images=300, n_captions=1500, structure="clustered", **changes)


# --- unset, caption_noise_decay changes nothing -------------------------------------------------------------------

def latents_digest(settings: SimDatasetConfig) -> tuple[str, str]:
    corpus = make_sim_corpus(settings)
    h = hashlib.sha256()
    images, captions = sim_latents(corpus)
    for rows in (images, captions, sim_subtopics(corpus),
                 *distractor_latents(0, 1, 0, images, 0.01, 0.8, topic_world(corpus))):
        h.update(np.ascontiguousarray(rows).tobytes())
    return h.hexdigest()[:16], corpus.content_digest()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("changes,digests", [
    # written by the simulator before caption_noise_decay existed (main at 25af949), sim_clustered's noise
    ({"caption_noise": 1.65, "shared_caption_noise": 0.36},
     ("1827627319091e64", "82716a99338ce58e8bfe71f3a55ef2f9b0ca8f77ffc2ed0268f386472914969c")),
    ({"split": "val"}, ("a08e49c725542232", "c72a807916c265840a9cba00d14b9f784cabfde71960fee4c73c532a4ff51e46")),
])
def test_unset_decay_draws_and_keys_as_before(changes, digests):
    """Latents (images, captions, sub-topics, a distractor block) and the content digest of a clustered corpus
    equal those written before the key existed; its meta (every store key's source) does not name it."""
    assert latents_digest(clustered_small(**changes)) == digests
    assert not any("decay" in key and key != "sim_spectrum_decay" for key in make_sim_corpus(clustered_small()).meta)


def test_a_set_decay_shapes_the_caption_noise_and_enters_the_keys():
    base, shaped = make_sim_corpus(clustered_small()), make_sim_corpus(clustered_small(caption_noise_decay=-2.0))
    assert shaped.meta["sim_caption_noise_decay"] == -2.0 and shaped.content_digest() != base.content_digest()
    images, captions = sim_latents(base)
    shaped_images, shaped_captions = sim_latents(shaped)
    assert np.array_equal(images, shaped_images)
    # the same draws, each dimension's noise scaled by the spectrum of decay -2 (variance rising with j)
    expected = images[base.caption_image] + (captions - images[base.caption_image]) * spectrum(64, -2.0).astype(np.float32)
    np.testing.assert_allclose(shaped_captions, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes,message", [
    ({"caption_noise_decay": -1.0}, "dataset.caption_noise_decay=-1.0 is never read with dataset.structure=isotropic"),
    ({"structure": "clustered", "caption_noise_decay": 9.0}, "dataset.caption_noise_decay=9.0 is not valid"),
])
def test_bad_caption_noise_decay_is_one_line(changes, message):
    with pytest.raises(FusebenchError) as err:
        SimDatasetConfig(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- the measures against a slow reference ----------------------------------------------------------------------

def test_lists_for_recall_is_the_smallest_nprobe_reaching_the_target(bench):
    ranks = np.array([[0, 1], [2, 5]])  # recall at nprobe n: the share of ranks < n
    assert [bench.lists_for_recall(ranks, t) for t in (0.25, 0.5, 0.75, 1.0)] == [1, 2, 3, 6]


def test_work_at_interpolates_log_linearly(bench):
    curve = [(10, 0.8, 100.0), (20, 0.9, 400.0)]
    assert bench.work_at(curve, 0.85) == pytest.approx(200.0)
    assert bench.work_at(curve, 0.7) == 100.0 and math.isnan(bench.work_at(curve, 0.95))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_list_ranks_give_the_recall_of_an_ivf_flat_search(bench):
    """Neighbour recall of FAISS IVF-Flat at nprobe n equals the share of exact neighbours whose list ranks < n."""
    import faiss  # heavy: only this test's

    rng = np.random.default_rng(0)
    base = rng.standard_normal((6000, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = np.ascontiguousarray(base[:200] + 0.5 * rng.standard_normal((200, 32)).astype(np.float32))
    ivf, assign = bench.train_ivf(base, 64, seed=0)
    ivf.add(base)
    exact = faiss.IndexFlatIP(32)
    exact.add(base)
    neighbours = exact.search(queries, 10)[1]
    ranks = bench.list_ranks(ivf.quantizer, assign, queries, neighbours)
    for nprobe in (1, 3, 8, 64):
        ivf.nprobe = nprobe
        found = ivf.search(queries, 10)[1]
        assert bench.neighbour_recall(found, neighbours) == pytest.approx(float(np.mean(ranks < nprobe)))
    target = float(np.mean(ranks < 5))
    assert bench.lists_for_recall(ranks, target) == 5


# --- the calibrated preset (docs/simulated.md, docs/search.md) ------------------------------------------------

def t2i_r1(settings: SimDatasetConfig, params) -> float:
    corpus = make_sim_corpus(settings)
    images, texts = sim_model_embeddings(corpus, params.dim, params.image_noise, params.text_noise, params.seed,
                                         params.score)
    return 100 * float(np.mean(np.argmax(texts @ images.T, axis=1) == corpus.caption_image))


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_calibrated_preset_is_further_out_of_distribution_at_the_same_r1(bench):
    """At 12,288 rows (nlist 512, 1,000 queries, recall@10 0.9) a caption query of sim_clustered_calibrated needs
    4-7 times the IVF lists an image query needs (sim_clustered: under 3.5; docs/search.md states both at 200,000
    rows), and the CLIP-like model's t2i R@1 stays within 3 points of sim_clustered's."""
    ratios, r1 = {}, {}
    for name in ("sim_clustered", "sim_clustered_calibrated"):
        settings = bench.dataset_preset(name)
        base, text_q, image_q = bench.rows(settings, 12288, 1000, bench.CLIP_LIKE, 0)
        lists = bench.measure(base, text_q, image_q, [10], [0.9], 0, None)["ivf"]["lists"]["10@0.9"]
        ratios[name] = lists["text"] / lists["image"]
        r1[name] = t2i_r1(settings, bench.CLIP_LIKE)
    assert ratios["sim_clustered"] < 3.5 and 4 <= ratios["sim_clustered_calibrated"] <= 7, ratios
    assert abs(r1["sim_clustered_calibrated"] - r1["sim_clustered"]) < 3, r1


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_calibrated_preset_is_sim_clustered_with_three_values(compose_cfg):
    from fusebench.app.run_config import run_config

    clustered = run_config(compose_cfg(["dataset=sim_clustered", "logger=none"])).dataset
    calibrated = run_config(compose_cfg(["dataset=sim_clustered_calibrated", "logger=none"])).dataset
    changed = {key for key in vars(clustered) if getattr(clustered, key) != getattr(calibrated, key)}
    assert changed == {"name", "subtopic_spread", "caption_noise_decay", "caption_noise"}
    assert (calibrated.subtopic_spread, calibrated.caption_noise_decay, calibrated.caption_noise) == (1.2, -2.0, 3.1)
