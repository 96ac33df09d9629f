"""Model kinds as plugins (issue 40, items 1 and 2): every kind is one module of ``encoders/kinds/``, the docs'
models row names each kind and its keys, and the sentence_transformers kind, added as a user would, gives the
L2-normalised rows of the model's own ``encode`` through the embedding cache."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_models import build_sentence_transformers_clip

from fusebench import FusebenchError
from fusebench.config.specs import MODEL_KINDS, ModelSpec, model_spec
from fusebench.encoders.kinds import REGISTRY
from fusebench.runtime.checks import config_keys

DOCS = Path(__file__).resolve().parents[1] / "docs"
SHARED = set(config_keys(ModelSpec))  # every kind's keys (kind, weight, text, label, published)


def models_row() -> str:
    return next(line for line in (DOCS / "config.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("| `models` |"))


def test_config_and_encoders_read_one_registry():
    assert REGISTRY is MODEL_KINDS
    assert {"sim", "vectors", "open_clip", "hf", "sentence_transformers"} <= set(REGISTRY.names())
    for kind in REGISTRY.items():
        assert issubclass(kind.spec, ModelSpec) and callable(kind.load) and kind.doc
        assert type(model_spec("m", {"kind": kind.name, **minimal(kind.name)}, [])) is kind.spec


def minimal(kind: str) -> dict:
    """The fewest keys a spec of ``kind`` needs (the first required key its check names, filled in)."""
    given: dict = {}
    for _ in range(8):
        try:
            model_spec("m", {"kind": kind, **given}, [])
            return given
        except FusebenchError as err:
            key = re.match(r"models\.m\.(\w+) is (?:not set|missing)", str(err))
            assert key, str(err)
            given[key.group(1)] = 1 if kind == "sim" else "x"
    raise AssertionError(f"no minimal spec for {kind}")


def test_docs_models_row_names_every_kind_and_its_keys():
    row = models_row()
    for kind in REGISTRY.items():
        assert f"`{kind.name}`" in row, f"docs/config.md's models row does not name kind {kind.name}"
        own = [key for key in config_keys(kind.spec) if key not in SHARED]
        section = re.search(rf"; {kind.name}: ([^;|]*)", row)
        assert section, f"docs/config.md's models row has no '; {kind.name}: KEYS' part"
        missing = [key for key in own if f"`{key}`" not in section.group(1)]
        assert not missing, f"docs/config.md's models row lacks {kind.name}'s keys {missing}"


def test_an_unknown_key_of_the_new_kind_is_named_with_the_valid_ones():
    with pytest.raises(FusebenchError, match=r"models\.m.*checkpoint.*model.*revision"):
        model_spec("m", {"kind": "sentence_transformers", "model": "a/b", "checkpoint": "x"}, [])
    with pytest.raises(FusebenchError, match=r"models\.m\.model is not set"):
        model_spec("m", {"kind": "sentence_transformers"}, [])


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    return build_sentence_transformers_clip(tmp_path_factory.mktemp("st") / "st_clip")


def runtime(tmp_path):
    from fusebench.config.schema import EmbedConfig

    return EmbedConfig.with_defaults(str(tmp_path / "cache"), num_workers=0, batch_size=2, cache_dtype="fp32",
                                     chunk_rows=1024)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_sentence_transformers_rows_are_its_encode_l2_normalised(st_model, tmp_path):
    """The kind's rows equal the slow reference: SentenceTransformer.encode of every image and caption, then L2
    normalisation (float32); a second run reads them from the cache without loading the model."""
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    from fusebench.data.tiny import load_tiny
    from fusebench.encoders.models import embed

    corpus = load_tiny(limit=5)
    spec = {"kind": "sentence_transformers", "model": str(st_model)}
    got = embed("st", spec, corpus, runtime(tmp_path))
    reference = SentenceTransformer(str(st_model), device="cpu")
    images = reference.encode([Image.open(p).convert("RGB") for p in corpus.image_paths], convert_to_numpy=True)
    texts = reference.encode(list(corpus.captions), convert_to_numpy=True)
    for rows, want in ((got.image, images), (got.text, texts)):
        assert rows.dtype == np.float32 and rows.shape == want.shape
        assert np.allclose(rows, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-5)
    again = embed("st", spec, corpus, runtime(tmp_path))
    assert not again.info["model_loaded"] and again.info["cache"]["image_hit"] and again.info["cache"]["text_hit"]
    assert np.array_equal(again.image, got.image) and np.array_equal(again.text, got.text)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_the_cache_key_holds_the_sentence_transformers_version(st_model, tmp_path, monkeypatch):
    import sentence_transformers

    from fusebench.data.tiny import load_tiny
    from fusebench.encoders.models import load_raw

    corpus = load_tiny(limit=3)
    spec = {"kind": "sentence_transformers", "model": str(st_model)}
    first = load_raw("st", spec, corpus, runtime(tmp_path))
    assert first.info["versions"]["sentence_transformers"] == sentence_transformers.__version__
    assert first.info["model"]["backend"] == "sentence_transformers" and first.info["model"]["files"]
    monkeypatch.setattr(sentence_transformers, "__version__", "0.0.0-other")
    other = load_raw("st", spec, corpus, runtime(tmp_path))
    assert not other.info["cache"]["image_hit"] and other.info["cache"]["image_key"] != first.info["cache"]["image_key"]


@pytest.mark.slow
def test_a_tiny_job_runs_with_a_sentence_transformers_model(st_model, compose_cfg, tmp_path):
    """A whole job on dataset=tiny with two models of the new kind (the second lowercases its queries), fused."""
    from fusebench import FUSED
    from fusebench.app.pipeline import run

    overrides = ["dataset=tiny", "models=[]", f"embed.cache.dir={tmp_path / 'cache'}",
                 "eval.bootstrap.draws=100", "fusion.top_k=20", "embed.num_workers=2"]
    for name in ("st", "st_lower"):
        overrides += [f"+models.{name}.kind=sentence_transformers", f"+models.{name}.model={st_model}"]
    overrides.append("+models.st_lower.text.case=lowercase")
    result = run(compose_cfg(overrides), str(tmp_path / "run")).to_json()
    for name in ("st", "st_lower"):
        embedding = result["retrievers"][name]["embedding"]
        assert embedding["versions"]["sentence_transformers"] and embedding["model"]["backend"] == "sentence_transformers"
    assert result["retrievers"]["st_lower"]["embedding"]["cache"]["image_hit"]  # text variants share image rows
    assert FUSED in result["retrievers"] and (tmp_path / "run" / "metrics.json").is_file()
