"""Configuration: where the YAML config groups live, and the one typed path from a composed config to the objects
the code reads. ``schema``: each group as a dataclass (its keys, defaults and checks; registered with Hydra);
``specs``: a model spec per model kind; ``checks``: the typed reads those checks call; ``run``: ``run_config``, which
converts a whole composed config, once, into a :class:`~fusebench.config.run.RunConfig` (the fusion group's type is
:class:`fusebench.fusion.config.FusionConfig`).

The config groups are the repository's top-level ``conf/`` folder, the only copy. A wheel ships them as
``fusebench/conf`` (``pyproject.toml`` maps ``conf/`` there); a source checkout and an editable install read ``conf/``
itself. Importing this package, and converting a config, imports nothing heavy (no torch, numba, matplotlib, wandb or
numpy).
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _config_dir() -> Path:
    packaged = _HERE.parent / "conf"  # a wheel or a regular install: fusebench/conf
    if (packaged / "config.yaml").is_file():
        return packaged
    return _HERE.parents[2] / "conf"  # a checkout (editable install): <repo>/src/fusebench/config -> <repo>/conf


CONFIG_DIR = str(_config_dir())
