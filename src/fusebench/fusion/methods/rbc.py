"""Rank-biased centroids (Bailey, Moffat, Scholer and Thomas, SIGIR 2017; ranx's ``rbc``): (1 - phi) phi^(rank - 1),
summed over the lists. ``phi`` is the persistence of a user walking down each list: near 0 only the first items
count (close to a vote on first preferences), near 1 the whole list does (close to counting the lists holding
an item). ranx takes phi without a default; 0.8 here, the value the paper's examples use most."""

from dataclasses import dataclass

from fusebench.fusion.methods import Method, register
from fusebench.runtime import checks


@dataclass
class RBCParams:
    phi: float = 0.8  # persistence, in (0, 1)

    def __post_init__(self):
        self.phi = checks.number(self.phi, "fusion.params.phi", 0, 1, open_low=True, open_high=True,
                                 hint="the persistence: near 0 the first items only, near 1 the whole list")


def evidence(ranks, config, candidates=None):
    phi = float(config.params["phi"])
    return (1.0 - phi) * phi ** (ranks - 1.0)


METHOD = register(Method("rbc", "rank", "(1 - phi) phi^(rank - 1)",
                         "Bailey, Moffat, Scholer and Thomas, SIGIR 2017; ranx rbc", evidence, params=RBCParams,
                         order=9))
