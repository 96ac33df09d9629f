"""The one ranked-list type: what every search backend returns, what fusion reads and writes, and what evaluation
scores. One retriever (a model alone, or a fusion) in one direction.

``ids`` and ``scores`` are (queries, L) tensors, best first: ``ids`` int32/int64 item indices, -1 where a list is
shorter than ``L``; ``scores`` float32, the retriever's own (higher is better), -inf on padding. ``ranks`` (when
known) is the 1-based rank of each query's first correct item, exact in the retriever's full ranking for exact
search and within the list for an index or an engine (0: not in the list, a miss). ``contributors`` (fused lists
only) is the bitmask of the models whose own lists hold each entry (bit m = the run's m-th model).
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
