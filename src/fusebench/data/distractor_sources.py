"""Listing a gallery's distractor images from where people keep them, in the seeded order galleries nest by.

:func:`distractor_items` is the one entry point: the source's items (``gallery.kind``: folder, webdataset, paths;
the rows of a vectors dump are listed by :mod:`fusebench.encoders.vector_dumps`), put in :func:`seeded_order`, the
first ``gallery.size`` taken, checked against the test split's image ids.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig
from fusebench.data.gallery import DistractorItems, check_no_overlap, check_size, seeded_order

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def folder_items(folder: str) -> tuple[list[str], list[str]]:
    """(ids, paths) of every image under ``folder`` (recursively, sorted by relative path; the id is that path)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FusebenchError(f"gallery.source={folder!r} is not a folder (gallery=folder reads the images under it).")
    found = []
    for parent, dirs, files in os.walk(root):
        dirs.sort()
        found.extend(os.path.join(parent, f) for f in files if f.lower().endswith(IMAGE_SUFFIXES))
    paths = sorted(found)
    return [os.path.relpath(p, root) for p in paths], paths


LISTERS = {"folder": folder_items}  # gallery.kind -> (source) -> (ids, refs)


def listing_digest(ids: list[str], refs: list) -> str:
    digest = hashlib.sha256()
    for image_id, ref in zip(ids, refs):
        digest.update(f"{image_id}\0{ref}\n".encode())
    return digest.hexdigest()


def distractor_items(gallery: GalleryConfig, test_ids: list[str]) -> DistractorItems:
    """The first ``gallery.size`` distractors of ``gallery.source`` in seeded order (checked: not larger than the
    source, no test image among them)."""
    ids, refs = LISTERS[gallery.kind](gallery.source)
    where = f"gallery.source={gallery.source!r}"
    check_size(gallery.size, len(ids), where)
    order = seeded_order(len(ids), gallery.seed)[: gallery.size]
    ids, refs = [ids[i] for i in order], [refs[i] for i in order]
    check_no_overlap(test_ids, ids, where)
    source = {"kind": gallery.kind, "source": str(gallery.source), "seed": gallery.seed,
              "listing": listing_digest(ids, refs)}
    return DistractorItems(ids, refs, source)
