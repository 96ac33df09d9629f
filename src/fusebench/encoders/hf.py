"""Backend ``hf``: transformers ``AutoModel`` with its tokenizer and image processor (CLIP, SigLIP, SigLIP 2).

Spec keys: ``checkpoint`` (hub id or local folder), ``revision`` (hub only), ``text.padding`` and
``text.max_length``. SigLIP-family text towers pool the last position, so they must see
``padding: max_length`` at their trained length (64): a shorter pad silently ruins retrieval.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from fusebench.config.specs import model_spec
from fusebench.encoders.base import cached_files_only, embedding_width, hub_unavailable, load_error
from fusebench.encoders.fingerprint import hf_hub_revision, path_fingerprint
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


class HFEncoder:
    backend = "hf"

    def __init__(self, name: str, spec: HFModel | Mapping):
        """``spec``: the model's typed spec (a mapping of its keys is converted and checked)."""
        if not isinstance(spec, HFModel):
            spec = model_spec(name, {"kind": self.backend, **spec}, [])
        self.name = name
        self.checkpoint, self.revision = spec.checkpoint, spec.revision
        self.padding, self.max_length = spec.text.padding, spec.text.max_length
        self.model = self.tokenizer = self.processor = None
        self.dim = 0  # known once loaded

    @property
    def local_path(self) -> Path | None:
        path = Path(str(self.checkpoint)).expanduser()
        return path if path.is_dir() else None

    @property
    def hub_repo(self) -> str | None:
        """The Hugging Face repo id the checkpoint names; None for a folder (or a path that is not one)."""
        if self.local_path is not None or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", str(self.checkpoint)):
            return None
        return str(self.checkpoint)

    def fingerprint(self) -> dict:
        out = {"backend": self.backend, "checkpoint": str(self.checkpoint), "revision": self.revision}
        if self.local_path is not None:
            out["files"] = path_fingerprint(self.local_path)
        else:
            out["commit"] = hf_hub_revision(str(self.checkpoint), self.revision)
        return out

    def versions(self) -> dict:
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}

    def text_preprocessing(self) -> dict:
        return {"padding": self.padding, "max_length": self.max_length}

    def image_preprocessing(self) -> dict:
        return {"transform": "AutoImageProcessor of the checkpoint"}

    def load(self, device: torch.device) -> None:
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

        source = str(self.local_path or self.checkpoint)
        offline = hub_unavailable() if self.hub_repo else None  # no hub: the local cache only, no retries
        try:
            kwargs = {"revision": self.revision} if self.local_path is None and self.revision else {}
            if offline:
                kwargs["local_files_only"] = True
            with cached_files_only(bool(offline)):
                self.model = AutoModel.from_pretrained(source, **kwargs).eval().to(device)
                self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
                self.processor = AutoImageProcessor.from_pretrained(source, **kwargs)
        except Exception as err:  # noqa: BLE001 - turn any loader failure into one actionable message
            raise load_error(self.name, f"transformers could not load checkpoint={self.checkpoint!r}", err, offline,
                             self.hub_repo,
                             f"a folder saved with save_pretrained (models.{self.name}.checkpoint=/path/to/folder)"
                             ) from None
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
