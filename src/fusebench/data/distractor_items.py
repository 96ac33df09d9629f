"""A dataset's gallery with distractors: the test split's images first, then distractor images in a seeded order.

What stays fixed is the protocol: the queries (captions) and their images are exactly the test split's, in the
same order and at the same indices, so a caption's ranks at 10k and at 1M distractors are paired by position.
The distractors of one ``(source, seed)`` come in one order (:func:`seeded_order`), whatever ``size`` is asked,
so galleries nest. See :mod:`fusebench.config.gallery` for the keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus


@dataclass(frozen=True)
class DistractorItems:
    """A source's images, in the seeded order: ``ids[i]`` (unique, never a test image's id) and ``refs[i]`` (what
    opens image i: a file path, or ``TAR::MEMBER`` for a member of a tar shard; None for rows that are only
    vectors). ``source``: a JSON-able description of the source (kind, location, listing digest, seed)."""

    ids: list[str]
    refs: list[str | None]
    source: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def first(self, n: int) -> DistractorItems:
        return replace(self, ids=self.ids[:n], refs=self.refs[:n])


def seeded_order(n: int, seed: int) -> np.ndarray:
    """The order in which a source's ``n`` items join galleries: one permutation per (n, seed), so the first
    ``size`` of it are the same items for every ``size`` (nested galleries)."""
    return np.random.default_rng([int(seed), 0x6A11]).permutation(n)


def check_size(size: int, available: int, source: str) -> None:
    """A gallery larger than its source is an error naming both numbers."""
    if size > available:
        raise FusebenchError(f"gallery.size={size:,} but {source} holds {available:,} distractor images: lower "
                             f"gallery.size to at most {available:,} or give a larger source.")


def check_no_overlap(test_ids: list[str], distractor_ids: list[str], source: str) -> None:
    """Distractors that are test images (same image id) would be counted as wrong answers: an error."""
    test = set(test_ids)
    overlap = [i for i in distractor_ids if i in test]
    if overlap:
        raise FusebenchError(f"{source}: {len(overlap):,} distractor(s) have the id of a test image (first: "
                             f"{overlap[0]!r}); a distractor must not be a test image. Remove them from the source.")


def with_distractors(corpus: Corpus, distractor_ids: list[str], summary: dict) -> Corpus:
    """``corpus`` with the distractors' ids appended after its images (no captions: they ask no i2t query) and
    the gallery's summary in its meta (``gallery_*`` keys, which the record and the run's label read)."""
    if not distractor_ids:
        return replace(corpus, meta={**corpus.meta, **summary})
    return replace(corpus, image_ids=[*corpus.image_ids, *distractor_ids],
                   image_paths=None if corpus.image_paths is None else [*corpus.image_paths,
                                                                        *([None] * len(distractor_ids))],
                   meta={**corpus.meta, **summary})
