"""A seeded synthetic corpus for the ``sim`` dataset and the ``sim`` model kind.

Every image has a latent vector; each caption is its image's latent plus caption noise (what the caption
leaves out or adds, shared by all models). A simulated model sees each image and caption through its own
noise and its own random projection to its own dimension, so two models make partly independent errors
and fusing them can help, as with real models. Nothing here is real data: outputs are labelled simulated.
"""

from __future__ import annotations

import numpy as np

from fusebench import FusebenchError
from fusebench.config.schema import SimDatasetConfig
from fusebench.data.corpus import Corpus, validate_corpus


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
    corpus = Corpus(
        name=name,
        image_ids=[f"sim{i:06d}" for i in range(n_images)],
        captions=[f"simulated caption {r + 1} of image {i}" for i, r in zip(caption_image, rank_in_image)],
        caption_image=caption_image,
        image_paths=None,
        meta={"simulated": True, "sim_seed": int(seed), "sim_latent_dim": int(latent_dim),
              "sim_caption_noise": float(caption_noise), "sim_shared_caption_noise": float(shared_caption_noise)},
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


def sim_latents(corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """The shared latents of a sim corpus: (image latents (N, L), caption latents (Q, L)), float32."""
    require_sim_corpus(corpus)
    rng = np.random.default_rng([int(corpus.meta["sim_seed"]), 0])
    dim = int(corpus.meta["sim_latent_dim"])
    images = rng.standard_normal((corpus.n_images, dim), dtype=np.float32)
    noise = rng.standard_normal((corpus.n_captions, dim), dtype=np.float32)
    # what every caption of an image misses alike (shared), then what each caption adds or misses on its own
    shared = rng.standard_normal((corpus.n_images, dim), dtype=np.float32)
    captions = (images + np.float32(corpus.meta["sim_shared_caption_noise"]) * shared)[corpus.caption_image]
    captions += np.float32(corpus.meta["sim_caption_noise"]) * noise
    return images, captions


def with_score_location(image: np.ndarray, text: np.ndarray, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose cosines are ``scale * cosine + shift`` of the given rows' cosines, exactly (two more dims).

    With unit rows u (text) and v (image): u' = [sqrt(a) u, sqrt(1 - a) (cos f, sin f)] and
    v' = [sqrt(a) v, sqrt(1 - a) (1, 0)], so u'.v' = a u.v + (1 - a) cos f: scale a in (0, 1], shift in
    [-(1 - a), 1 - a]. Every query's ranking is unchanged (a positive affine map); only where the scores sit,
    and how spread they are, changes: what raw-score fusion (sum) sees and normalising fusions undo."""
    if not 0 < scale <= 1 or abs(shift) > 1 - scale + 1e-12:
        raise FusebenchError(f"sim model: score_scale={scale} and score_shift={shift} are not valid; valid: 0 < "
                             "score_scale <= 1 and |score_shift| <= 1 - score_scale.")
    image = image / np.linalg.norm(image, axis=1, keepdims=True)
    text = text / np.linalg.norm(text, axis=1, keepdims=True)
    rest = np.sqrt(1.0 - scale)
    angle = 0.0 if rest == 0 else float(np.arccos(np.clip(shift / (1.0 - scale), -1.0, 1.0)))
    image_extra = np.tile(np.array([rest, 0.0], dtype=np.float32), (len(image), 1))
    text_extra = np.tile(np.array([rest * np.cos(angle), rest * np.sin(angle)], dtype=np.float32), (len(text), 1))
    root = np.float32(np.sqrt(scale))
    return (np.hstack([root * image, image_extra]).astype(np.float32),
            np.hstack([root * text, text_extra]).astype(np.float32))


def sim_model_embeddings(corpus: Corpus, dim: int, image_noise: float, text_noise: float,
                         seed: int, score: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One simulated model's (image, text) embeddings: its own noise, then its own projection to ``dim``;
    ``score`` = (scale, shift) places its cosines like a real family's (:func:`with_score_location`)."""
    if dim < 1:
        raise FusebenchError(f"sim model: dim must be >= 1, got {dim}.")
    images, captions = sim_latents(corpus)
    rng = np.random.default_rng([int(corpus.meta["sim_seed"]), 1, int(seed)])
    latent_dim = images.shape[1]
    gaussian = rng.standard_normal((max(dim, latent_dim), latent_dim))
    proj = np.linalg.qr(gaussian)[0][:dim].T.astype(np.float32)  # orthonormal rows when dim >= latent_dim
    seen_images = images + np.float32(image_noise) * rng.standard_normal(images.shape, dtype=np.float32)
    seen_captions = captions + np.float32(text_noise) * rng.standard_normal(captions.shape, dtype=np.float32)
    if score is None:
        return seen_images @ proj, seen_captions @ proj
    return with_score_location(seen_images @ proj, seen_captions @ proj, *score)
