"""The fast tier (``pytest -m "not slow"``) keeps a few cases of a long parametrised check; the rest are slow."""

from __future__ import annotations

import pytest


def fast_first(values, n: int = 1, unpack: bool = False) -> list:
    """``values`` as pytest params: the first ``n`` in the fast tier, the others marked slow (``make test``
    runs them all). ``unpack``: each value is a tuple of arguments, for a parametrize with several names."""
    return [pytest.param(*(v if unpack else (v,)), marks=() if i < n else pytest.mark.slow)
            for i, v in enumerate(values)]
