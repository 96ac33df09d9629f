"""``kind: tiny``: 26 photographs shipped inside installed packages, with hand-written captions
(:mod:`fusebench.data.tiny`): real images for end-to-end runs, offline. Not a benchmark."""

from __future__ import annotations

from dataclasses import dataclass

from fusebench.data.kinds import DatasetKind, register
from fusebench.runtime import checks


@dataclass
class TinyDatasetConfig:
    name: str = "tiny"
    kind: str = "tiny"
    limit: int | None = None  # use only the first N images

    def __post_init__(self):
        self.name = checks.text(self.name, "dataset.name")
        self.limit = checks.optional_integer(self.limit, "dataset.limit", 1, "null = all images")


def load(params: TinyDatasetConfig):
    from fusebench.data.tiny import (
        load_tiny,  # lazy: heavy (numpy); numpy: the CLI scans the kinds before heavy imports
    )

    return load_tiny(limit=params.limit, name=params.name)


KIND = register(DatasetKind("tiny", TinyDatasetConfig, load, "photographs shipped in installed packages, 5 captions "
                            "each (the `tiny` extra); `dataset=tiny`"))
