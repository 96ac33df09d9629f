"""Backend ``open_clip``: built-in names with pretrained tags, ``hf-hub:org/repo`` or ``local-dir:/path``.

Spec keys: ``model`` (e.g. ViT-H-14-quickgelu, hf-hub:timm/ViT-SO400M-14-SigLIP-384, local-dir:/ckpt),
``pretrained`` (a tag such as dfn5b, or a local .safetensors/.pt file; ignored with a schema),
``context_length`` (optional override of the tokenizer's).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from fusebench.encoders.base import RealEncoder, cached_files_only, embedding_width, hub_unavailable, load_error
from fusebench.encoders.fingerprint import path_fingerprint
from fusebench.encoders.kinds.open_clip import OpenClipModel


class OpenClipEncoder(RealEncoder):
    backend = "open_clip"
    spec_type = OpenClipModel

    def configure(self, spec: OpenClipModel) -> None:
        self.model_id, self.pretrained, self.context_length = spec.model, spec.pretrained, spec.context_length
        self.preprocess = self.tokenizer = None

    @property
    def local_weights(self) -> bool:
        """The weights are local files: a ``local-dir:`` folder or a ``pretrained`` file."""
        return str(self.model_id).startswith("local-dir:") or bool(
            self.pretrained and Path(str(self.pretrained)).expanduser().is_file())

    def hub_repo(self) -> str | None:
        """The Hugging Face repo the weights come from (``hf-hub:`` models; open_clip's registry for a pretrained
        tag); None for local weights or an unknown tag."""
        model = str(self.model_id)
        if model.startswith("hf-hub:"):
            return model[len("hf-hub:"):]
        if self.local_weights or not self.pretrained:
            return None
        import open_clip

        hub = open_clip.get_pretrained_cfg(model, str(self.pretrained)).get("hf_hub", "")
        return os.path.split(hub)[0] or None  # 'org/repo/' or 'org/repo/file.bin'

    def fingerprint(self) -> dict:
        """Identifies the weights without loading them."""
        out = {"backend": self.backend, "model": str(self.model_id), "pretrained": self.pretrained}
        if str(self.model_id).startswith("local-dir:"):
            out["files"] = path_fingerprint(Path(str(self.model_id)[len("local-dir:"):]))
        elif self.pretrained and Path(str(self.pretrained)).expanduser().is_file():
            out["files"] = path_fingerprint(Path(str(self.pretrained)).expanduser())
        return out

    def versions(self) -> dict:
        import open_clip

        return {"torch": torch.__version__, "open_clip": open_clip.__version__}

    def text_preprocessing(self) -> dict:
        return {"tokenizer": "open_clip.get_tokenizer", "context_length": self.context_length}

    def image_preprocessing(self) -> dict:
        return {"transform": "open_clip pretrained preprocess_cfg"}

    def load(self, device: torch.device) -> None:
        import open_clip

        repo = self.hub_repo()
        offline = hub_unavailable() if repo else None  # no hub: the local cache only, no retries
        try:
            with cached_files_only(bool(offline)):
                model, _, preprocess = open_clip.create_model_and_transforms(
                    self.model_id, pretrained=self.pretrained, device=device, weights_only=True)
                self.tokenizer = open_clip.get_tokenizer(self.model_id, context_length=self.context_length)
        except Exception as err:  # noqa: BLE001 - turn any loader failure into one actionable message
            raise load_error(self.name, f"open_clip could not load model={self.model_id!r} pretrained={self.pretrained!r}",
                             err, offline, repo, "a local file (pretrained=/path/model.safetensors) or folder "
                             "(model=local-dir:/path with open_clip_config.json and weights)") from None
        self.model, self.preprocess = model.eval(), preprocess
        self.dim = embedding_width(self, device)

    @property
    def image_transform(self):
        return self.preprocess

    def max_text_tokens(self) -> int:
        return int(getattr(self.tokenizer, "context_length", 77))

    def count_truncated(self, texts: list[str]) -> int:
        limit = self.max_text_tokens()
        inner = getattr(self.tokenizer, "tokenizer", None)
        if inner is not None and callable(inner):  # HFTokenizer: the wrapped transformers tokenizer
            lengths = [len(ids) for ids in inner(texts, truncation=False, verbose=False)["input_ids"]]
        else:  # SimpleTokenizer: start and end tokens around the BPE tokens
            lengths = [len(self.tokenizer.encode(t)) + 2 for t in texts]
        return sum(n > limit for n in lengths)

    def tokenize(self, texts: list[str]):
        return self.tokenizer(texts)

    @torch.no_grad()
    def encode_images(self, batch: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(batch)

    @torch.no_grad()
    def encode_texts(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(tokens)
