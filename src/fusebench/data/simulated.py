"""A seeded synthetic corpus for the ``sim`` dataset and the ``sim`` model kind.

Every image has a latent vector; each caption is its image's latent plus caption noise (what the caption
leaves out or adds, shared by all models). A simulated model sees each image and caption through its own
noise and its own random projection to its own dimension, so two models make partly independent errors
and fusing them can help, as with real models. Nothing here is real data: outputs are labelled simulated.

Simulated distractors (``gallery=sim``) follow the same path: each has a latent (:func:`distractor_latents`, drawn
in seeded blocks so galleries nest), and every model sees it through its own noise and projection and places its
scores as for its test images (:func:`seen_latents`, :func:`image_rows`); most of them lie partly outside what
captions describe (:func:`off_caption_rows`).
"""

from __future__ import annotations

import numpy as np

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus, validate_corpus
from fusebench.data.kinds.sim import SIM_RECORDED_WHEN_SET, SIM_STRUCTURE_READS, SimDatasetConfig


def caption_counts(n_images: int, n_captions: int) -> np.ndarray:
    """Spread ``n_captions`` over ``n_images`` as evenly as possible, extra captions on the first images
    (COCO 5k: 5,000 images, 25,010 captions -> ten images get a sixth caption)."""
    if n_images < 1 or n_captions < 1:
        raise FusebenchError(f"sim dataset needs n_images >= 1 and n_captions >= 1, got {n_images} and {n_captions}.")
    base, extra = divmod(n_captions, n_images)
    counts = np.full(n_images, base, dtype=np.int64)
    counts[:extra] += 1
    return counts


def make_sim_corpus(settings: SimDatasetConfig) -> Corpus:
    """The simulated corpus ``settings`` describe (``SimDatasetConfig()``: COCO 5k-sized, the default job's)."""
    name, n_images, n_captions, seed = settings.name, settings.n_images, settings.n_captions, settings.seed
    latent_dim, caption_noise, shared_caption_noise = (settings.latent_dim, settings.caption_noise,
                                                       settings.shared_caption_noise)
    counts = caption_counts(n_images, n_captions)
    caption_image = np.repeat(np.arange(n_images, dtype=np.int64), counts)
    rank_in_image = np.arange(n_captions) - np.repeat(np.cumsum(counts) - counts, counts)
    val = settings.split != "test"
    corpus = Corpus(
        name=name,
        image_ids=[f"sim{'val' if val else ''}{i:06d}" for i in range(n_images)],
        captions=[f"simulated {'val ' if val else ''}caption {r + 1} of image {i}"
                  for i, r in zip(caption_image, rank_in_image)],
        caption_image=caption_image,
        image_paths=None,
        meta={"simulated": True, "sim_seed": int(seed), "sim_latent_dim": int(latent_dim),
              "sim_caption_noise": float(caption_noise), "sim_shared_caption_noise": float(shared_caption_noise),
              **({"sim_split": settings.split} if val else {}), **structure_meta(settings)},
        kind="sim",
    )
    return validate_corpus(corpus, "sim dataset")


def require_sim_corpus(corpus: Corpus) -> None:
    """Sim models simulate embeddings of a sim corpus only."""
    if not corpus.meta.get("simulated"):
        raise FusebenchError(
            f"model kind 'sim' needs dataset=sim (it simulates embeddings of a synthetic corpus); "
            f"dataset {corpus.name!r} is real data: use kind 'vectors' or a real encoder."
        )


def structure_meta(settings: SimDatasetConfig) -> dict:
    """What a corpus records of its structure: nothing for ``isotropic`` (its keys and digests stay as they were
    before structures existed), else ``sim_structure`` and every parameter the structure reads."""
    if settings.structure == "isotropic":
        return {}
    return {"sim_structure": settings.structure,
            **{f"sim_{key}": getattr(settings, key) for key in SIM_STRUCTURE_READS[settings.structure]
               if key not in SIM_RECORDED_WHEN_SET or getattr(settings, key) != SIM_RECORDED_WHEN_SET[key]}}


