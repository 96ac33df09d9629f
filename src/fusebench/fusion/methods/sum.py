"""CombSUM over raw scores (Fox and Shaw, TREC-2 1994): the cosine itself, (s - 0) / 1."""

from fusebench.fusion.methods import Method, register


def rows(scores, valid, config, moments=None):
    import torch

    from fusebench.fusion.normalisers import RowAffine  # lazy: heavy (torch, numpy, numba)

    zeros = torch.zeros(scores.shape[0], 1, dtype=scores.dtype, device=scores.device)
    return RowAffine(zeros, torch.ones_like(zeros), torch.zeros_like(zeros, dtype=torch.bool), 0.0)


METHOD = register(Method("sum", "affine", "s (the raw cosine)", "Fox and Shaw, TREC-2 1994", rows, order=1))
