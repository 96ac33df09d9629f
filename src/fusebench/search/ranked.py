"""The one ranked-list type: what every search backend returns, what fusion reads and writes, and what evaluation
scores. One retriever (a model alone, or a fusion) in one direction.

``ids`` and ``scores`` are (queries, L) tensors, best first: ``ids`` int32/int64 item indices, -1 where a list is
shorter than ``L``; ``scores`` float32, the retriever's own (higher is better), -inf on padding. ``ranks`` (when
known) is the 1-based rank of each query's first correct item, exact in the retriever's full ranking for exact
search and within the list for an index or an engine (0: not in the list, a miss). ``contributors`` (fused lists
only) is the bitmask of the models whose own lists hold each entry (bit m = the run's m-th model).

:func:`t2i_list_ranks` and :func:`i2t_list_ranks` find a list's ``ranks``: the 1-based position of each query's
first correct item, 0 when the list does not hold it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch


@dataclass(kw_only=True)
class RankedLists:
    ids: torch.Tensor  # (queries, L) item index per position, -1 padding
    scores: torch.Tensor  # (queries, L) float32, -inf padding
    ranks: np.ndarray | torch.Tensor | None = None  # (queries,) 1-based rank of the first correct item; 0 = missed
    contributors: torch.Tensor | None = None  # fused lists: (queries, L) int64 bitmask of the models holding each entry

    def cut(self, length: int | None) -> RankedLists:
        """These lists cut to their first ``length`` entries (None = as they are); ranks are kept as they are
        (computed on the whole list)."""
        if length is None:
            return self
        return replace(self, ids=self.ids[:, :length], scores=self.scores[:, :length],
                       contributors=None if self.contributors is None else self.contributors[:, :length])

    def with_ranks(self, ranks) -> RankedLists:
        return replace(self, ranks=ranks)


def first_hit_ranks(correct: torch.Tensor) -> np.ndarray:
    """1-based position of the first ``True`` in each row of ``correct`` (queries x list positions); 0 if none."""
    width = correct.shape[1]
    pos = torch.where(correct, torch.arange(width, device=correct.device)[None, :], torch.full_like(correct, width, dtype=torch.int64))
    first = pos.min(dim=1).values if width else torch.zeros(correct.shape[0], dtype=torch.int64)
    return torch.where(first < width, first + 1, torch.zeros_like(first)).cpu().numpy().astype(np.int64)


def t2i_list_ranks(ids: torch.Tensor, caption_image: torch.Tensor) -> np.ndarray:
    """Ranks for caption queries: the correct item is the caption's one image."""
    return first_hit_ranks(ids == caption_image[:, None])


def i2t_list_ranks(ids: torch.Tensor, query_images: torch.Tensor, caption_image: torch.Tensor) -> np.ndarray:
    """Ranks for image queries: any caption of the image is correct."""
    owner = torch.where(ids >= 0, caption_image[ids.clamp(min=0)], torch.full_like(ids, -1))
    return first_hit_ranks(owner == query_images[:, None])
