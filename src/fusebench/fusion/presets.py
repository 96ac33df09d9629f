"""Engine presets as labels that stay true: a preset's name labels a fusion only while the fusion is the preset.

An engine preset is ``conf/fusion/NAME.yaml`` with ``preset: NAME`` (``fusion=qdrant_dbsf``). Its definition
is every formula setting of the fusion group (everything but ``fuse_on``, ``top_k``, ``final_top_k``, which
every preset takes as run settings and every report shows beside the label) as that file composes them over
:class:`~fusebench.fusion.config.FusionConfig`'s defaults. ``fusion=qdrant_dbsf fusion.method=rrf`` runs RRF, so the
run may not be called ``qdrant_dbsf``: :func:`true_label` drops the preset (the run is then labelled by its
method and settings, like any fusion) and says what differs. A ``fusion.preset`` naming no preset file is a
config error.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import yaml

from fusebench import FusebenchError
from fusebench.fusion.config import FusionConfig, flat_settings, method_dependent, method_reads, moved_keys
from fusebench.runtime import checks
from fusebench.runtime.layout import CONFIG_DIR

log = logging.getLogger(__name__)
RUN_SETTINGS = ("fuse_on", "top_k", "final_top_k", "preset")  # chosen per run, not part of a preset
# presets whose engine takes no per-model weights (checked in the engine's source): unequal weights leave them (the
# one place this is said: an engine runs only its presets unchanged, fusebench.backends.base.check_engine)
UNWEIGHTED = {"qdrant_dbsf": "qdrant_client.hybrid.fusion.distribution_based_score_fusion takes no weights "
                             "(qdrant-client 1.20.0)",
              "milvus_rrf": "Milvus' RRFRanker takes no weights (pymilvus 3.0.2 RRFRanker(k))",
              "lancedb_rrf": "LanceDB's RRFReranker takes no weights (lancedb 0.40.0 RRFReranker(K))"}


def package_conf() -> Path:
    return Path(CONFIG_DIR)


def config_folders() -> list[Path]:
    """The folders configs come from: the package's conf/ and, inside a Hydra run, every ``--config-dir``."""
    folders = [package_conf()]
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            folders += [Path(source.path) for source in HydraConfig.get().runtime.config_sources
                        if source.schema == "file" and source.path]
    except ImportError:  # pragma: no cover - Hydra is a dependency
        pass
    return folders


def preset_files(folders: list[Path]) -> dict[str, Path]:
    """Every preset by name: the ``fusion/NAME.yaml`` files that set ``preset: NAME`` (later folders win)."""
    found = {}
    for folder in folders:
        for path in sorted((folder / "fusion").glob("*.yaml")):
            if _read(path).get("preset") == path.stem:
                found[path.stem] = path
    return found


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise FusebenchError(f"{path}: cannot be read as a fusion config ({err}).") from None
    return data if isinstance(data, dict) else {}


def definition(name: str, folders: list[Path]) -> dict:
    """The preset's formula settings: FusionConfig's defaults with its YAML file's values over them, flat as
    :func:`~fusebench.fusion.config.flat_settings` shows them (its method's own ``params`` under their keys; an
    old flat key in a user's preset file read as its new one)."""
    files = preset_files(folders)
    if name not in files:
        raise FusebenchError(f"fusion.preset={name!r} names no engine preset (a conf/fusion/NAME.yaml that sets "
                             f"preset: NAME); valid: {', '.join(sorted(files))}, or null (no preset label). "
                             f"Pick a preset with fusion=NAME.")
    values = {k: v for k, v in _read(files[name]).items() if k != "defaults"}
    try:
        own = FusionConfig(**values)
    except TypeError as err:
        raise FusebenchError(f"{files[name]}: cannot be read as a fusion config ({err}).") from None
    return {k: v for k, v in flat_settings(own).items() if k not in RUN_SETTINGS}


def changes(fusion: FusionConfig, preset: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """``key=value`` for every formula setting of ``fusion`` (flat: :func:`definition`) that is not the preset's
    value (``ignore`` aside)."""
    flat = flat_settings(fusion)
    return [f"{key}={flat[key]}" for key, value in preset.items() if key not in ignore and flat[key] != value]


def true_label(fusion: FusionConfig, folders: list[Path] | None = None,
               weights: list[float] | None = None) -> FusionConfig:
    """``fusion`` with its preset label kept only while every formula setting is the preset's own (and, for a
    preset whose engine takes no weights, while the models' ``weights`` are all equal). A setting the method never
    reads that is not the preset's own value is refused (``FusionConfig.check_preset_values``): the warning
    names only settings that changed what runs."""
    if fusion.preset is None:
        return fusion
    own = definition(fusion.preset, config_folders() if folders is None else folders)
    fusion.check_preset_values(own)
    reads = method_reads(fusion.method) if fusion.method != "none" else ()
    unread = tuple(key for key in method_dependent() if key not in reads)  # the preset's own values (checked above)
    not_own = tuple(key for key in moved_keys() if key not in fusion.own_params())  # another method's settings
    changed = changes(fusion, own, ignore=(*unread, *not_own))
    if fusion.preset in UNWEIGHTED and weights is not None and len(set(weights)) > 1:
        changed.append(f"weights={'/'.join(f'{w:g}' for w in weights)} ({UNWEIGHTED[fusion.preset]})")
    if not changed:
        return fusion
    log.warning("fusion.preset=%s dropped: this fusion changes the preset's own settings (%s), so it is labelled "
                "by its method, %s, and its settings", fusion.preset, ", ".join(changed), fusion.method)
    # the preset's values the method never reads: not recorded
    return replace(fusion, preset=None, params=fusion.own_params(),
                   **{key: checks.default_of(FusionConfig, key) for key in unread})
