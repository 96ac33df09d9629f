"""Borda count (Aslam and Montague, SIGIR 2001, as ranx's bordafuse): n - rank + 1, where n is the number of
distinct items in all of the query's lists; an item a list lacks gets (n - that list's length + 1) / 2 from it
(``methods._ranks.absent_points``)."""

from fusebench.fusion.methods import Method, register


def evidence(ranks, config, candidates=None):
    import torch

    n = (torch.full((ranks.shape[0], 1), ranks.shape[1], dtype=ranks.dtype, device=ranks.device)
         if candidates is None else candidates.to(ranks.dtype))
    return n - ranks + 1


METHOD = register(Method("borda", "rank", "n - rank + 1 (n: distinct candidates; a list lacking an item gives "
                         "(n - its length + 1) / 2)", "Aslam and Montague, SIGIR 2001; ranx bordafuse", evidence,
                         order=8, candidates=True))
