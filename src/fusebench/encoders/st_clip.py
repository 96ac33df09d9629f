"""Backend ``sentence_transformers``: a ``SentenceTransformer`` that encodes PIL images and text (CLIP models such
as ``sentence-transformers/clip-ViT-B-32``), through its own ``encode``.

Spec keys: ``model`` (hub id or a folder saved with ``SentenceTransformer.save``), ``revision`` (hub only). The
images are decoded in the DataLoader workers and passed to ``encode`` as PIL images (its processor resizes them);
the captions go to ``encode`` as strings (its tokenizer cuts them at ``max_seq_length``).
"""

from __future__ import annotations

import torch

from fusebench import FusebenchError
from fusebench.encoders.base import HubWeights, RealEncoder, embedding_width
from fusebench.encoders.kinds.sentence_transformers import SentenceTransformersModel


def library():
    """The sentence_transformers package, or one line naming the extra that installs it."""
    try:
        import sentence_transformers
    except ImportError:
        raise FusebenchError("models of kind 'sentence_transformers' need the sentence-transformers package: pip install "
                             "'fusebench[sentence-transformers]' (in a checkout: pip install -e "
                             "'.[sentence-transformers]').") from None
    return sentence_transformers


def as_pil(image):
    """The decoded PIL image itself (``encode`` preprocesses it); module level, so DataLoader workers pickle it."""
    return image


class SentenceTransformersEncoder(HubWeights, RealEncoder):
    backend = "sentence_transformers"
    spec_type = SentenceTransformersModel
    HUB_FILE = "modules.json"  # every sentence-transformers snapshot holds it

    def configure(self, spec: SentenceTransformersModel) -> None:
        self.model_id, self.revision = spec.model, spec.revision

    @property
    def source(self) -> str:
        return self.model_id

    def versions(self) -> dict:
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__,
                "sentence_transformers": library().__version__}

    def text_preprocessing(self) -> dict:
        return {"tokenizer": "SentenceTransformer.encode (the model's tokenizer, max_seq_length)"}

    def image_preprocessing(self) -> dict:
        return {"transform": "SentenceTransformer.encode (the model's image processor)"}

    def load(self, device: torch.device) -> None:
        SentenceTransformer = library().SentenceTransformer
        def load_model(source: str, kwargs: dict) -> None:
            self.model = SentenceTransformer(source, device=str(device), **kwargs).eval()

        self.from_hub(load_model, f"sentence-transformers could not load model={self.model_id!r}",
                      f"a folder saved with SentenceTransformer.save (models.{self.name}.model=/path/to/folder)")
        modalities = getattr(self.model, "modalities", None)  # sentence-transformers >= 5.4 says what it encodes
        if modalities is not None and not {"image", "text"} <= set(modalities):
            raise FusebenchError(f"models.{self.name}.model={self.model_id!r} encodes {', '.join(map(str, modalities))} "
                                 "only; kind 'sentence_transformers' needs one model that encodes both images and "
                                 "text (a CLIP model, e.g. sentence-transformers/clip-ViT-B-32).")
        self.dim = embedding_width(self, device)

    @property
    def image_transform(self):
        return as_pil

    def max_text_tokens(self) -> int:
        return int(self.model.max_seq_length)

    def count_truncated(self, texts: list[str]) -> int:
        lengths = [len(ids) for ids in self.model.tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
        return sum(n > self.max_text_tokens() for n in lengths)

    def tokenize(self, texts: list[str]) -> list[str]:
        return list(texts)  # encode tokenizes

    def _encode(self, items: list) -> torch.Tensor:
        return self.model.encode(items, batch_size=len(items), convert_to_tensor=True, show_progress_bar=False,
                                 normalize_embeddings=False)

    @torch.no_grad()
    def encode_images(self, batch: list) -> torch.Tensor:
        return self._encode(batch)

    @torch.no_grad()
    def encode_texts(self, tokens: list[str]) -> torch.Tensor:
        return self._encode(tokens)
