"""What the rank methods share: Borda's points for an item a list lacks."""

from __future__ import annotations


def absent_points(valid, candidates):
    """(B, 1): the points a list gives each candidate it does not hold, (n - its length + 1) / 2 (Borda)."""
    import torch

    return (candidates - valid.sum(dim=1, keepdim=True) + 1).to(torch.float32) / 2
