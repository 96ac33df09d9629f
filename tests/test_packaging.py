"""The package as a user installs it (a wheel, not the checkout): configs inside, fusebench works anywhere, the
default job needs no extra, and a missing extra is one line naming it. The structural checks (pyproject's
package list and package data against the tree, the extras) are fast; building and running the wheel is slow."""

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from fusebench import FusebenchError

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# what some users need; parity is the tests' oracles
USER_EXTRAS = ("tiny", "positives", "cluster", "notebook", "gallery", "datasets", "faiss", "milvus", "lancedb", "qdrant",
               "sentence-transformers")


def conf_files() -> set[str]:
    return {p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*") if p.is_file()}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_every_package_folder_is_listed_in_pyproject():
    """setuptools is given an explicit package list: a new package folder under src/ must be in it (or its
    modules would be missing from the wheel)."""
    folders = [p.parent.relative_to(ROOT / "src").parts for p in (ROOT / "src").rglob("*.py") if "__pycache__" not in p.parts]
    found = {".".join(parts[:n]) for parts in folders for n in range(1, len(parts) + 1)}  # namespaces too (hydra_plugins)
    assert found | {"fusebench.conf"} == set(SETUPTOOLS["packages"])
    assert SETUPTOOLS["package-dir"]["fusebench.conf"] == "conf"


def test_package_data_ships_every_config_file():
    """Every file of conf/ is a YAML file that the package-data globs of fusebench.conf match."""
    shipped = {p.relative_to(ROOT / "conf").as_posix() for pattern in SETUPTOOLS["package-data"]["fusebench.conf"]
               for p in (ROOT / "conf").glob(pattern) if p.is_file()}
    assert conf_files() == shipped


def test_a_checkout_reads_the_top_level_conf():
    """An editable install (or a checkout on sys.path) reads conf/ itself, the only copy."""
    import fusebench.config

    if not Path(fusebench.config.__file__).resolve().is_relative_to(ROOT / "src"):
        pytest.skip("fusebench is imported from an installed copy, not this checkout")
    assert Path(fusebench.config.CONFIG_DIR) == ROOT / "conf"
    assert not (ROOT / "src" / "fusebench" / "conf").exists()  # no second copy


def test_extras_layout():
    """The default job's dependencies hold no extra's package; dev (what make and CI install) holds every extra,
    so every optional test runs there; torch's tested version is named once, in the pinned extra."""
    core = requirement_names(PYPROJECT["project"]["dependencies"])
    optional = set().union(*(requirement_names(EXTRAS[name]) for name in (*USER_EXTRAS, "parity")))
    assert not core & optional
    assert {"scikit-image", "scikit-learn"} <= requirement_names(EXTRAS["tiny"])
    assert {"hydra-joblib-launcher", "hydra-submitit-launcher"} <= requirement_names(EXTRAS["cluster"])
    assert {"ranx", "qdrant-client"} <= requirement_names(EXTRAS["parity"])
    assert {"pandas", "nbclient", "nbformat", "ipykernel"} <= requirement_names(EXTRAS["notebook"])
    assert f"fusebench[{','.join((*USER_EXTRAS, 'parity'))}]" in EXTRAS["dev"]
    assert f"fusebench[{','.join(USER_EXTRAS)}]" in EXTRAS["all"]
    pins = [r for r in (*PYPROJECT["project"]["dependencies"], *(r for e in EXTRAS.values() for r in e)) if "==" in r]
    assert sorted(requirement_names(pins)) == ["torch", "torchvision"] and all(r in EXTRAS["pinned"] for r in pins)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "torch==" not in makefile and ".[dev,pinned]" in makefile


def test_missing_extras_are_one_line_naming_the_extra(monkeypatch):
    from fusebench.data import tiny
    from fusebench.evaluation import positives

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("skimage", "sklearn",
                                                                                       "eccv_caption") else real(name, *a))
    with pytest.raises(FusebenchError, match=r"pip install 'fusebench\[tiny\]'") as err:
        tiny.load_tiny()
    assert "\n" not in str(err.value)
    with pytest.raises(FusebenchError, match=r"pip install 'fusebench\[positives\]'") as err:
        positives.data_dir()
    assert "\n" not in str(err.value)


