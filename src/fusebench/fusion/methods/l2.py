"""L2 normalisation (Elasticsearch's l2_norm, OpenSearch's l2): s / sqrt(sum of the list's s^2); 0 where 0."""

from fusebench.fusion.methods import Method, register


def rows(scores, valid, config, moments=None):
    import torch

    from fusebench.fusion.normalisers import RowAffine  # lazy: heavy (torch, numpy, numba)

    wide = scores.to(torch.float64)
    if valid is not None:
        wide = wide.masked_fill(~valid, 0.0)
    norm = torch.sqrt((wide * wide).sum(dim=1, keepdim=True)).to(scores.dtype)
    flat = norm <= 0
    return RowAffine(torch.zeros_like(norm), norm.masked_fill(flat, 1.0), flat, 0.0)


METHOD = register(Method("l2", "affine", "s / sqrt(sum of the list's s^2); 0 where that norm is 0",
                         "Elasticsearch l2_norm, OpenSearch l2", rows, order=7))
