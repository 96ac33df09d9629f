"""The keys a model spec may hold, per model kind: a key nothing reads is an error, never silently ignored.

A model spec is free-form YAML (``conf/models/NAME.yaml`` or ``+models.NAME.KEY=...`` overrides), so Hydra
cannot type-check it. ``+models.sim_dfn5b_like.wieght=0`` would otherwise run with the weight unchanged;
:func:`check_spec` refuses it, naming the key and listing the kind's keys. Every kind may carry ``weight``,
``text`` (query preprocessing; for ``vectors`` and ``sim`` a description the reports read), ``label`` and
``published`` (the model's published numbers, free-form).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fusebench import FusebenchError

COMMON_KEYS = ("kind", "weight", "text", "label", "published")
SIM_KEYS = ("dim", "image_noise", "text_noise", "seed", "score_scale", "score_shift")
KIND_KEYS = {
    "sim": SIM_KEYS,
    "vectors": ("image_embeddings", "text_embeddings"),
    "open_clip": ("model", "pretrained", "context_length", "sim"),
    "hf": ("checkpoint", "revision", "sim"),
}
TEXT_KEYS = {"hf": ("case", "template", "padding", "max_length")}  # the hf tokenizer's padding and length
DEFAULT_TEXT_KEYS = ("case", "template")


def _unknown(given: Mapping, valid: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in given if k not in valid)
    if unknown:
        raise FusebenchError(f"{where}: unknown key(s) {', '.join(unknown)} (nothing reads them); valid keys: "
                             f"{', '.join(sorted(valid))}.")


def check_spec(name: str, spec: Mapping, registry: list[str]) -> None:
    """Refuse a spec without a known kind, and any key its kind does not read (in ``text`` and ``sim`` too)."""
    kind = spec.get("kind")
    if kind is None:
        raise FusebenchError(_no_kind(name, spec, registry))
    if not isinstance(kind, str) or kind not in KIND_KEYS:
        raise FusebenchError(f"models.{name}.kind={kind!r} is not a known model kind; valid kinds: "
                             f"{', '.join(KIND_KEYS)}.")
    _unknown(spec, COMMON_KEYS + KIND_KEYS[kind], f"models.{name} (kind {kind})")
    if isinstance(spec.get("text"), Mapping):
        _unknown(spec["text"], TEXT_KEYS.get(kind, DEFAULT_TEXT_KEYS), f"models.{name}.text")
    if kind in ("open_clip", "hf") and isinstance(spec.get("sim"), Mapping):
        _unknown(spec["sim"], SIM_KEYS, f"models.{name}.sim")


def _no_kind(name: str, spec: Mapping, registry: list[str]) -> str:
    keys = ", ".join(f"models.{name}.{k}" for k in spec) or f"models.{name}"
    if name in registry:
        return (f"{keys} was set but model {name!r} is not selected, so it has no kind: select it with "
                f"models=[...,{name}] (then models.{name}.KEY=... changes it), or drop the override.")
    return (f"models.{name} has no kind: a new model needs +models.{name}.kind=... (sim, vectors, open_clip, hf), "
            f"or pick one from the registry with models=[...] ({', '.join(registry)}).")


def registry(folders: list[Path]) -> list[str]:
    """Model names of the registry: ``models/*.yaml`` in each config folder."""
    return sorted({p.stem for folder in folders for p in (folder / "models").glob("*.yaml")})
