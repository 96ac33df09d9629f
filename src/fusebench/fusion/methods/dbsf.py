"""Distribution-based score fusion (Qdrant; Mazzeschi's "Distribution-Based Score Fusion", 2023):
(s - (mean - 3 sd)) / (6 sd) over the list; 0.5 where sd = 0. No clipping."""

from fusebench.fusion.methods import Method, register
from fusebench.fusion.methods._moments import MomentParams


def rows(scores, valid, config, moments=None):
    from fusebench.fusion.normalisers import RowAffine, row_moments  # lazy: heavy (torch, numpy, numba)

    mean, std = row_moments(scores, valid, config.params["ddof"], moments)
    flat = std <= 0
    return RowAffine(mean - 3 * std, (6 * std).masked_fill_(flat, 1.0), flat, 0.5)


METHOD = register(Method("dbsf", "affine", "(s - (mean - 3 sd)) / (6 sd); 0.5 where sd = 0",
                         "Qdrant's DBSF (M. Mazzeschi, 2023)", rows, params=MomentParams, order=6, moments=True))
