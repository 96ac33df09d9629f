"""Kind ``hf``: a transformers ``AutoModel`` checkpoint (CLIP, SigLIP, SigLIP 2; ``fusebench.encoders.hf``),
embedded through the cache."""

from __future__ import annotations

from dataclasses import dataclass, field

from fusebench.config.specs import RealModel, TextConfig
from fusebench.encoders.kinds import ModelKind, _real, register
from fusebench.runtime import checks


@dataclass
class HFTextConfig(TextConfig):
    """An hf model's text settings: also its tokenizer's ``padding`` and ``max_length`` (null: the model's)."""

    padding: str | bool = "max_length"
    max_length: int | None = None

    def __post_init__(self):
        super().__post_init__()
        self.max_length = checks.optional_integer(self.max_length, f"{self.where}.max_length", 1,
                                                  "null = the model's trained length")


@dataclass
class HFModel(RealModel):
    """Kind ``hf``: ``checkpoint`` (a hub id or a folder saved with save_pretrained) at ``revision`` (hub only)."""

    checkpoint: str | None = None
    revision: str | None = None
    text: HFTextConfig = field(default_factory=HFTextConfig)

    def __post_init__(self):
        super().__post_init__()
        self.need("checkpoint", "a Hugging Face model id (e.g. google/siglip2-so400m-patch14-384) or a local folder "
                                "saved with save_pretrained")


def backend(name: str, spec: HFModel):
    from fusebench.encoders.hf import (
        HFEncoder,  # lazy: heavy (torch, numpy, numba); torch, transformers: only when a cache miss needs the model
    )

    return HFEncoder(name, spec)


KIND = register(ModelKind("hf", HFModel, _real.load, "a transformers AutoModel checkpoint (CLIP, SigLIP)", backend,
                          order=40))
