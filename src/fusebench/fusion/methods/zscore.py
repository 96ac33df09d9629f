"""z-score normalisation (Montague and Aslam, CIKM 2001; OpenSearch's z_score): (s - mean) / sd; 0 where sd = 0."""

from fusebench.fusion.methods import Method, register
from fusebench.fusion.methods._moments import MomentParams


def rows(scores, valid, config, moments=None):
    from fusebench.fusion.normalisers import RowAffine, row_moments  # lazy: heavy (torch, numpy, numba)

    mean, std = row_moments(scores, valid, config.params["ddof"], moments)
    flat = std <= 0
    return RowAffine(mean, std.masked_fill(flat, 1.0), flat, 0.0)


METHOD = register(Method("zscore", "affine", "(s - mean) / sd; 0 where sd = 0", "Montague and Aslam, CIKM 2001",
                         rows, params=MomentParams, order=3, moments=True))
