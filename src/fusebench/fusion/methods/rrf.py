"""Reciprocal rank fusion (Cormack, Clarke and Buettcher, SIGIR 2009): 1 / (rrf_k + rank). ``rrf_weighting: rank``
is Qdrant's weighted RRF: the weight divides the rank, 1 / (rank / w + rrf_k) (``fusion.combine``)."""

from dataclasses import dataclass

from fusebench.fusion.methods import Method, register
from fusebench.runtime import checks

RRF_WEIGHTINGS = ("multiply", "rank")


@dataclass
class RRFParams:
    rrf_k: float = 60.0  # 1 / (rrf_k + rank)
    rrf_weighting: str = "multiply"  # multiply: w / (rrf_k + rank) | rank: 1 / (rank / w + rrf_k) (Qdrant)

    def __post_init__(self):
        self.rrf_k = checks.number(self.rrf_k, "fusion.params.rrf_k", 0, hint="1 / (rrf_k + rank); the usual value is 60")
        self.rrf_weighting = checks.choice(self.rrf_weighting, "fusion.params.rrf_weighting", RRF_WEIGHTINGS)


def evidence(ranks, config, candidates=None):
    return 1.0 / (config.params["rrf_k"] + ranks)


METHOD = register(Method("rrf", "rank", "1 / (rrf_k + rank)", "Cormack, Clarke and Buettcher, SIGIR 2009", evidence,
                         params=RRFParams, order=5))
