"""Real-model faults (issue 20): unreadable images under each embed.on_bad_image policy, cache entries made under
another policy, DataLoader workers, bad device names, and weights that cannot be downloaded. Each ends in one
``fusebench: error:`` line that names the file or key; tiny random-weight models, tiny JPEGs, no network."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.corpora import jpeg, write_manifest
from helpers.tiny_models import build_hf, build_open_clip

import fusebench.encoders.images as images_module
import fusebench.encoders.real as real_module
from fusebench import FusebenchError
from fusebench.app.pipeline import run
from fusebench.config.schema import EmbedConfig
from fusebench.data.manifest import load_manifest
from fusebench.encoders.devices import resolve_device
from fusebench.encoders.hf import HFEncoder
from fusebench.encoders.images import BadImageError, image_batches
from fusebench.encoders.models import load_raw
from fusebench.encoders.openclip import OpenClipEncoder

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))
BROKEN = b"\xff\xd8\xff\xe0 this is not a jpeg"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {"oc": build_open_clip(root / "oc"), "clip": build_hf(root / "clip", "clip")}


def spec(checkpoints, name):
    if name == "oc":
        return {"kind": "open_clip", "model": f"local-dir:{checkpoints['oc']}"}
    return {"kind": "hf", "checkpoint": str(checkpoints["clip"])}


def bad_manifest(tmp_path: Path, n: int = 6, bad: int = 2) -> Path:
    """``n`` tiny JPEGs with two captions each; image ``bad`` is a file that is not a JPEG."""
    records = []
    for i in range(n):
        path = tmp_path / "images" / f"{i}.jpg"
        if i == bad:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(BROKEN)
        else:
            jpeg(path, (40 * i % 256, 200 - 20 * i, 90))
        records.append({"image_id": f"img{i}", "path": f"images/{i}.jpg",
                        "captions": [f"a red bus near a tree {i}", f"a dog on the grass {i}"]})
    return write_manifest(tmp_path / "M.jsonl", records)


def runtime(cache: Path, **kw) -> EmbedConfig:
    return EmbedConfig.with_defaults(str(cache), batch_size=2, num_workers=kw.pop("num_workers", 0),
                                 cache_dtype="fp32", **kw)


def fresh_message(checkpoints, name, corpus, tmp_path) -> str:
    with pytest.raises(BadImageError) as err:
        load_raw(name, spec(checkpoints, name), corpus, runtime(tmp_path / "fresh-cache"))
    return str(err.value)


# ------------------------------------------------------------ item 3: fail after a skip run filled the cache

@pytest.mark.slow  # builds and runs real (tiny) open_clip and HF models
@pytest.mark.parametrize("name", ["clip", "oc"])
def test_fail_after_skip_run_raises_as_a_fresh_computation(checkpoints, tmp_path, name):
    corpus = load_manifest(bad_manifest(tmp_path))
    skipped = load_raw(name, spec(checkpoints, name), corpus, runtime(tmp_path / "cache", on_bad_image="skip"))
    assert skipped.info["skipped_images"] == 1
    with pytest.raises(BadImageError) as err:
        load_raw(name, spec(checkpoints, name), corpus, runtime(tmp_path / "cache"))
    assert "2.jpg) cannot be read" in str(err.value) and "\n" not in str(err.value)
    assert str(err.value) == fresh_message(checkpoints, name, corpus, tmp_path)
    again = load_raw(name, spec(checkpoints, name), corpus, runtime(tmp_path / "cache", on_bad_image="skip"))
    assert again.info["cache"]["image_hit"] and again.info["skipped_images"] == 1  # skip still reuses the entry


@pytest.mark.slow  # builds and runs real (tiny) open_clip and HF models
def test_fail_resuming_the_chunks_of_a_killed_skip_run_raises(checkpoints, tmp_path, monkeypatch):
    """Not only a complete entry: chunks a killed skip run left hold the skipped image too."""
    corpus = load_manifest(bad_manifest(tmp_path, n=6, bad=1))
    original, calls = HFEncoder.encode_images, []

    def dies_on_second_batch(self, batch):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return original(self, batch)

    monkeypatch.setattr(HFEncoder, "encode_images", dies_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        load_raw("clip", spec(checkpoints, "clip"), corpus,
                 runtime(tmp_path / "cache", on_bad_image="skip", chunk_rows=2))
    monkeypatch.setattr(HFEncoder, "encode_images", original)
    with pytest.raises(BadImageError, match=r"image 1 \(.*1\.jpg\) cannot be read"):
        load_raw("clip", spec(checkpoints, "clip"), corpus, runtime(tmp_path / "cache", chunk_rows=2))


@pytest.mark.slow  # builds and runs real (tiny) open_clip and HF models
def test_a_skipped_image_that_reads_now_is_embedded(checkpoints, tmp_path, monkeypatch):
    """An image skipped when the entry was made, readable now (file size and mtime unchanged: permissions, a
    newer decoder): under either policy a fresh computation would embed it, so the run embeds it."""
    corpus = load_manifest(bad_manifest(tmp_path, bad=99))
    real_open = images_module.open_rgb

    def flaky(path):
        if str(path).endswith("3.jpg"):
            raise OSError("permission denied")
        return real_open(path)

    monkeypatch.setattr(images_module, "open_rgb", flaky)
    monkeypatch.setattr(real_module, "open_rgb", flaky)
    first = load_raw("clip", spec(checkpoints, "clip"), corpus, runtime(tmp_path / "cache", on_bad_image="skip"))
    assert first.info["skipped_images"] == 1 and np.isnan(first.image[3]).all()
    monkeypatch.undo()
    expected = load_raw("clip", spec(checkpoints, "clip"), corpus, runtime(tmp_path / "other")).image
    for policy in ("fail", "skip"):
        got = load_raw("clip", spec(checkpoints, "clip"), corpus, runtime(tmp_path / "cache", on_bad_image=policy))
        assert got.info["skipped_images"] == 0 and np.allclose(got.image, expected, atol=1e-5)


@pytest.mark.slow
def test_fail_after_skip_through_the_pipeline(checkpoints, compose_cfg, tmp_path):
    manifest = bad_manifest(tmp_path)
    base = ["dataset=manifest", f"dataset.manifest={manifest}", "models=[]", "+models.clip.kind=hf",
            f"+models.clip.checkpoint={checkpoints['clip']}", f"embed.cache.dir={tmp_path / 'cache'}",
            "embed.num_workers=0", "eval.bootstrap.draws=20", "eval.ks=[1,5]", "logger=none", "plots=false"]
    record = run(compose_cfg(base + ["embed.on_bad_image=skip"]), str(tmp_path / "skip")).to_json()
    assert record["dataset"]["n_images"] == 5
    with pytest.raises(BadImageError, match=r"2\.jpg\) cannot be read.*embed\.on_bad_image=skip"):
        run(compose_cfg(base), str(tmp_path / "fail"))
    assert not (tmp_path / "fail" / "metrics.json").exists()


# ------------------------------------------------------------ item 10: a bad image in a DataLoader worker

def _to_tensor(image):  # module level: DataLoader workers unpickle it
    return torch.from_numpy(np.asarray(image, dtype=np.float32).copy())


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("workers", [1, 2])
def test_bad_image_in_a_worker_is_the_same_one_line_error(tmp_path, workers):
    corpus = load_manifest(bad_manifest(tmp_path, n=7, bad=4))

    def error(num_workers):
        with pytest.raises(BadImageError) as err:
            for _ in image_batches(corpus.image_paths, np.arange(7), _to_tensor, 2, num_workers, False, "fail"):
                pass
        return str(err.value)

    in_process = error(0)
    assert in_process.startswith("image 4 (") and "4.jpg) cannot be read" in in_process and "\n" not in in_process
    assert error(workers) == in_process
    batches = list(image_batches(corpus.image_paths, np.arange(7), _to_tensor, 2, workers, False, "skip"))
    assert [b[0] for b in batches] == [[0, 1], [2, 3], [4, 5], [6]] and batches[2][1] == [5]


def fusebench(*args, cwd, env=None, timeout=300):
    env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    return subprocess.run([FUSEBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "DataLoader worker" not in result.stderr, result.stderr
    lines = [x for x in result.stderr.splitlines() if "fusebench: error:" in x]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["embed.num_workers=2", None])  # None: the default, 4
def test_bad_image_with_workers_through_the_cli(checkpoints, tmp_path, workers):
    manifest = bad_manifest(tmp_path)
    args = ["dataset=manifest", f"dataset.manifest={manifest}", "models=[]", "+models.oc.kind=open_clip",
            f"+models.oc.model=local-dir:{checkpoints['oc']}", f"embed.cache.dir={tmp_path / 'cache'}",
            "logger=none", "plots=false", "hydra.run.dir=run"] + ([workers] if workers else [])
    one_line_error(fusebench(*args, cwd=tmp_path), "2.jpg) cannot be read", "embed.on_bad_image=skip")
    assert not (tmp_path / "run" / "metrics.json").exists()


# ------------------------------------------------------------ devices

@pytest.mark.parametrize("device", ["tpu", "gpu0", "cuda:x", "cuda:-1", "cpu:0", 3])
def test_embed_device_is_checked_with_the_config(tmp_path, device):
    with pytest.raises(FusebenchError) as err:
        runtime(tmp_path, device=device)
    assert str(err.value) == (f"embed.device={device!r} is not a torch device fusebench can use; valid: auto, cpu, "
                              "cuda, cuda:N, mps.")


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_bad_embed_device_fails_a_sim_only_run_before_any_work(compose_cfg, tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(FusebenchError, match=r"embed\.device='tpu' is not a torch device .*valid: auto, cpu, cuda"):
        run(compose_cfg(["dataset.n_images=50", "dataset.n_captions=100", "embed.device=tpu"]), str(tmp_path / "run"))
    assert list((tmp_path / "run").iterdir()) == []


@pytest.mark.parametrize("key", ["eval.device", "embed.device"])
def test_unavailable_device_names_the_key(key):
    if torch.cuda.is_available():
        missing = f"cuda:{torch.cuda.device_count()}"
        with pytest.raises(FusebenchError, match=rf"^{key}='{missing}' was asked for but this machine has"):
            resolve_device(missing, key)
    else:
        for name in ("cuda", "cuda:1"):
            with pytest.raises(FusebenchError, match=rf"^{key}='{name}' was asked for but no CUDA device"):
                resolve_device(name, key)
    if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        with pytest.raises(FusebenchError, match=rf"^{key}='mps' was asked for but MPS is not available"):
            resolve_device("mps", key)
    with pytest.raises(FusebenchError, match=rf"^{key}='tpu' is not a torch device"):
        resolve_device("tpu", key)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.slow  # builds and runs real (tiny) open_clip and HF models
def test_real_model_on_missing_cuda_names_embed_device(checkpoints, tmp_path):
    corpus = load_manifest(bad_manifest(tmp_path, bad=99))
    with pytest.raises(FusebenchError, match=r"^embed\.device='cuda' was asked for but no CUDA device"):
        load_raw("clip", spec(checkpoints, "clip"), corpus, runtime(tmp_path / "cache", device="cuda"))


# ------------------------------------------------------------ weights from the Hugging Face Hub, no network

@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """huggingface_hub's client fails every request as a machine without network does (no DNS); an empty hub
    cache; HF_HUB_OFFLINE unset. Yields the list of requested URLs."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    requested = []

    def refuse(request):
        requested.append(str(request.url))
        raise httpx2.ConnectError("[Errno -2] Name or service not known", request=request)

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    _http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(refuse),
                                                   event_hooks={"request": [_http.hf_request_event_hook]}))
    yield requested
    _http.set_client_factory(_http.default_client_factory)


