"""Which torch device a run uses: ``auto`` picks cuda, then mps, then cpu; an unavailable one is an error."""

from __future__ import annotations

import torch

from fusebench import FusebenchError


def resolve_device(name: str | None) -> torch.device:
    """``auto`` (or None) picks cuda, then mps, then cpu."""
    if name in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise FusebenchError(f"device {name!r} is not a torch device; valid: auto, cpu, cuda, cuda:N, mps.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise FusebenchError(f"device {name!r} was asked for but no CUDA device is available; use auto or cpu.")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise FusebenchError(f"device {name!r} was asked for but MPS is not available; use auto or cpu.")
    return device
