"""The model kinds: one module per kind, each registering one :class:`ModelKind` (its name, its spec class: the
keys, types, defaults and checks of ``conf/models/*.yaml``; its operation: ``load``, a model's rows; a real kind's
encoder ``backend``), found by a scan of this package (:class:`fusebench.runtime.plugins.Registry`).

The registry object is ``fusebench.config.specs.MODEL_KINDS`` (the config layer types a model spec from it and sits
below this package; the scan imports these modules by their dotted name); it is :data:`REGISTRY` here. Every list
that names kinds is derived from it: the config's valid kinds and their keys (``config.specs.model_spec``), the
loader (``encoders.models.load_raw``), a real kind's encoder (``encoders.real.real_run``) and the docs
(``tests/test_model_kinds.py`` checks docs/config.md and docs/layout.md name each kind and its keys).

Light on purpose: the CLI scans these modules to check a config before any heavy import, so a kind's module
imports its operation's code (numba, torch, a model library) inside the function that runs.

A new kind is one module here (``KIND = register(ModelKind(...))``), a ``conf/models/NAME.yaml`` using it, its
keys in the docs/config.md ``models`` row and a test.
"""

from __future__ import annotations

from fusebench.config.specs import MODEL_KINDS, ModelKind

REGISTRY = MODEL_KINDS  # filled by a scan of this package
register = REGISTRY.register

__all__ = ["REGISTRY", "ModelKind", "register"]
