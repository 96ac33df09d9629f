"""``kind: hf``: a Hugging Face ``datasets`` dataset saved to disk, or parquet (a file or a folder of files), with an
image column and a captions column: how COCO Karpathy and Flickr30k are commonly shared (nlphuji/flickr30k:
``image``, ``caption`` (five per row), ``split``, ``img_id``). The reading is :mod:`fusebench.data.tables`."""

from __future__ import annotations

from dataclasses import dataclass

from fusebench import FusebenchError
from fusebench.data.kinds import DatasetKind, register
from fusebench.runtime import checks


@dataclass
class HFDatasetConfig:
    name: str = "hf"
    kind: str = "hf"
    path: str | None = None  # a .parquet file, a folder of .parquet files, or a folder from datasets' save_to_disk
    split: str | None = None  # the rows whose split_column holds it, or a saved DatasetDict's split; null = every row
    split_column: str | None = None  # the column naming each row's split (e.g. split); null = none
    image_column: str = "image"  # per row: datasets' Image ({bytes, path}), the file's bytes, or a path string
    caption_column: str = "caption"  # a list of strings per image, or one string per row (grouped by id_column)
    id_column: str | None = None  # each row's image id (unique with caption lists); null = the row number
    image_root: str | None = None  # folder that relative image paths are relative to (default: the path's folder)
    image_dir: str | None = None  # where images given as bytes are written once, named by content digest

    def __post_init__(self):
        self.name = checks.text(self.name, "dataset.name")
        if not self.path:
            raise FusebenchError("dataset.path is not set: pass dataset.path=/data/flickr30k.parquet (a .parquet file, "
                                 "a folder of them, or a datasets save_to_disk folder).")
        self.path = checks.text(self.path, "dataset.path")
        for key in ("image_column", "caption_column"):
            setattr(self, key, checks.text(getattr(self, key), f"dataset.{key}", hint="a column name"))
        for key in ("split", "split_column", "id_column", "image_root", "image_dir"):
            setattr(self, key, checks.text(getattr(self, key), f"dataset.{key}", allow_none=True))
        if self.split_column is not None and self.split is None:
            raise FusebenchError(f"dataset.split_column={self.split_column} needs dataset.split (the value of that "
                                 "column whose rows are the corpus, e.g. test), or set dataset.split_column=null.")


def load(params: HFDatasetConfig):
    from fusebench.data.tables import (
        load_table,  # lazy: heavy (numpy); numpy and pyarrow: the CLI scans the kinds before heavy imports
    )

    return load_table(params)


KIND = register(DatasetKind("hf", HFDatasetConfig, load, "a datasets save_to_disk folder or parquet, an image "
                            "column and a captions column; `dataset=hf_example`"))
