from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers.corpora import write_manifest

from fusebench import FusebenchError
from fusebench.config.specs import SimParams
from fusebench.data.kinds.sim import SimDatasetConfig
from fusebench.data.manifest import load_manifest
from fusebench.data.simulated import make_sim_corpus
from fusebench.encoders.models import embed


@pytest.fixture
def corpus(tmp_path):
    return load_manifest(write_manifest(tmp_path / "m.jsonl", [
        {"image_id": "a", "captions": ["x", "y"]}, {"image_id": "b", "captions": ["z"]}, {"image_id": "c"}]))


def _spec(tmp_path, image, text):
    np.save(tmp_path / "img.npy", image)
    np.save(tmp_path / "txt.npy", text)
    return {"kind": "vectors", "image_embeddings": str(tmp_path / "img.npy"), "text_embeddings": str(tmp_path / "txt.npy")}


def test_vectors_are_loaded_and_normalised(tmp_path, corpus):
    rng = np.random.default_rng(0)
    emb = embed("a", _spec(tmp_path, rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) * 5), corpus)
    assert emb.image.dtype == np.float32 and emb.dim == 4
    assert np.allclose(np.linalg.norm(emb.text, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("image,text,fragment", [
    (np.ones((2, 4)), np.ones((3, 4)), r"img\.npy: image embeddings has 2 rows but the corpus has 3 images"),
    (np.ones((3, 4)), np.ones((4, 4)), r"txt\.npy: text embeddings has 4 rows but the corpus has 3 captions"),
    (np.ones((3, 4)), np.ones((3, 5)), r"image embeddings have dimension 4 .* text embeddings have 5"),
    (np.array([[1, 0], [np.nan, 1], [1, 1]]), np.ones((3, 2)), r"img\.npy: image embeddings row 1 contains NaN or inf"),
    (np.ones((3, 2)), np.array([[1, 0], [1, 1], [np.inf, 0]]), r"txt\.npy: text embeddings row 2 contains NaN or inf"),
    (np.array([[1, 0], [1, 1], [0, 0]]), np.ones((3, 2)), r"img\.npy: image embeddings row 2 is all zeros"),
    (np.ones(3), np.ones((3, 2)), r"must be a 2-D array"),
])
def test_vectors_bad_input(tmp_path, corpus, image, text, fragment):
    with pytest.raises(FusebenchError, match=fragment):
        embed("a", _spec(tmp_path, image, text), corpus)


def test_vectors_missing_files_and_keys(tmp_path, corpus):
    with pytest.raises(FusebenchError, match="models.a.image_embeddings is not set"):
        embed("a", {"kind": "vectors"}, corpus)
    with pytest.raises(FusebenchError, match="models.a.image_embeddings: file not found"):
        embed("a", {"kind": "vectors", "image_embeddings": str(tmp_path / "x.npy"), "text_embeddings": "y"}, corpus)
    (tmp_path / "bad.npy").write_bytes(b"not an array")
    with pytest.raises(FusebenchError, match=r"bad\.npy is not a \.npy file \(it does not start with NumPy.s header\)"):
        embed("a", {"kind": "vectors", "image_embeddings": str(tmp_path / "bad.npy"), "text_embeddings": "y"}, corpus)


def test_unknown_kind_lists_valid_kinds(corpus):
    from fusebench.encoders.kinds import REGISTRY

    assert {"sim", "vectors", "open_clip", "hf"} <= set(REGISTRY.names())
    valid = ", ".join(REGISTRY.names())
    with pytest.raises(FusebenchError, match=f"models.a.kind='clip' is not a known model kind; valid kinds: {valid}"):
        embed("a", {"kind": "clip"}, corpus)


def test_sim_model_needs_sim_corpus_and_is_seeded(corpus):
    with pytest.raises(FusebenchError, match="model kind 'sim' needs dataset=sim"):
        embed("s", {"kind": "sim", "dim": 96, "seed": 1, "image_noise": 0.5, "text_noise": 0.5}, corpus)
    with pytest.raises(FusebenchError, match="models.s.dim is missing"):
        embed("s", {"kind": "sim"}, corpus)
    sim = make_sim_corpus(SimDatasetConfig(n_images=30, n_captions=150))
    a = embed("s", {"kind": "sim", "dim": 96, "seed": 1, "image_noise": 0.5, "text_noise": 0.5}, sim)
    b = embed("s", {"kind": "sim", "dim": 96, "seed": 1, "image_noise": 0.5, "text_noise": 0.5}, sim)
    c = embed("s", {"kind": "sim", "dim": 96, "seed": 2, "image_noise": 0.5, "text_noise": 0.5}, sim)
    assert a.image.shape == (30, 96) and a.text.shape == (150, 96)
    assert np.array_equal(a.text, b.text) and not np.array_equal(a.text, c.text)


def test_sim_rows_are_kept_for_the_next_job_read_only_and_keyed_on_every_setting():
    from fusebench.data.simulated import make_sim_corpus
    from fusebench.encoders.simulated import sim_arrays

    corpus = make_sim_corpus(SimDatasetConfig(n_images=30, n_captions=70, seed=3))
    spec = {"dim": 8, "image_noise": 0.4, "text_noise": 0.6, "seed": 1}
    image, text = sim_arrays(SimParams(**spec), corpus)
    again = sim_arrays(SimParams(**spec), corpus)
    assert again[0] is image and again[1] is text  # the same rows, not recomputed
    assert not image.flags.writeable and not text.flags.writeable
    for change in ({"seed": 2}, {"text_noise": 0.7}):
        other = sim_arrays(SimParams(**{**spec, **change}), corpus)
        assert other[0] is not image and not np.array_equal(other[1], text)
    assert sim_arrays(SimParams(**{**spec, "dim": 9}), corpus)[0].shape == (30, 9)
    other_corpus = make_sim_corpus(SimDatasetConfig(n_images=30, n_captions=70, seed=4))
    assert not np.array_equal(sim_arrays(SimParams(**spec), other_corpus)[0], image)


def test_sim_rows_of_large_corpora_are_not_kept(monkeypatch):
    from fusebench.data.simulated import make_sim_corpus
    from fusebench.encoders import simulated
    from fusebench.runtime import state

    monkeypatch.setattr(state.current().shared, "entry_budget", 1000)  # the process state keeps the rows
    corpus = make_sim_corpus(SimDatasetConfig(n_images=30, n_captions=70, seed=5))
    spec = SimParams(dim=8, seed=7, image_noise=0.5, text_noise=0.5)
    first = simulated.sim_arrays(spec, corpus)
    assert simulated.sim_arrays(spec, corpus)[0] is not first[0]  # 3,200 bytes > 1,000: recomputed


def test_every_real_backend_implements_the_encoder_protocol():
    """Every kind with a backend (a real kind) builds an Encoder from a shipped conf/models file of that kind."""
    from fusebench.config import CONFIG_DIR
    from fusebench.config.specs import RealModel, model_spec
    from fusebench.encoders.base import Encoder
    from fusebench.encoders.kinds import REGISTRY

    shipped = {}
    for path in sorted((Path(CONFIG_DIR) / "models").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        shipped.setdefault(spec["kind"], (path.stem, spec))
    real = [kind for kind in REGISTRY.items() if kind.backend is not None]
    assert {kind.name for kind in real} == {kind.name for kind in REGISTRY.items() if issubclass(kind.spec, RealModel)}
    for kind in real:
        assert kind.name in shipped, f"no conf/models/*.yaml of kind {kind.name}"
        name, given = shipped[kind.name]
        encoder = kind.backend(name, model_spec(name, given, []))  # nothing loaded yet
        assert isinstance(encoder, Encoder) and encoder.backend == kind.name and encoder.dim == 0


def test_when_every_image_is_unreadable_skipping_them_is_one_error_not_an_empty_run():
    """embed.on_bad_image=skip leaves the unreadable images out; when that is every one, nothing is left to search
    (a probe's run ended in a traceback from the search): one line saying so."""
    from fusebench import FusebenchError
    from fusebench.data.corpus import Corpus
    from fusebench.encoders.base import RawEmbeddings
    from fusebench.encoders.models import drop_unreadable

    corpus = Corpus("probe", ["a", "b"], ["x", "y", "z"], np.array([0, 1, 1]))
    nan = np.full((2, 4), np.nan, dtype=np.float32)
    raw = RawEmbeddings("m", nan, np.ones((3, 4), np.float32), "i", "t", {}, info={"skipped_images": 2})
    with pytest.raises(FusebenchError, match="none of the 2 images of probe could be read"):
        drop_unreadable([raw], corpus)
    half = RawEmbeddings("m", np.vstack([nan[:1], np.ones((1, 4), np.float32)]), np.ones((3, 4), np.float32), "i",
                         "t", {}, info={"skipped_images": 1})
    _, smaller = drop_unreadable([half], corpus)
    assert smaller.image_ids == ["b"] and smaller.n_captions == 2
