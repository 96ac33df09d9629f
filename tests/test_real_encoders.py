"""Real encoder backends on tiny random-weight checkpoints, loaded through the users' code path."""

import json
import os

import numpy as np
import pytest
import torch
from helpers.corpora import write_manifest
from helpers.tiny_models import build_hf, build_open_clip
from PIL import Image

from fusebench import FusebenchError
from fusebench.app.pipeline import run
from fusebench.config.schema import EmbedConfig
from fusebench.config.specs import model_spec
from fusebench.data.tiny import load_tiny
from fusebench.encoders.hf import HFEncoder
from fusebench.encoders.models import embed, load_raw
from fusebench.encoders.openclip import OpenClipEncoder
from fusebench.encoders.query_text import preprocess_text

pytestmark = pytest.mark.slow  # whole jobs and subprocesses: not in the fast tier


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {"open_clip": build_open_clip(root / "oc"), "clip": build_hf(root / "clip", "clip"),
            "siglip": build_hf(root / "siglip", "siglip"), "siglip2": build_hf(root / "siglip2", "siglip2")}


def specs(checkpoints):
    return {
        "oc": {"kind": "open_clip", "model": f"local-dir:{checkpoints['open_clip']}"},
        "clip": {"kind": "hf", "checkpoint": str(checkpoints["clip"])},
        "siglip": {"kind": "hf", "checkpoint": str(checkpoints["siglip"]), "text": {"case": "lowercase"}},
        "siglip2": {"kind": "hf", "checkpoint": str(checkpoints["siglip2"])},
    }


def runtime(tmp_path, **kw):
    return EmbedConfig.with_defaults(str(tmp_path / "cache"), num_workers=kw.pop("num_workers", 0), batch_size=4,
                                 cache_dtype=kw.pop("cache_dtype", "fp32"), chunk_rows=kw.pop("chunk_rows", 1024), **kw)


@pytest.mark.parametrize("name", ["oc", "clip", "siglip", "siglip2"])
def test_each_backend_matches_a_direct_forward_pass(checkpoints, tmp_path, name):
    corpus = load_tiny(limit=5)
    spec = specs(checkpoints)[name]
    got = embed(name, spec, corpus, runtime(tmp_path))
    assert got.image.shape[0] == 5 and got.text.shape[0] == 25
    assert np.allclose(np.linalg.norm(got.image, axis=1), 1, atol=1e-5)
    encoder = (OpenClipEncoder if spec["kind"] == "open_clip" else HFEncoder)(name, spec)
    encoder.load(torch.device("cpu"))
    assert encoder.dim == got.image.shape[1]  # load() sets the width (the Encoder protocol)
    image = Image.open(corpus.image_paths[2]).convert("RGB")
    x = encoder.image_transform(image)
    direct = encoder.encode_images({k: v[None] for k, v in x.items()} if isinstance(x, dict) else x[None])[0].numpy()
    assert np.allclose(got.image[2], direct / np.linalg.norm(direct), atol=1e-5)
    text = preprocess_text(corpus.captions[7], model_spec(name, spec, []).text.case, None)
    direct = encoder.encode_texts(encoder.tokenize([text]))[0].numpy()
    assert np.allclose(got.text[7], direct / np.linalg.norm(direct), atol=1e-4)


def test_siglip_texts_are_padded_to_max_length(checkpoints):
    encoder = HFEncoder("siglip", specs(checkpoints)["siglip"])
    encoder.load(torch.device("cpu"))
    tokens = encoder.tokenize(["a dog", "a red bus near a tree"])
    assert tokens["input_ids"].shape == (2, 16)  # the trained length (max_position_embeddings), not the longest
    assert "max_length" == encoder.padding


def test_second_run_loads_no_model_and_text_variants_share_images(checkpoints, tmp_path, monkeypatch):
    corpus = load_tiny(limit=4)
    spec = specs(checkpoints)["clip"]
    first = load_raw("clip", spec, corpus, runtime(tmp_path))
    assert first.info["model_loaded"] and not first.info["cache"]["image_hit"]

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not be loaded on a warm cache")

    monkeypatch.setattr(HFEncoder, "load", no_load)
    again = load_raw("clip", spec, corpus, runtime(tmp_path))
    assert again.info["cache"]["image_hit"] and again.info["cache"]["text_hit"] and not again.info["model_loaded"]
    assert np.array_equal(first.image, again.image) and np.array_equal(first.text, again.text)
    monkeypatch.undo()
    lower = load_raw("clip", {**spec, "text": {"case": "lowercase"}}, corpus, runtime(tmp_path))
    assert lower.info["cache"]["image_hit"] and not lower.info["cache"]["text_hit"]
    assert lower.info["cache"]["image_key"] == first.info["cache"]["image_key"]


