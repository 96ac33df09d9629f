"""Kind ``sim``: a simulated model over the sim dataset (``fusebench.data.simulated``; docs/simulated.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fusebench.config.specs import ModelSpec, SimParams
from fusebench.encoders.kinds import ModelKind, register
from fusebench.runtime.checks import INTERNAL


@dataclass
class SimModel(ModelSpec):
    """Kind ``sim``: ``dim``, ``image_noise``, ``text_noise``, ``seed`` (all set), ``score_scale`` and
    ``score_shift`` (where its cosines sit: both or neither); checked by :class:`SimParams`."""

    dim: int | None = None
    image_noise: float | None = None
    text_noise: float | None = None
    seed: int | None = None
    score_scale: float | None = None
    score_shift: float | None = None
    params: SimParams | None = field(default=None, metadata=INTERNAL)

    def __post_init__(self):
        super().__post_init__()
        self.params = SimParams(self.dim, self.image_noise, self.text_noise, self.seed, self.score_scale,
                                self.score_shift, where=f"models.{self.name}")


def load(spec: SimModel, corpus, runtime=None):
    # numba (the row norms behind RawEmbeddings): a job's import, never a config check's
    from fusebench.encoders.base import RawEmbeddings  # lazy: heavy (numpy, numba)
    from fusebench.encoders.simulated import sim_arrays  # lazy: heavy (numpy, numba)

    image, text = sim_arrays(spec.params, corpus)
    source = f"sim model {spec.name!r}"
    return RawEmbeddings(spec.name, image, text, source, source, dict(spec.given), declared_dim=spec.params.dim)


KIND = register(ModelKind("sim", SimModel, load, "a simulated model of the sim dataset", order=10))
