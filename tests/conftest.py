from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers.corpora import write_manifest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fusebench.config import CONFIG_DIR, schema

schema.register()  # as the CLI does on import: every test that composes the config tree finds the groups' schemas

# a module whose every test is slow says so at its top: pytestmark = pytest.mark.slow (or a list holding it)
ALL_SLOW = re.compile(r"^pytestmark = (pytest\.mark\.slow\b|\[[^\]\n]*\bpytest\.mark\.slow\b)", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config):
    """The fast tier (``-m "not slow"``, make test-fast) does not import the modules whose every test is slow: all
    their tests would be deselected anyway, and importing what they test (an engine's library, the notebook's
    kernel) takes seconds. Any other selection, and the full suite, collects them as usual."""
    if " ".join(config.getoption("markexpr").split()) != "not slow":
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_") and collection_path.is_file() \
            and ALL_SLOW.search(collection_path.read_text(encoding="utf-8")):
        return True
    return None


@pytest.fixture(autouse=True)
def own_temp_dir(tmp_path_factory, monkeypatch):
    """What fusebench writes to the temp folder for the user (lists of missing or unreadable images) goes to
    pytest's own tmp dirs, here and in subprocesses, not to the machine's /tmp."""
    folder = tmp_path_factory.mktemp("tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))


@pytest.fixture(autouse=True, scope="session")
def views_inline():
    """A job's plots and W&B log are made in the job (``views=inline``), so a test reads them as soon as the command
    returns; tests/test_views.py checks the background process (the CLI's default) against it. Session-wide, so a
    module's fixture that runs jobs (set up before any test's own fixtures) gets it too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FUSEBENCH_VIEWS", "inline")
        yield


@pytest.fixture(autouse=True)
def quiet_wandb(monkeypatch):
    """W&B is on by default (offline); tests that do not check it keep it out of the way."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.fixture
def compose_cfg():
    """Compose the real config tree with overrides, the way the CLI would (Hydra compose API)."""

    def _compose(overrides: list[str] | None = None, return_hydra_config: bool = False):
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
            return compose(config_name="config", overrides=overrides or [], return_hydra_config=return_hydra_config)

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture
def vectors_case(tmp_path):
    """A small manifest (with one distractor image) and two models' .npy embeddings in manifest order."""
    rng = np.random.default_rng(7)
    n_images, latent = 40, 16
    records = []
    for i in range(n_images):
        n_caps = 0 if i == 5 else (3 if i % 4 else 2)
        records.append({"image_id": f"img{i}", "path": f"images/{i}.jpg",
                        "captions": [f"caption {j} of image {i}" for j in range(n_caps)]})
    manifest = write_manifest(tmp_path / "M.jsonl", records)
    caption_image = np.array([i for i, r in enumerate(records) for _ in r["captions"]])
    z = rng.standard_normal((n_images, latent))
    text_latent = z[caption_image] + 0.9 * rng.standard_normal((len(caption_image), latent))
    files = {}
    for name, dim, noise in (("A", 24, 0.5), ("B", 20, 0.6)):
        proj = rng.standard_normal((latent, dim))
        image = (z + noise * rng.standard_normal(z.shape)) @ proj
        text = (text_latent + noise * rng.standard_normal(text_latent.shape)) @ proj
        np.save(tmp_path / f"{name}_img.npy", image.astype(np.float32))
        np.save(tmp_path / f"{name}_txt.npy", text.astype(np.float32))
        files[name] = (tmp_path / f"{name}_img.npy", tmp_path / f"{name}_txt.npy")
    return {"dir": tmp_path, "manifest": manifest, "files": files, "caption_image": caption_image,
            "n_images": n_images}