def _registry_spec(name):
    import yaml

    from fusebench.config import CONFIG_DIR

    return yaml.safe_load((Path(CONFIG_DIR) / "models" / f"{name}.yaml").read_text())


@pytest.mark.slow  # imports transformers and open_clip (~5 s)
@pytest.mark.parametrize("model_spec,repo", [
    ({"kind": "hf", "checkpoint": "nobody/no-such-model"}, "nobody/no-such-model"),
    ({"kind": "open_clip", "model": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"}, "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"),
    ({"kind": "open_clip", "model": "hf-hub:nobody/no-such-open-clip"}, "nobody/no-such-open-clip"),
])
def test_missing_weights_without_network_fail_fast(no_network, tmp_path, caplog, model_spec, repo):
    corpus = load_manifest(bad_manifest(tmp_path, bad=99))
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING), pytest.raises(FusebenchError) as err:
        load_raw("m", model_spec, corpus, runtime(tmp_path / "cache"))
    message = str(err.value)
    assert time.perf_counter() - started < 15, message  # huggingface_hub's own retries take 25 s a file
    assert "Retrying" not in caplog.text and len(no_network) == 1  # one request: the check that the hub answers
    assert "\n" not in message and message.startswith("models.m: ")
    for fragment in ("cannot be reached", f"`huggingface-cli download {repo}`", "set HF_HUB_OFFLINE=1"):
        assert fragment in message, (fragment, message)


@pytest.mark.slow  # imports transformers and open_clip (~5 s)
@pytest.mark.parametrize("model_spec,repo", [
    ({"kind": "open_clip", "model": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"}, "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"),
    ({"kind": "open_clip", "model": "hf-hub:nobody/no-such-open-clip"}, "nobody/no-such-open-clip"),
    (_registry_spec("openai_clip_b32"), "timm/vit_base_patch32_clip_224.openai"),
    ({"kind": "hf", "checkpoint": "nobody/no-such-model"}, "nobody/no-such-model"),
])
def test_hf_hub_offline_names_the_repo_to_download(no_network, tmp_path, monkeypatch, model_spec, repo):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set after huggingface_hub was imported: still honoured
    corpus = load_manifest(bad_manifest(tmp_path, bad=99))
    with pytest.raises(FusebenchError) as err:
        load_raw("m", model_spec, corpus, runtime(tmp_path / "cache"))
    message = str(err.value)
    assert f"`huggingface-cli download {repo}`" in message and "REPO" not in message, message
    assert "HF_HUB_OFFLINE is set" in message and no_network == []  # no request at all


@pytest.mark.slow  # builds and runs real (tiny) open_clip and HF models
def test_cached_weights_load_without_network(no_network, checkpoints, tmp_path):
    """The hub unreachable and HF_HUB_OFFLINE unset: weights in the local Hugging Face cache still load."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(constants.HF_HUB_CACHE) / "models--tiny--clip"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in checkpoints["clip"].iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    corpus = load_manifest(bad_manifest(tmp_path, bad=99))
    got = load_raw("clip", {"kind": "hf", "checkpoint": "tiny/clip"}, corpus, runtime(tmp_path / "cache"))
    direct = load_raw("clip", spec(checkpoints, "clip"), corpus, runtime(tmp_path / "other"))
    assert got.info["model"]["commit"] == commit and np.allclose(got.image, direct.image, atol=1e-5)


@pytest.mark.slow  # imports open_clip (~4 s)
def test_open_clip_names_its_repo():
    assert OpenClipEncoder("m", {"model": "ViT-H-14-quickgelu", "pretrained": "dfn5b"}).hub_repo() == \
        "apple/DFN5B-CLIP-ViT-H-14"
    assert OpenClipEncoder("m", {"model": "ViT-B-32", "pretrained": "no-such-tag"}).hub_repo() is None
    assert OpenClipEncoder("m", {"model": "local-dir:/x"}).hub_repo() is None
    assert HFEncoder("m", {"checkpoint": "/no/such/folder"}).hub_repo is None
    assert HFEncoder("m", {"checkpoint": "org/name"}).hub_repo == "org/name"
