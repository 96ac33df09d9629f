"""The isotropic simulator as it was before ``dataset.structure`` existed (issue 31, item 4), written out the obvious
way: the default ``dataset=sim`` and ``gallery=sim`` must give exactly these rows (tests/test_sim_structure.py)."""

from __future__ import annotations

import numpy as np


def old_latents(seed, n_images, caption_image, latent_dim, caption_noise, shared_caption_noise):
    rng = np.random.default_rng([seed, 0])
    images = rng.standard_normal((n_images, latent_dim), dtype=np.float32)
    noise = rng.standard_normal((len(caption_image), latent_dim), dtype=np.float32)
    shared = rng.standard_normal((n_images, latent_dim), dtype=np.float32)
    captions = (images + np.float32(shared_caption_noise) * shared)[caption_image]
    captions += np.float32(caption_noise) * noise
    return images, captions


def _project(dim, latent_dim, rng):
    gaussian = rng.standard_normal((max(dim, latent_dim), latent_dim))
    return np.linalg.qr(gaussian)[0][:dim].T.astype(np.float32)


def _place(rows, extra, scale):
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    tail = np.tile(np.asarray(extra, dtype=np.float32), (len(rows), 1))
    return np.hstack([np.float32(np.sqrt(scale)) * rows, tail]).astype(np.float32, copy=False)


def old_model(seed_corpus, images, captions, dim, image_noise, text_noise, seed, score):
    rng = np.random.default_rng([seed_corpus, 1, seed])
    proj = _project(dim, images.shape[1], rng)
    seen_i = (images + np.float32(image_noise) * rng.standard_normal(images.shape, dtype=np.float32)) @ proj
    seen_t = (captions + np.float32(text_noise) * rng.standard_normal(captions.shape, dtype=np.float32)) @ proj
    if score is None:
        return seen_i, seen_t
    scale, shift = score
    rest = np.sqrt(1.0 - scale)
    angle = 0.0 if rest == 0 else float(np.arccos(np.clip(shift / (1.0 - scale), -1.0, 1.0)))
    return (_place(seen_i, [rest, 0.0], scale),
            _place(seen_t, [rest * np.cos(angle), rest * np.sin(angle)], scale))


def old_distractor_block(seed_corpus, gallery_seed, block, test_latents, hard_fraction, closeness, model_seed, dim,
                         image_noise, score, relevance, block_rows=4096):
    """Block ``block`` of a sim model's distractor rows (normalised), as the isotropic simulator drew them."""
    rng = np.random.default_rng([seed_corpus, 2, gallery_seed, block])
    latent_dim = test_latents.shape[1]
    fresh = rng.standard_normal((block_rows, latent_dim), dtype=np.float32)
    hard = rng.random(block_rows) < hard_fraction
    anchors = rng.integers(0, len(test_latents), block_rows)
    fresh[hard] = (np.float32(closeness) * test_latents[anchors[hard]]
                   + np.float32(np.sqrt(1.0 - closeness ** 2)) * fresh[hard])
    proj = _project(dim, latent_dim, np.random.default_rng([seed_corpus, 1, model_seed]))
    rng = np.random.default_rng([seed_corpus, 3, gallery_seed, model_seed, block])
    seen = fresh + np.float32(image_noise) * rng.standard_normal(fresh.shape, dtype=np.float32)
    if relevance < 1:
        k = min(latent_dim, dim - latent_dim)
        basis_rng = np.random.default_rng([seed_corpus, 4, model_seed])
        basis = np.hstack([proj.T.astype(np.float64), basis_rng.standard_normal((dim, k))])
        basis = np.ascontiguousarray(np.linalg.qr(basis)[0][:, latent_dim:].T, dtype=np.float32)
        other = rng.standard_normal((len(seen), k), dtype=np.float32)
        keep = np.where(hard, np.float32(1), np.float32(relevance))[:, None]
        mixed = np.hstack([keep * seen / np.linalg.norm(seen, axis=1, keepdims=True),
                           np.sqrt(1 - keep * keep) * other / np.linalg.norm(other, axis=1, keepdims=True)])
        rows = mixed @ np.vstack([proj, basis])
    else:
        rows = seen @ proj
    if score is not None:
        rows = _place(rows, [np.sqrt(1.0 - score[0]), 0.0], score[0])
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)
