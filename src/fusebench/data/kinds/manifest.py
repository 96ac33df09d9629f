"""``kind: manifest``: a JSONL file, one line per image in order (:mod:`fusebench.data.manifest`): images without
captions are the run's distractors."""

from __future__ import annotations

from dataclasses import dataclass

from fusebench import FusebenchError
from fusebench.data.kinds import DatasetKind, register
from fusebench.runtime import checks


@dataclass
class ManifestDatasetConfig:
    name: str = "manifest"
    kind: str = "manifest"
    manifest: str | None = None  # the JSONL file, one line per image
    image_root: str | None = None  # folder that relative paths are relative to (default: the manifest's folder)

    def __post_init__(self):
        self.name = checks.text(self.name, "dataset.name")
        if not self.manifest:
            raise FusebenchError("dataset.manifest is not set: pass dataset.manifest=/path/to/manifest.jsonl.")
        self.manifest = checks.text(self.manifest, "dataset.manifest")
        self.image_root = checks.text(self.image_root, "dataset.image_root", allow_none=True)


def load(params: ManifestDatasetConfig):
    from fusebench.data.manifest import (
        load_manifest,  # lazy: heavy (numpy); numpy: the CLI scans the kinds before heavy imports
    )

    return load_manifest(params.manifest, name=params.name, image_root=params.image_root)


KIND = register(DatasetKind("manifest", ManifestDatasetConfig, load, "a JSONL file, one line per image "
                            "(docs/formats.md); `dataset=manifest`"))
