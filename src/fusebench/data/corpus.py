"""The corpus every stage shares: images (ids, optional paths) and captions pointing at their image."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from fusebench import FusebenchError

# loader facts that say where a corpus was read from or how it was labelled, not what it holds
NOT_CONTENT = frozenset({"source", "nonstandard", "test_images"})


@dataclass(frozen=True)
class Corpus:
    """Images and captions. ``caption_image[c]`` is the index (into ``image_ids``) of caption ``c``'s image.

    Images without captions are distractors: t2i can retrieve them, i2t asks no query for them.
    """

    name: str
    image_ids: list[str]
    captions: list[str]
    caption_image: np.ndarray  # (Q,) int64
    image_paths: list[str | None] | None = None
    meta: dict = field(default_factory=dict)
    caption_ids: list[int] | None = None  # stable caption ids (COCO's annotation ids: Karpathy's sentids), if known
    kind: str = ""  # the dataset kind that loaded it (dataset.kind: manifest, karpathy, ...), for advice in errors

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    @property
    def captions_per_image(self) -> np.ndarray:
        return np.bincount(self.caption_image, minlength=self.n_images)

    @property
    def i2t_query_images(self) -> np.ndarray:
        """Indices of images that ask an i2t query (those with at least one caption)."""
        return np.flatnonzero(self.captions_per_image > 0)

    def without_images(self, drop: np.ndarray) -> tuple[Corpus, np.ndarray, np.ndarray]:
        """The corpus less the images where ``drop`` is True and their captions; also the kept image and
        caption indices (to slice embeddings the same way)."""
        keep_images = np.flatnonzero(~np.asarray(drop, dtype=bool))
        new_index = np.full(self.n_images, -1, dtype=np.int64)
        new_index[keep_images] = np.arange(len(keep_images))
        keep_captions = np.flatnonzero(new_index[self.caption_image] >= 0)
        corpus = Corpus(
            name=self.name,
            image_ids=[self.image_ids[i] for i in keep_images],
            captions=[self.captions[c] for c in keep_captions],
            caption_image=new_index[self.caption_image[keep_captions]],
            image_paths=None if self.image_paths is None else [self.image_paths[i] for i in keep_images],
            meta={**self.meta, "dropped_images": int(self.n_images - len(keep_images))},
            caption_ids=None if self.caption_ids is None else [self.caption_ids[c] for c in keep_captions],
            kind=self.kind,
        )
        return corpus, keep_images, keep_captions

    def content_digest(self, n_images: int | None = None) -> str:
        """The sha256 of what the queries and the first ``n_images`` images are (default: all): image ids and
        paths, captions, which image each caption belongs to, caption ids, and the loader's facts that generate
        content (a simulation's parameters; not where a file was read from, nor a gallery's keys). Two runs pair
        query by query only when their digests are equal (name and counts are not enough: two manifests of one
        size, or two ``dataset.seed`` values, are other corpora)."""
        n = self.n_images if n_images is None else int(n_images)
        facts = {k: v for k, v in sorted(self.meta.items()) if k not in NOT_CONTENT and not k.startswith("gallery_")
                 and isinstance(v, (bool, int, float, str))}
        h = hashlib.sha256()
        h.update(json.dumps({"images": self.image_ids[:n], "paths": None if self.image_paths is None
                             else self.image_paths[:n], "captions": self.captions, "caption_ids": self.caption_ids,
                             "facts": facts}, ensure_ascii=False).encode("utf-8"))
        h.update(np.ascontiguousarray(self.caption_image, dtype=np.int64).tobytes())
        return h.hexdigest()

    def summary(self) -> dict:
        per = self.captions_per_image
        return {
            "name": self.name,
            "n_images": self.n_images,
            "n_captions": self.n_captions,
            "n_images_without_captions": int((per == 0).sum()),
            "t2i_queries": self.n_captions,
            "i2t_queries": int((per > 0).sum()),
            **{k: v for k, v in self.meta.items() if isinstance(v, (bool, int, float, str))},
        }


def validate_corpus(corpus: Corpus, source: str) -> Corpus:
    """Check the invariants every loader must give; ``source`` names the file or generator in errors."""
    if corpus.n_images == 0:
        raise FusebenchError(f"{source}: the corpus is empty (no images); a retrieval corpus needs at least one image.")
    if corpus.n_captions == 0:
        raise FusebenchError(f"{source}: the corpus has no captions, so there are no t2i queries and no i2t targets.")
    seen: dict[str, int] = {}
    for i, image_id in enumerate(corpus.image_ids):
        if image_id in seen:
            raise FusebenchError(
                f"{source}: duplicate image id {image_id!r} (entries {seen[image_id] + 1} and {i + 1}); image ids must be unique."
            )
        seen[image_id] = i
    ci = np.asarray(corpus.caption_image)
    if ci.shape != (corpus.n_captions,) or ci.dtype.kind not in "iu":
        raise FusebenchError(f"{source}: caption_image must be an integer array with one entry per caption.")
    if ci.size and (ci.min() < 0 or ci.max() >= corpus.n_images):
        raise FusebenchError(f"{source}: a caption points at an image index outside 0..{corpus.n_images - 1}.")
    if corpus.caption_ids is not None:
        if len(corpus.caption_ids) != corpus.n_captions:
            raise FusebenchError(f"{source}: {len(corpus.caption_ids)} caption ids for {corpus.n_captions} captions; "
                                 "give one id per caption or none.")
        first: dict[int, int] = {}
        for c, caption_id in enumerate(corpus.caption_ids):
            if caption_id in first:
                raise FusebenchError(f"{source}: duplicate caption id {caption_id} (captions {first[caption_id] + 1} "
                                     f"and {c + 1}); caption ids must be unique.")
            first[caption_id] = c
    return corpus


def sample_images(corpus: Corpus, n_images: int, seed: int) -> Corpus:
    """At most ``n_images`` of ``corpus``'s images that have captions, a seeded sample in corpus order, with their
    captions (the whole corpus's images with captions when it has no more)."""
    with_captions = corpus.i2t_query_images
    if len(with_captions) <= n_images:
        keep = with_captions
    else:
        keep = np.sort(np.random.default_rng(seed).choice(with_captions, size=n_images, replace=False))
    drop = np.ones(corpus.n_images, dtype=bool)
    drop[keep] = False
    return corpus.without_images(drop)[0]
