"""Backend ``hf``: transformers ``AutoModel`` with its tokenizer and image processor (CLIP, SigLIP, SigLIP 2).

Spec keys: ``checkpoint`` (hub id or local folder), ``revision`` (hub only), ``text.padding`` and
``text.max_length``. SigLIP-family text towers pool the last position, so they must see
``padding: max_length`` at their trained length (64): a shorter pad silently ruins retrieval.
"""

from __future__ import annotations

import inspect

import torch

from fusebench.encoders.base import (
    HubWeights,
    RealEncoder,
    embedding_width,
)
from fusebench.encoders.kinds.hf import HFModel


def _features(output) -> torch.Tensor:
    """transformers < 5 returns the embedding tensor; 5 returns an output object holding it in pooler_output."""
    if isinstance(output, torch.Tensor):
        return output
    for field in ("pooler_output", "image_embeds", "text_embeds"):
        value = getattr(output, field, None)
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"cannot find embeddings in {type(output).__name__}")


class HFImageTransform:
    """PIL image -> dict of model inputs without the batch dimension (picklable for DataLoader workers)."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, image) -> dict:
        out = self.processor(images=image, return_tensors="pt")
        return {key: value[0] for key, value in out.items()}


class HFEncoder(HubWeights, RealEncoder):
    backend = "hf"
    spec_type = HFModel
    SOURCE_KEY = "checkpoint"

    def configure(self, spec: HFModel) -> None:
        self.checkpoint, self.revision = spec.checkpoint, spec.revision
        self.padding, self.max_length = spec.text.padding, spec.text.max_length
        self.tokenizer = self.processor = None

    @property
    def source(self) -> str:
        return self.checkpoint

    def versions(self) -> dict:
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}

    def text_preprocessing(self) -> dict:
        return {"padding": self.padding, "max_length": self.max_length}

    def image_preprocessing(self) -> dict:
        return {"transform": "AutoImageProcessor of the checkpoint"}

    def load(self, device: torch.device) -> None:
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

        def load_all(source: str, kwargs: dict) -> None:
            self.model = AutoModel.from_pretrained(source, **kwargs).eval().to(device)
            self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
            self.processor = AutoImageProcessor.from_pretrained(source, **kwargs)

        self.from_hub(load_all, f"transformers could not load checkpoint={self.checkpoint!r}",
                      f"a folder saved with save_pretrained (models.{self.name}.checkpoint=/path/to/folder)")
        if self.max_length is None:
            self.max_length = int(getattr(self.model.config, "text_config", self.model.config).max_position_embeddings)
        self.dim = embedding_width(self, device)

    @property
    def image_transform(self):
        return HFImageTransform(self.processor)

    def max_text_tokens(self) -> int:
        return int(self.max_length)

    def count_truncated(self, texts: list[str]) -> int:
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
        return sum(n > self.max_length for n in lengths)

    def tokenize(self, texts: list[str]) -> dict:
        encoded = self.tokenizer(texts, padding=self.padding, max_length=self.max_length, truncation=True,
                                 return_tensors="pt")
        accepted = inspect.signature(self.model.get_text_features).parameters
        return {k: v for k, v in encoded.items() if k in accepted}

    @torch.no_grad()
    def encode_images(self, batch: dict) -> torch.Tensor:
        return _features(self.model.get_image_features(**batch))

    @torch.no_grad()
    def encode_texts(self, tokens: dict) -> torch.Tensor:
        return _features(self.model.get_text_features(**tokens))