def test_killed_embedding_resumes(checkpoints, tmp_path, monkeypatch):
    corpus = load_tiny(limit=10)
    spec = specs(checkpoints)["oc"]
    seen = []
    original = OpenClipEncoder.encode_images

    def dying(self, batch):
        seen.append(len(batch))
        if len(seen) == 3:
            raise KeyboardInterrupt("killed")
        return original(self, batch)

    monkeypatch.setattr(OpenClipEncoder, "encode_images", dying)
    with pytest.raises(KeyboardInterrupt):
        load_raw("oc", spec, corpus, runtime(tmp_path, chunk_rows=4))
    assert seen == [4, 4, 2]  # killed on the third batch (images 8, 9): chunks 0-3 and 4-7 were saved
    monkeypatch.setattr(OpenClipEncoder, "encode_images", original)
    counted = []
    monkeypatch.setattr(OpenClipEncoder, "encode_images", lambda self, b: counted.append(len(b)) or original(self, b))
    resumed = load_raw("oc", spec, corpus, runtime(tmp_path, chunk_rows=4))
    assert sum(counted) == 2  # only images 8 and 9 are embedded again
    fresh = load_raw("oc", spec, corpus, runtime(tmp_path / "other", chunk_rows=4))
    assert np.allclose(resumed.image, fresh.image, atol=1e-6)


def _manifest_with_bad_image(tmp_path):
    corpus = load_tiny(limit=4)
    records = [{"image_id": i, "path": p, "captions": corpus.captions[5 * n:5 * n + 5]}
               for n, (i, p) in enumerate(zip(corpus.image_ids, corpus.image_paths))]
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    records.insert(2, {"image_id": "broken", "path": "broken.jpg", "captions": ["a broken file", "nothing"]})
    records.append({"image_id": "truncating", "path": records[0]["path"],
                    "captions": [" ".join(["a red bus near a tree"] * 10)]})
    return write_manifest(tmp_path / "m.jsonl", records)


def test_bad_image_fails_naming_the_file_or_is_skipped_and_counted(checkpoints, compose_cfg, tmp_path):
    manifest = _manifest_with_bad_image(tmp_path)
    base = ["dataset=manifest", f"dataset.manifest={manifest}", "models=[]", "+models.clip.kind=hf",
            f"+models.clip.checkpoint={checkpoints['clip']}", "+models.oc.kind=open_clip",
            f"+models.oc.model=local-dir:{checkpoints['open_clip']}", f"embed.cache.dir={tmp_path / 'cache'}",
            "embed.num_workers=0", "eval.bootstrap.draws=50", "fusion.top_k=10"]
    with pytest.raises(FusebenchError, match=r"broken\.jpg\) cannot be read.*embed\.on_bad_image=skip"):
        run(compose_cfg(base), str(tmp_path / "fail"))
    assert not (tmp_path / "fail" / "metrics.json").exists()
    metrics = run(compose_cfg(base + ["embed.on_bad_image=skip"]), str(tmp_path / "skip")).to_json()
    assert metrics["dataset"]["n_images"] == 5 and metrics["dataset"]["dropped_images"] == 1
    assert metrics["dataset"]["n_captions"] == 21
    kept = [c for r in map(json.loads, manifest.read_text().splitlines()) if r["image_id"] != "broken"
            for c in r["captions"]]
    clip = HFEncoder("clip", {"checkpoint": str(checkpoints["clip"])})
    clip.load(torch.device("cpu"))
    oc = OpenClipEncoder("oc", {"model": f"local-dir:{checkpoints['open_clip']}"})
    oc.load(torch.device("cpu"))
    expected = {"clip": sum(len(clip.tokenizer(c)["input_ids"]) > 16 for c in kept),
                "oc": sum(len(oc.tokenizer.encode(c)) + 2 > 16 for c in kept)}
    for name in ("clip", "oc"):
        info = metrics["retrievers"][name]["embedding"]
        assert info["skipped_images"] == 1
        assert info["truncated_captions"] == expected[name] >= 1  # the 50-word caption at least
    assert set(metrics["retrievers"]) == {"clip", "oc", "fused"}