def without_extras(site: Path, farm: Path) -> Path:
    """A folder of links to everything in ``site`` (this Python's site-packages) but the extras' own modules and
    their dist-info: on ``PYTHONPATH`` with ``python -S``, an environment where no extra is installed."""
    import importlib.metadata as metadata

    skip = set()
    for requirement in requirement_names([r for name in (*USER_EXTRAS, "parity") for r in EXTRAS[name]]):
        dist = metadata.distribution(requirement)
        skip |= {str(f).split("/")[0] for f in dist.files or [] if str(f).split("/")[0].endswith(".dist-info")}
        skip |= {"/".join(f.parts[:2]) if f.parts[0] == "hydra_plugins" else f.parts[0].removesuffix(".py")
                 for f in dist.files or [] if f.suffix == ".py"}
    farm.mkdir()
    for entry in site.iterdir():
        if entry.name == "hydra_plugins":  # a namespace shared with the launchers of the cluster extra
            (farm / entry.name).mkdir()
            for plugin in entry.iterdir():
                if f"hydra_plugins/{plugin.name}" not in skip:
                    (farm / entry.name / plugin.name).symlink_to(plugin)
        elif entry.name.removesuffix(".py") not in skip and not entry.name.startswith("__editable__"):
            (farm / entry.name).symlink_to(entry)
    return farm


@pytest.mark.slow
def test_wheel_ships_the_configs_and_runs_from_any_folder(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(ROOT), "-w",
                            str(tmp_path / "wheel")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "wheel").glob("fusebench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"fusebench/conf/{name}" for name in conf_files()} <= set(names)  # every config group file
    assert {f"fusebench/{p.relative_to(ROOT / 'src' / 'fusebench').as_posix()}"
            for p in (ROOT / "src" / "fusebench").rglob("*.py")} <= set(names)  # every module
    assert "fusebench/data/tiny_captions.json" in names
    assert "fusebench/conf/hydra/sweeper/fusebench.yaml" in names and "hydra_plugins/fusebench_sweeper/sweeper.py" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "FUSEBENCH_OUTPUT": str(elsewhere / "out"), "WANDB_MODE": "disabled"}
    where = subprocess.run([sys.executable, "-c", "import fusebench.app.cli as c; print(c.CONFIG_DIR)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(target))  # the installed copy, not the checkout
    result = subprocess.run([sys.executable, "-m", "fusebench.app.cli", "dataset.n_images=100", "dataset.n_captions=300",
                             "eval.bootstrap.draws=20", "logger=none", "plots=false"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert list((elsewhere / "out" / "runs").glob("*/*/metrics.json"))
    sweep = subprocess.run([sys.executable, "-m", "fusebench.app.cli", "-m", "fusion=rrf,dbsf", "dataset.n_images=100",
                            "dataset.n_captions=300", "eval.bootstrap.draws=20", "logger=none", "plots=false",
                            f"hydra.sweep.dir={elsewhere / 'sweep'}"], cwd=elsewhere, env=env, capture_output=True,
                           text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stderr  # fusebench's sweeper (a Hydra plugin) ships in the wheel
    assert (elsewhere / "sweep" / "1" / "metrics.json").is_file() and (elsewhere / "sweep" / "summary.md").is_file()
    listing = subprocess.run([sys.executable, "-c", "from fusebench.app.cli import list_models; list_models([])"],
                             cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert "siglip2_so400m_p14_384" in listing.stdout and "hf" in listing.stdout
    # without any extra installed: the default job runs; a capability of an extra says which, in one line (exit 2)
    import sysconfig

    farm = without_extras(Path(sysconfig.get_paths()["purelib"]), tmp_path / "site-without-extras")
    bare = {**env, "PYTHONPATH": f"{target}{os.pathsep}{farm}"}
    small = ["dataset.n_images=100", "dataset.n_captions=300", "eval.bootstrap.draws=20", "logger=none", "plots=false"]
    default = subprocess.run([sys.executable, "-S", "-m", "fusebench.app.cli", *small,
                              f"hydra.run.dir={elsewhere / 'bare'}"], cwd=elsewhere, env=bare, capture_output=True,
                             text=True, timeout=600)
    assert default.returncode == 0, default.stderr
    assert (elsewhere / "bare" / "metrics.json").is_file()
    for args, extra in ((["dataset=tiny", "logger=none"], "tiny"),
                        (["-m", "hydra/launcher=joblib", "fusion=rrf,dbsf", *small], "cluster")):
        missing = subprocess.run([sys.executable, "-S", "-m", "fusebench.app.cli", *args], cwd=elsewhere, env=bare,
                                 capture_output=True, text=True, timeout=600)
        assert missing.returncode == 2, missing.stderr
        assert missing.stderr.startswith("fusebench: error: ") and missing.stderr.count("\n") == 1, missing.stderr
        assert f"pip install 'fusebench[{extra}]'" in missing.stderr
