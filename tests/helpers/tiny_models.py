"""Tiny random-weight checkpoints laid out exactly as real ones, for loading through the users' code path."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ("a an the of on in with and to at is are two three one man woman dog cat red blue green white black "
         "photo picture image sitting standing table street car bus tree sky water grass small large near "
         "field cup coffee rocket astronaut coins moon horse flower camera brick text page clock galaxy").split()


def build_word_tokenizer(folder: Path, max_length: int, eos: bool = True, lowercase: bool = False):
    """A small word-level fast tokenizer (no download), saved with save_pretrained."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    if eos:
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="</s>",
                                   model_max_length=max_length)
    fast.save_pretrained(folder)
    return len(vocab)


def build_open_clip(folder: Path, seed: int = 0) -> Path:
    """local-dir layout: open_clip_config.json + open_clip_model.safetensors (bundled BPE tokenizer)."""
    import open_clip
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model_cfg = {"embed_dim": 32,
                 "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
                 "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}
    preprocess_cfg = {"mean": [0.48, 0.45, 0.4], "std": [0.27, 0.26, 0.28], "interpolation": "bicubic",
                      "resize_mode": "shortest"}
    torch.manual_seed(seed)
    model = open_clip.CLIP(**model_cfg)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return folder


def build_hf(folder: Path, family: str, seed: int = 0) -> Path:
    """A tiny CLIPModel, SiglipModel or Siglip2Model with its tokenizer and image processor, save_pretrained."""
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        Siglip2Config,
        Siglip2ImageProcessor,
        Siglip2Model,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
    )

    folder.mkdir(parents=True, exist_ok=True)
    max_length = 16
    vocab_size = build_word_tokenizer(folder, max_length, eos=True)
    text = {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "max_position_embeddings": max_length}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}
    torch.manual_seed(seed)
    if family == "clip":
        config = CLIPConfig(text_config={**text, "eos_token_id": 2, "pad_token_id": 0, "bos_token_id": 1},
                            vision_config=vision, projection_dim=24)
        model, processor = CLIPModel(config), CLIPImageProcessor(size={"shortest_edge": 32},
                                                                 crop_size={"height": 32, "width": 32})
    elif family == "siglip":
        config = SiglipConfig(text_config={**text, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                              vision_config=vision)
        model, processor = SiglipModel(config), SiglipImageProcessor(size={"height": 32, "width": 32})
    elif family == "siglip2":
        vision2 = {k: v for k, v in vision.items() if k != "image_size"}
        config = Siglip2Config(text_config={**text, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                               vision_config={**vision2, "num_patches": 16})
        model, processor = Siglip2Model(config), Siglip2ImageProcessor(patch_size=8, max_num_patches=16)
    else:
        raise ValueError(family)
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    return folder


def build_sentence_transformers_clip(folder: Path, seed: int = 0) -> Path:
    """A tiny random-weight CLIP as sentence-transformers saves one (SentenceTransformer.save): its CLIPModel
    module over a tiny transformers CLIPModel with a processor (tokenizer + image processor)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPProcessor

    clip = build_hf(folder.parent / f"{folder.name}_clip", "clip", seed)
    CLIPProcessor(image_processor=CLIPImageProcessor.from_pretrained(clip),
                  tokenizer=AutoTokenizer.from_pretrained(clip)).save_pretrained(clip)
    try:  # sentence-transformers >= 5.4 (the CLIP module moved); older releases
        from sentence_transformers.sentence_transformer.modules import CLIPModel
    except ImportError:
        from sentence_transformers.models import CLIPModel
    SentenceTransformer(modules=[CLIPModel(str(clip))], device="cpu").save(str(folder))
    return folder
