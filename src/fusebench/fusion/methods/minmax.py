"""Min-max normalisation (Fox and Shaw, TREC-2 1994; Lee, SIGIR 1997): (s - min) / (max - min); 0.5 where flat."""

from fusebench.fusion.methods import Method, register


def rows(scores, valid, config, moments=None):
    import torch

    from fusebench.fusion.normalisers import RowAffine  # lazy: heavy (torch, numpy, numba)

    if valid is None:
        low, high = scores.amin(dim=1, keepdim=True), scores.amax(dim=1, keepdim=True)
    else:
        big = torch.finfo(scores.dtype).max
        low = torch.where(valid, scores, torch.full_like(scores, big)).amin(dim=1, keepdim=True)
        high = torch.where(valid, scores, torch.full_like(scores, -big)).amax(dim=1, keepdim=True)
    span = high - low
    flat = span <= 0
    return RowAffine(low, span.masked_fill(flat, 1.0), flat, 0.5)


METHOD = register(Method("minmax", "affine", "(s - min) / (max - min); 0.5 where max = min",
                         "Fox and Shaw, TREC-2 1994; Lee, SIGIR 1997", rows, order=2))
