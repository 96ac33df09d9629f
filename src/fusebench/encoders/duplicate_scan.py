"""Near-duplicates of test images among a gallery's distractors: web collections hold COCO and Flickr photos.

A distractor is dropped when, under ANY model of the run, the cosine between its image embedding and some test
image's exceeds ``gallery.near_duplicate`` (the rule SemDeDup applies within a cluster: drop an item whose largest
cosine to another exceeds 1 - eps). Per model, :func:`distractor_max_cosine` streams the distractors through
tiles of ``item_chunk`` rows against blocks of test images (memory: about ``TILE_ENTRIES`` scores, whatever the
sizes), keeping each distractor's largest cosine, in fp32 (``search.exact.similarity``: no TF32). Those maxima
are stored per model (:mod:`fusebench.stores.near_duplicates`): the jobs of a sweep over one gallery, and runs
with another threshold, compute them once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from fusebench.encoders.distractors import DistractorRows
from fusebench.search.exact import float_rows, similarity
from fusebench.search.model_lists import tiles
from fusebench.stores.lists import shared_digests
from fusebench.stores.near_duplicates import NearDuplicateStore

TILE_ENTRIES = 1 << 24  # scores per similarity block (64 MB of fp32): test images per block = this / item_chunk


def finite_rows(rows: np.ndarray) -> np.ndarray:
    """``rows`` without the rows holding NaN (the all-NaN rows of test images a model could not read)."""
    rows = np.asarray(rows, dtype=np.float32)
    finite = np.isfinite(rows).all(axis=1)
    return rows if finite.all() else rows[finite]


def distractor_max_cosine(test_image: np.ndarray, distractors: DistractorRows, item_chunk: int,
                          device: torch.device | str = "cpu", progress: Callable[[int], None] | None = None
                          ) -> np.ndarray:
    """Per distractor, its largest cosine to any test image (both L2-normalised), float32; -inf with no test
    image. Rows that are not finite (unreadable test images) are left out. ``progress(n)``: n more distractors
    done."""
    test = finite_rows(test_image)
    out = np.full(distractors.n, -np.inf, dtype=np.float32)
    if len(test) == 0 or distractors.n == 0:
        return out
    device = torch.device(device)
    block = max(1, TILE_ENTRIES // max(1, item_chunk))
    blocks = [float_rows(test[t0:t1], device) for t0, t1 in tiles(len(test), block)]
    for c0, c1 in tiles(distractors.n, item_chunk):
        items = float_rows(distractors.read(c0, c1), device)
        best = None
        for queries in blocks:
            most = similarity(items, queries).amax(dim=1)
            best = most if best is None else torch.maximum(best, most)
        out[c0:c1] = best.cpu().numpy()
        if progress is not None:
            progress(c1 - c0)
    return out


def near_duplicate_drops(max_cosines: Sequence[np.ndarray], threshold: float | None) -> np.ndarray:
    """Distractors to drop: those whose largest cosine to a test image exceeds ``threshold`` under any model
    (one array per model, one value per distractor); none when ``threshold`` is None."""
    arrays = [np.asarray(m, dtype=np.float32) for m in (max_cosines.values() if isinstance(max_cosines, dict)
                                                        else max_cosines)]
    if len({a.shape for a in arrays}) > 1:
        raise ValueError(f"one max-cosine array per model, all of one length; got shapes {[a.shape for a in arrays]}")
    n = arrays[0].shape[0] if arrays else 0
    if threshold is None or not arrays:
        return np.zeros(n, dtype=bool)
    return np.logical_or.reduce([a > threshold for a in arrays])


def stored_max_cosine(test_image: np.ndarray, distractors: DistractorRows, model_name: str, item_chunk: int,
                      device: torch.device | str, store_dir: str | None,
                      progress: Callable[[int], None] | None = None) -> np.ndarray:
    """:func:`distractor_max_cosine`, read from the near-duplicate store under ``store_dir`` when it holds it (else
    computed and stored there); computed and not stored when ``store_dir`` is None. The key: the test image rows'
    digest, the distractors' key, the model and the device type."""
    def compute() -> np.ndarray:
        return distractor_max_cosine(test_image, distractors, item_chunk, device, progress)

    if store_dir is None:
        return compute()

    material = {"test_image": shared_digests([np.asarray(test_image, dtype=np.float32)])[0],
                "distractors": distractors.key, "model": model_name, "device": torch.device(device).type}
    values, _hit = NearDuplicateStore(store_dir).get_or_compute(material, distractors.n, compute,
                                                                info={"model": model_name})
    return values
