"""Run the list search against a store and compare two searches' lists exactly (the store tests share these)."""

from __future__ import annotations

import numpy as np
import torch

from fusebench.backends.retrieval import ListSource, SearchSettings, retrieve
from fusebench.runtime import state


def run_lists(models, caption_image, config, store, depth=30, keep_k=None):
    """Every retriever's lists, the list store's records, and the similarity blocks this search computed."""
    source = ListSource()
    before = state.current().similarity_blocks
    out = retrieve(models, caption_image, config, keep_k=keep_k,
                   settings=SearchSettings(chunk_size=16, item_chunk_size=16, depth=depth, store_dir=store), source=source)
    return out, source.records, state.current().similarity_blocks - before


def assert_same_lists(a, b):
    """Ranks, ids, scores (and fused contributors) identical, retriever by retriever, both directions."""
    assert a.keys() == b.keys()
    for name in a:
        for d in ("t2i", "i2t"):
            assert np.array_equal(a[name][d].ranks, b[name][d].ranks)
            assert torch.equal(a[name][d].ids, b[name][d].ids)
            assert torch.equal(a[name][d].scores, b[name][d].scores)
            if a[name][d].contributors is not None:
                assert torch.equal(a[name][d].contributors, b[name][d].contributors)
