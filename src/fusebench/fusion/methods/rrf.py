"""Reciprocal rank fusion (Cormack, Clarke and Buettcher, SIGIR 2009): 1 / (rrf_k + rank)."""

from fusebench.fusion.methods import Method, register


def evidence(ranks, config, candidates=None):
    return 1.0 / (config.rrf_k + ranks)


METHOD = register(Method("rrf", "rank", "1 / (rrf_k + rank)", "Cormack, Clarke and Buettcher, SIGIR 2009", evidence,
                         reads=("rrf_k", "rrf_weighting"), order=5))
