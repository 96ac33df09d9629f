"""Kind ``open_clip``: an open_clip model (``fusebench.encoders.openclip``), embedded through the cache."""

from __future__ import annotations

from dataclasses import dataclass

from fusebench.config.specs import RealModel
from fusebench.encoders.kinds import ModelKind, _real, register
from fusebench.runtime import checks


@dataclass
class OpenClipModel(RealModel):
    """Kind ``open_clip``: ``model`` (a built-in name, ``hf-hub:org/repo`` or ``local-dir:/path``), ``pretrained``
    (a tag or a local weights file), ``context_length`` (the tokenizer's, null: the model's)."""

    model: str | None = None
    pretrained: str | None = None
    context_length: int | None = None

    def __post_init__(self):
        super().__post_init__()
        self.need("model", "an open_clip model name (e.g. ViT-B-32), 'hf-hub:org/repo' or "
                           "'local-dir:/path/to/checkpoint'")
        self.context_length = checks.optional_integer(self.context_length, f"models.{self.name}.context_length", 1)


def backend(name: str, spec: OpenClipModel):
    from fusebench.encoders.openclip import (
        OpenClipEncoder,  # lazy: heavy (torch, numpy, numba); torch: only when a cache miss needs the model
    )

    return OpenClipEncoder(name, spec)


KIND = register(ModelKind("open_clip", OpenClipModel, _real.load, "an open_clip model (name, hf-hub: or local-dir:)",
                          backend, order=30))