def sim_split(corpus: Corpus) -> str:
    """The corpus's ``dataset.split``: ``test`` unless it records another (a test corpus's keys and digests stay as
    they were before splits existed)."""
    return str(corpus.meta.get("sim_split", "test"))


SPLIT_STREAM = {"test": (), "val": (6,)}  # what each split's generators add to their seeds: independent draws


def sim_structure(corpus: Corpus) -> str:
    """The corpus's ``dataset.structure``: ``isotropic`` unless it records another."""
    return str(corpus.meta.get("sim_structure", "isotropic"))


def spectrum(latent_dim: int, decay: float) -> np.ndarray:
    """Per-dimension standard deviations (float64) whose variances fall as (j + 1) ** -decay and average 1 (an
    isotropic latent's), so a clustered latent's variance is concentrated in its first dimensions."""
    variance = np.arange(1, latent_dim + 1, dtype=np.float64) ** -float(decay)
    return np.sqrt(variance / variance.mean())


def topic_world(corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """A clustered corpus's sub-topic centres ((topics x subtopics, L) float32: each its topic's centre, sd
    ``topic_spread``, plus its own offset, sd ``subtopic_spread``; sub-topic ``k`` belongs to topic ``k //
    subtopics``) and the sd of an image's own part around its centre (``own_spread``, (L,) float32), all shaped by
    :func:`spectrum`. A pure function of the corpus seed and parameters: the test split and every distractor are
    drawn around the same centres."""
    m = corpus.meta
    dim, topics, subtopics = int(m["sim_latent_dim"]), int(m["sim_topics"]), int(m["sim_subtopics"])
    sd = spectrum(dim, m["sim_spectrum_decay"])
    rng = np.random.default_rng([int(m["sim_seed"]), 5])
    topic = rng.standard_normal((topics, dim)) * (float(m["sim_topic_spread"]) * sd)
    offset = rng.standard_normal((topics * subtopics, dim)) * (float(m["sim_subtopic_spread"]) * sd)
    centres = np.repeat(topic, subtopics, axis=0) + offset
    return centres.astype(np.float32), (float(m["sim_own_spread"]) * sd).astype(np.float32)


def clustered_draw(rng: np.random.Generator, n: int, world: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``n`` latents drawn around ``world``'s sub-topic centres (:func:`topic_world`): each a uniformly chosen
    sub-topic's centre plus its own part; returns (latents (n, L) float32, sub-topic of each (n,) int64)."""
    centres, own = world
    subtopic = rng.integers(0, len(centres), n)
    latents = centres[subtopic] + own * rng.standard_normal((n, len(own)), dtype=np.float32)
    return latents, subtopic


def _image_latents(corpus: Corpus, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    if sim_structure(corpus) == "isotropic":
        return rng.standard_normal((corpus.n_images, int(corpus.meta["sim_latent_dim"])), dtype=np.float32), None
    return clustered_draw(rng, corpus.n_images, topic_world(corpus))


def _latents(corpus: Corpus) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    require_sim_corpus(corpus)
    rng = np.random.default_rng([int(corpus.meta["sim_seed"]), 0, *SPLIT_STREAM[sim_split(corpus)]])
    dim = int(corpus.meta["sim_latent_dim"])
    images, subtopics = _image_latents(corpus, rng)
    noise = rng.standard_normal((corpus.n_captions, dim), dtype=np.float32)
    # what every caption of an image misses alike (shared), then what each caption adds or misses on its own
    shared = rng.standard_normal((corpus.n_images, dim), dtype=np.float32)
    decay = float(corpus.meta.get("sim_caption_noise_decay", 0.0))
    if decay != 0:  # caption noise shaped across the latent dimensions (recorded only when set: draws as before)
        shape = spectrum(dim, decay).astype(np.float32)
        noise *= shape
        shared *= shape
    captions = (images + np.float32(corpus.meta["sim_shared_caption_noise"]) * shared)[corpus.caption_image]
    captions += np.float32(corpus.meta["sim_caption_noise"]) * noise
    return images, captions, subtopics


def sim_latents(corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """The shared latents of a sim corpus: (image latents (N, L), caption latents (Q, L)), float32. Caption noise
    is isotropic in both structures (what a caption misses is not shaped like what images vary in), unless a
    clustered corpus sets ``caption_noise_decay`` (its variance along dimension j then ~ (j + 1) ** -decay)."""
    images, captions, _ = _latents(corpus)
    return images, captions


def sim_subtopics(corpus: Corpus) -> np.ndarray:
    """Each test image's sub-topic in a clustered corpus (its topic: ``// dataset.subtopics``)."""
    if sim_structure(corpus) == "isotropic":
        raise FusebenchError("an isotropic sim corpus has no topics (dataset.structure=clustered has).")
    return _latents(corpus)[2]


def _check_score(scale: float, shift: float) -> None:
    if not 0 < scale <= 1 or abs(shift) > 1 - scale + 1e-12:
        raise FusebenchError(f"sim model: score_scale={scale} and score_shift={shift} are not valid; valid: 0 < "
                             "score_scale <= 1 and |score_shift| <= 1 - score_scale.")


def score_location_images(image: np.ndarray, scale: float, shift: float) -> np.ndarray:
    """The image side of :func:`with_score_location`: v' = [sqrt(a) v / |v|, sqrt(1 - a), 0] (float32)."""
    _check_score(scale, shift)
    image = image / np.linalg.norm(image, axis=1, keepdims=True)
    rest = np.sqrt(1.0 - scale)
    image_extra = np.tile(np.array([rest, 0.0], dtype=np.float32), (len(image), 1))
    return np.hstack([np.float32(np.sqrt(scale)) * image, image_extra]).astype(np.float32, copy=False)


def score_location_texts(text: np.ndarray, scale: float, shift: float) -> np.ndarray:
    """The text side of :func:`with_score_location`: u' = [sqrt(a) u / |u|, sqrt(1 - a) (cos f, sin f)]."""
    _check_score(scale, shift)
    text = text / np.linalg.norm(text, axis=1, keepdims=True)
    rest = np.sqrt(1.0 - scale)
    angle = 0.0 if rest == 0 else float(np.arccos(np.clip(shift / (1.0 - scale), -1.0, 1.0)))
    text_extra = np.tile(np.array([rest * np.cos(angle), rest * np.sin(angle)], dtype=np.float32), (len(text), 1))
    return np.hstack([np.float32(np.sqrt(scale)) * text, text_extra]).astype(np.float32, copy=False)


def with_score_location(image: np.ndarray, text: np.ndarray, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose cosines are ``scale * cosine + shift`` of the given rows' cosines, exactly (two more dims).

    With unit rows u (text) and v (image): u' = [sqrt(a) u, sqrt(1 - a) (cos f, sin f)] and
    v' = [sqrt(a) v, sqrt(1 - a) (1, 0)], so u'.v' = a u.v + (1 - a) cos f: scale a in (0, 1], shift in
    [-(1 - a), 1 - a]. Every query's ranking is unchanged (a positive affine map); only where the scores sit,
    and how spread they are, changes: what raw-score fusion (sum) sees and normalising fusions undo."""
    return score_location_images(image, scale, shift), score_location_texts(text, scale, shift)


def modality_placement(cone: float, gap: float, score: tuple[float, float] | None
                       ) -> tuple[tuple[float, float], tuple[float, float]]:
    """A clustered corpus's placement of one model's rows: ((scale, shift) of its image rows, (scale, shift) of its
    text rows), each for :func:`score_location_images` / :func:`score_location_texts`. Image rows keep ``cone``
    (alpha) of their squared norm on one common direction (image-image cosines: alpha + (1 - alpha) cosine); text
    rows keep beta on theirs, at cosine cos f to the images'. A model's text-image cosines become ``a * cosine +
    s`` exactly, (a, s) its ``score`` placement: sqrt((1 - alpha)(1 - beta)) = a and sqrt(alpha beta) cos f = s;
    a model with none takes a = 1 - alpha and s = alpha - gap ** 2 / 2 (beta = alpha, the centroids ``gap`` apart).
    Both are affine in the cosine, so every ranking is the unplaced rows' exactly."""
    alpha = float(cone)
    scale, shift = score if score is not None else (1.0 - alpha, alpha - gap * gap / 2.0)
    beta = 1.0 - scale * scale / (1.0 - alpha)
    if beta < -1e-12 or abs(shift) > np.sqrt(alpha * max(beta, 0.0)) + 1e-12:
        raise FusebenchError(f"sim model: score_scale={scale} and score_shift={shift} do not fit dataset.cone={cone}; "
                             f"valid: score_scale <= sqrt(1 - cone) = {np.sqrt(1 - alpha):.4g} and |score_shift| <= "
                             "sqrt(cone * (1 - score_scale ** 2 / (1 - cone))); lower dataset.cone.")
    beta = min(max(beta, 0.0), 1.0)
    cos_f = 0.0 if beta == 0 else float(np.clip(shift / np.sqrt(alpha * beta), -1.0, 1.0))
    return (1.0 - alpha, 0.0), (1.0 - beta, beta * cos_f)


def image_placement(corpus: Corpus, score: tuple[float, float] | None) -> tuple[float, float] | None:
    """The (scale, shift) :func:`image_rows` places a model's image rows (test images and distractors) with on
    ``corpus``: its own ``score`` on an isotropic corpus, the cone of :func:`modality_placement` on a clustered one."""
    if sim_structure(corpus) == "isotropic":
        return score
    return modality_placement(corpus.meta["sim_cone"], corpus.meta["sim_gap"], score)[0]


def model_rng(corpus_seed: int, seed: int) -> np.random.Generator:
    """The generator of a sim model's projection and of its noise on the test split (``seed``: the model's)."""
    return np.random.default_rng([int(corpus_seed), 1, int(seed)])


def model_projection(rng: np.random.Generator, dim: int, latent_dim: int) -> np.ndarray:
    """A sim model's projection from the latent space to its ``dim`` (latent_dim x dim, float32): orthonormal
    rows when dim >= latent_dim (inner products kept), else orthonormal columns (a random subspace)."""
    if dim < 1:
        raise FusebenchError(f"sim model: dim must be >= 1, got {dim}.")
    gaussian = rng.standard_normal((max(dim, latent_dim), latent_dim))
    return np.linalg.qr(gaussian)[0][:dim].T.astype(np.float32)


def seen_latents(latents: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Latents with a sim model's own noise (drawn from ``rng``), still in the latent space."""
    return latents + np.float32(noise) * rng.standard_normal(latents.shape, dtype=np.float32)


def seen_rows(latents: np.ndarray, noise: float, rng: np.random.Generator, proj: np.ndarray) -> np.ndarray:
    """Latents as a sim model sees them: its own noise (drawn from ``rng``), then its projection."""
    return seen_latents(latents, noise, rng) @ proj


def image_rows(seen: np.ndarray, score: tuple[float, float] | None) -> np.ndarray:
    """A sim model's image rows from what it sees (:func:`seen_rows`): placed by ``score`` = (scale, shift) when
    given (:func:`score_location_images`). The one transform of test images and simulated distractors alike."""
    return seen if score is None else score_location_images(seen, *score)


def sim_model_embeddings(corpus: Corpus, dim: int, image_noise: float, text_noise: float,
                         seed: int, score: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One simulated model's (image, text) embeddings: its own noise, then its own projection to ``dim``;
    ``score`` = (scale, shift) places its cosines like a real family's (:func:`with_score_location`). On a
    clustered corpus every model's rows are placed (:func:`modality_placement`: two more dims, even with no
    ``score``)."""
    images, captions = sim_latents(corpus)
    rng = model_rng(corpus.meta["sim_seed"], seed)
    proj = model_projection(rng, dim, images.shape[1])  # one model in every split: its projection is the test's
    if sim_split(corpus) != "test":  # its own noise on another split's rows
        rng = np.random.default_rng([int(corpus.meta["sim_seed"]), 1, int(seed), *SPLIT_STREAM[sim_split(corpus)]])
    seen_images = seen_rows(images, image_noise, rng, proj)
    seen_captions = seen_rows(captions, text_noise, rng, proj)
    if sim_structure(corpus) != "isotropic":  # a cone per modality, the gap between them: where scores sit too
        image, text = modality_placement(corpus.meta["sim_cone"], corpus.meta["sim_gap"], score)
        return score_location_images(seen_images, *image), score_location_texts(seen_captions, *text)
    if score is None:
        return seen_images, seen_captions
    return image_rows(seen_images, score), score_location_texts(seen_captions, *score)


# --- simulated distractors (gallery=sim): latents shared by every model, then each model's own view ---

DISTRACTOR_BLOCK = 4096  # distractors are drawn in blocks of this many rows, each from its own seeded generator


def distractor_latents(corpus_seed: int, gallery_seed: int, block: int, test_latents: np.ndarray,
                       hard_fraction: float, closeness: float,
                       world: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Block ``block`` of the distractors' latents ((DISTRACTOR_BLOCK, L) float32) and which are hard: a fresh
    latent each (a standard Gaussian; around ``world``'s sub-topic centres on a clustered corpus,
    :func:`clustered_draw`), and for a ``hard_fraction`` of them the fresh latent pulled towards a random test
    image's (``closeness * anchor + sqrt(1 - closeness**2) * fresh``: a photo of the same kind of scene). A pure
    function of (corpus seed, gallery seed, block), the test latents and the world, so any range of rows reads the
    same rows."""
    rng = np.random.default_rng([int(corpus_seed), 2, int(gallery_seed), int(block)])
    latent_dim = test_latents.shape[1]
    if world is None:
        fresh = rng.standard_normal((DISTRACTOR_BLOCK, latent_dim), dtype=np.float32)
    else:
        fresh = clustered_draw(rng, DISTRACTOR_BLOCK, world)[0]
    hard = rng.random(DISTRACTOR_BLOCK) < hard_fraction
    anchors = rng.integers(0, len(test_latents), DISTRACTOR_BLOCK)
    pulled = np.float32(closeness) * test_latents[anchors[hard]] + np.float32(np.sqrt(1.0 - closeness ** 2)) * fresh[hard]
    fresh[hard] = pulled
    return fresh, hard


def off_caption_basis(corpus_seed: int, seed: int, proj: np.ndarray) -> np.ndarray:
    """Orthonormal rows (k x dim, float32) orthogonal to every row of a sim model's projection ``proj``: directions
    of its embedding space that no caption (nor test image) has a component on; k = min(latent_dim, dim -
    latent_dim), 0 when the model's dim leaves no room (dim <= latent_dim)."""
    latent_dim, dim = proj.shape
    k = min(latent_dim, dim - latent_dim)
    if k <= 0:
        return np.zeros((0, dim), dtype=np.float32)
    rng = np.random.default_rng([int(corpus_seed), 4, int(seed)])
    basis = np.hstack([proj.T.astype(np.float64), rng.standard_normal((dim, k))])
    return np.ascontiguousarray(np.linalg.qr(basis)[0][:, latent_dim:].T, dtype=np.float32)


def off_caption_rows(seen: np.ndarray, proj: np.ndarray, basis: np.ndarray, relevance: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
    """Unit rows in the model's space that keep ``relevance`` (per row, in (0, 1]) of the direction of ``seen``
    (latents as the model sees them, :func:`seen_latents`) and put the rest on a random unit direction of
    ``basis`` (orthogonal to every caption): every caption's cosine with row i is ``relevance[i]`` times its cosine
    with ``seen[i] @ proj``. What a web image about something no caption describes looks like to the captions.
    ``proj`` and ``basis`` have jointly orthonormal rows, so the rows are mixed in those coordinates and projected
    once."""
    other = rng.standard_normal((len(seen), len(basis)), dtype=np.float32)
    keep = np.asarray(relevance, dtype=np.float32)[:, None]
    mixed = np.hstack([keep * seen / np.linalg.norm(seen, axis=1, keepdims=True),
                       np.sqrt(1 - keep * keep) * other / np.linalg.norm(other, axis=1, keepdims=True)])
    return mixed @ np.vstack([proj, basis])
