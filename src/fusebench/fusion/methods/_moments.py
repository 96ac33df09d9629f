"""What the methods built on each list's mean and sd share: their parameters (the sd's ddof)."""

from dataclasses import dataclass

from fusebench import FusebenchError


@dataclass
class MomentParams:
    ddof: int = 0  # the sd: 0 population, 1 sample (Qdrant)

    def __post_init__(self):
        if isinstance(self.ddof, bool) or self.ddof not in (0, 1):
            raise FusebenchError(f"fusion.params.ddof={self.ddof!r} is not valid: use 0 (population sd) or 1 (sample "
                                 "sd, as Qdrant).")
        self.ddof = int(self.ddof)
