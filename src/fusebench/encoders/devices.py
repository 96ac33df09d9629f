"""Which torch device a run uses: ``auto`` picks cuda, then mps, then cpu; an unavailable one is an error."""

from __future__ import annotations

import torch

from fusebench import FusebenchError
from fusebench.runtime.checks import device_name


def resolve_device(name: str | None, key: str = "device") -> torch.device:
    """``auto`` (or None) picks cuda, then mps, then cpu; errors name the config ``key`` (``embed.device``,
    ``eval.device``) the name came from."""
    if name in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(device_name(name, key))
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise FusebenchError(f"{key}={name!r} was asked for but no CUDA device is available; valid here: auto, cpu.")
        if device.index is not None and device.index >= count:
            raise FusebenchError(f"{key}={name!r} was asked for but this machine has {count} CUDA device(s); valid "
                                 f"here: auto, cpu, cuda, cuda:0 to cuda:{count - 1}.")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise FusebenchError(f"{key}={name!r} was asked for but MPS is not available; valid here: auto, cpu.")
    return device
