"""Configuration: where the YAML config groups live, and the one typed path from a composed config to the objects
the code reads. ``schema``: each group as a dataclass (its keys, defaults and checks; registered with Hydra);
``specs``: a model spec per model kind (the typed reads their checks call are :mod:`fusebench.runtime.checks`);
``run``: ``run_config``, which converts a whole composed config, once, into a
:class:`~fusebench.config.run.RunConfig` (the fusion group's type is :class:`fusebench.fusion.config.FusionConfig`).

The config groups are the repository's top-level ``conf/`` folder, the only copy. A wheel ships them as
``fusebench/conf`` (``pyproject.toml`` maps ``conf/`` there); a source checkout and an editable install read ``conf/``
itself. Importing this package, and converting a config, imports nothing heavy (no torch, numba, matplotlib, wandb or
numpy).
"""

from __future__ import annotations

from fusebench.runtime.layout import CONFIG_DIR  # where the groups are (defined with the other on-disk names)

__all__ = ["CONFIG_DIR"]