def test_unloadable_checkpoint_gives_one_clear_message(tmp_path, monkeypatch):
    corpus = load_tiny(limit=2)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FusebenchError, match=r"could not load checkpoint='nobody/no-such-model'.*huggingface-cli download"):
        embed("x", {"kind": "hf", "checkpoint": "nobody/no-such-model"}, corpus, runtime(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FusebenchError, match="open_clip could not load"):
        embed("y", {"kind": "open_clip", "model": f"local-dir:{empty}"}, corpus, runtime(tmp_path))
    with pytest.raises(FusebenchError, match="models.z.checkpoint is not set"):
        embed("z", {"kind": "hf"}, corpus, runtime(tmp_path))


@pytest.mark.parametrize("text,fragment", [({"case": "upper"}, "valid: as_typed, canonicalize, lowercase"),
                                           ({"template": "no placeholder"}, "exactly one")])
def test_bad_text_settings(text, fragment):
    with pytest.raises(FusebenchError, match=fragment):
        model_spec("m", {"kind": "hf", "checkpoint": "x/y", "text": text}, [])


def test_text_preprocessing():
    assert preprocess_text("A Dog, running!", "as_typed", None) == "A Dog, running!"
    assert preprocess_text("A Dog, running!", "lowercase", None) == "a dog, running!"
    assert preprocess_text("A Dog,  running!", "canonicalize", None) == "a dog running"
    assert preprocess_text("A dog", "lowercase", "a photo of {}.") == "a photo of a dog."


def test_unknown_registry_model_lists_the_registry():
    from fusebench.app.cli import registry, unknown_models

    assert {"dfn5b_h14_224", "siglip2_so400m_p14_384", "metaclip_h14_fullcc", "openai_clip_b32"} <= set(registry())
    assert unknown_models(["models=[dfn5b_h14_224,nope]", "fusion=rrf"]) == ["nope"]
    assert unknown_models(["models=[sim_third],[typo]"]) == ["typo"]
    assert unknown_models(["models=[]", "+models.a.kind=hf"]) == []


def test_tiny_end_to_end_with_workers_and_warm_rerun(checkpoints, compose_cfg, tmp_path):
    overrides = ["dataset=tiny", "models=[]", "+models.oc.kind=open_clip",
                 f"+models.oc.model=local-dir:{checkpoints['open_clip']}", "+models.siglip.kind=hf",
                 f"+models.siglip.checkpoint={checkpoints['siglip']}", f"embed.cache.dir={tmp_path / 'cache'}",
                 "embed.num_workers=2", "eval.bootstrap.draws=100", "fusion.top_k=20"]
    cold = run(compose_cfg(overrides), str(tmp_path / "cold")).to_json()
    warm = run(compose_cfg(overrides), str(tmp_path / "warm")).to_json()
    for name in ("oc", "siglip"):
        assert cold["retrievers"][name]["embedding"]["model_loaded"]
        assert not warm["retrievers"][name]["embedding"]["model_loaded"]
        assert cold["retrievers"][name]["t2i"] == warm["retrievers"][name]["t2i"]
    saved = json.loads((tmp_path / "warm" / "metrics.json").read_text())
    assert saved["retrievers"]["siglip"]["embedding"]["versions"]["transformers"]
    assert os.path.isdir(saved["retrievers"]["oc"]["embedding"]["cache"]["dir"])


def test_nonstandard_coco_run_is_marked_everywhere(checkpoints, compose_cfg, tmp_path, capsys, monkeypatch):
    from test_karpathy import mini_coco

    mini_coco(tmp_path / "data" / "coco")
    monkeypatch.setenv("FUSEBENCH_DATA", str(tmp_path / "data"))
    base = ["dataset=coco5k", "models=[]", "+models.oc.kind=open_clip", f"+models.oc.model=local-dir:{checkpoints['open_clip']}",
            f"embed.cache.dir={tmp_path / 'cache'}", "embed.num_workers=0", "eval.bootstrap.draws=50"]
    with pytest.raises(FusebenchError, match="not comparable"):
        run(compose_cfg(base), str(tmp_path / "refused"))
    metrics = run(compose_cfg(base + ["dataset.allow_nonstandard=true"]), str(tmp_path / "run")).to_json()
    assert metrics["dataset"]["nonstandard"] is True and metrics["dataset"]["n_images"] == 3
    assert "NON-STANDARD" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["dataset"]["nonstandard"] is True


def test_tuning_on_karpathy_val_then_test(checkpoints, compose_cfg, tmp_path, capsys, monkeypatch):
    """tune=weights on a Karpathy dataset tunes on its val split (embedded with the same models and cache), and
    each setting's value there is what a plain run on dataset.split=val gives; the test split is evaluated once."""
    from test_karpathy import mini_coco

    mini_coco(tmp_path / "data" / "coco")
    monkeypatch.setenv("FUSEBENCH_DATA", str(tmp_path / "data"))
    base = ["dataset=coco5k", "dataset.allow_nonstandard=true", "models=[]",
            "+models.oc.kind=open_clip", f"+models.oc.model=local-dir:{checkpoints['open_clip']}",
            "+models.siglip.kind=hf", f"+models.siglip.checkpoint={checkpoints['siglip']}",
            f"embed.cache.dir={tmp_path / 'cache'}", "embed.num_workers=0", "eval.bootstrap.draws=50",
            "eval.ks=[1]", "fusion.top_k=5", "logger=none", "plots=false"]
    record = run(compose_cfg(base + ["tune=weights", "tune.weights=[0.25,4]"]), str(tmp_path / "tuned"))
    tune = record.tune
    assert tune.split == "val" and (tune.n_images, tune.n_captions) == (2, 10)
    assert record.dataset.n_images == 3 and len(tune.curve) == 2
    for point in tune.curve:
        plain = run(compose_cfg(base + ["dataset.split=val", f"+models.siglip.weight={point.weights['siglip']}"]),
                    str(tmp_path / "plain"))
        assert plain.retrievers["fused"].recall("t2i", 1) == pytest.approx(point.value, abs=1e-9)
    assert record.retrievers["siglip"].spec.weight == tune.chosen.weights["siglip"]
    assert "tuned on the val split (2 images, 10 captions)" in capsys.readouterr().out
