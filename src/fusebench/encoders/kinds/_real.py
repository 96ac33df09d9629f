"""What the real kinds (those with an encoder ``backend``) share: their rows come from their encoder through
the embedding cache, or from their ``sim:`` stand-in on a simulated corpus (``encoders.models.load_real``)."""

from __future__ import annotations


def load(spec, corpus, runtime):
    # the embedding stack (numba, torch on a cache miss): a job's import, never a config check's
    from fusebench.encoders.models import load_real  # lazy: heavy (numpy, numba)

    return load_real(spec, corpus, runtime)
