"""Configuration: where the YAML config groups live, their schemas (``schema``), the typed reads of their values
(``checks``) and the keys each model kind reads (``specs``).

The config groups are the repository's top-level ``conf/`` folder, the only copy. A wheel ships them as
``fusebench/conf`` (``pyproject.toml`` maps ``conf/`` there); a source checkout and an editable install read ``conf/``
itself. Importing this package imports nothing heavy (no torch, numba, matplotlib or wandb).
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
