"""Listing a gallery's distractor images from where people keep them, in the seeded order galleries nest by.

:func:`distractor_items` is the one entry point: the source's items (``gallery.kind``: folder, webdataset, paths;
the rows of a vectors dump are listed by :mod:`fusebench.encoders.vector_dumps`), put in :func:`seeded_order`, the
first ``gallery.size`` taken, checked against the test split's image ids. Each lister gives (ids, refs) in a fixed
order of the source (sorted files, archive order inside a tar, line order of a list):

* ``folder``: every image under the folder, recursively; id = its path relative to the folder.
* ``webdataset``: tar shards (a folder of ``.tar``, searched recursively; a glob; a brace pattern such as
  ``/data/{00000..00099}.tar``; or one ``.tar``), listed from their headers (:mod:`fusebench.data.tar_shards`);
  each sample's image member (``KEY.jpg``, ``.png``, ...: the extension after the key's first dot, as webdataset
  names the field) is one distractor, id ``SHARD/KEY`` (the shard's path relative to the shards' common folder,
  without ``.tar``; KEY as webdataset's ``__key__``), ref ``TAR::MEMBER``.
* ``paths``: a ``.parquet`` (column ``path`` or ``image_path``; ids from ``id`` or ``key`` when present), a
  ``.jsonl`` (``{"path": ..., "id": ...}`` per line; ``image_path``/``key`` also read) or a ``.txt`` (one path a
  line); relative paths are relative to the list's folder; without an id column the id is the path as written.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from fusebench import FusebenchError
from fusebench.config.gallery import GalleryConfig
from fusebench.data.distractor_items import DistractorItems, check_no_overlap, check_size, seeded_order
from fusebench.data.input_files import not_a_directory, utf8_lines
from fusebench.data.tar_shards import IMAGE_EXTENSIONS, expand_braces, sample_key, tar_members

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
PATH_KEYS, ID_KEYS = ("path", "image_path"), ("id", "key")  # a path list's columns (or JSON keys), first found wins
EXTRA = "pip install 'fusebench[gallery]'"  # what reading parquet (path lists, clip-retrieval metadata) needs


def parquet_module(what: str):
    """``pyarrow.parquet``, or a FusebenchError naming the extra that installs it (``what`` needs it)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FusebenchError(f"{what} is parquet, which needs pyarrow: {EXTRA} (or pip install pyarrow).") from None
    return pq


def check_unique_ids(ids: list[str], where: Callable[[int], str]) -> None:
    """Two distractors with one id: an error naming both (``where(i)``: where item i comes from)."""
    first: dict[str, int] = {}
    for i, image_id in enumerate(ids):
        j = first.setdefault(image_id, i)
        if j != i:
            raise FusebenchError(f"{where(i)}: duplicate id {image_id!r} (also {where(j)}); every distractor needs "
                                 "its own id.")


def folder_items(folder: str) -> tuple[list[str], list[str]]:
    """(ids, paths) of every image under ``folder`` (recursively, sorted by relative path; the id is that path)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FusebenchError(f"gallery.source={folder!r} is not a folder (gallery=folder reads the images under it).")
    found = []
    for parent, dirs, files in os.walk(root):
        dirs.sort()
        found.extend(os.path.join(parent, f) for f in files if f.lower().endswith(IMAGE_SUFFIXES))
    paths = sorted(found)
    return [os.path.relpath(p, root) for p in paths], paths


def shard_paths(source: str) -> list[str]:
    """The tar shards ``source`` names (sorted): a folder's ``.tar`` files (recursively), a glob's matches, a
    brace pattern's expansion (every one must exist), or one ``.tar``."""
    where = f"gallery.source={source!r}"
    valid = "a folder of .tar shards, a glob (/data/*.tar), a brace pattern (/data/{00000..00099}.tar) or one .tar"
    path = os.path.expanduser(source)
    if "{" in path or "}" in path:
        expanded = expand_braces(path)
        missing = [p for p in expanded if not os.path.isfile(p)]
        if len(missing) == len(expanded):
            raise FusebenchError(f"{where}: the brace pattern matches no file (none of its {len(expanded):,} names "
                                 f"exists, first: {expanded[0]}); give {valid}.")
        if missing:
            raise FusebenchError(f"{where}: {len(missing):,} of the pattern's {len(expanded):,} shards do not exist "
                                 f"(first: {missing[0]}); fix the range or restore the shards.")
        return sorted(expanded)
    if glob.has_magic(path):
        matches = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not matches:
            raise FusebenchError(f"{where}: the glob matches no file; give {valid}.")
        return matches
    if os.path.isdir(path):
        tars = sorted(str(p) for p in Path(path).rglob("*.tar") if p.is_file())
        if not tars:
            raise FusebenchError(f"{where}: the folder holds no .tar file; give {valid}.")
        return tars
    if os.path.isfile(path) and path.endswith(".tar"):
        return [path]
    raise FusebenchError(f"{where}: {'no such file or folder' if not os.path.exists(path) else 'not a .tar'}; "
                         f"give {valid}.")


def shard_labels(tars: list[str]) -> list[str]:
    """Each shard's name in ids: its path relative to the shards' common folder, without ``.tar``."""
    root = os.path.commonpath([os.path.dirname(os.path.abspath(t)) for t in tars])
    return [os.path.relpath(os.path.abspath(t), root).removesuffix(".tar") for t in tars]


def webdataset_items(source: str) -> tuple[list[str], list[str]]:
    """(ids, refs) of every sample's image in the tar shards ``source`` names (see the module docstring)."""
    ids, refs = [], []
    tars = shard_paths(source)
    for tar, label in zip(tars, shard_labels(tars)):
        for name, _offset, _size in tar_members(tar):
            split = sample_key(name)
            if split is not None and split[1] in IMAGE_EXTENSIONS:
                ids.append(f"{label}/{split[0]}")
                refs.append(f"{tar}::{name}")
    check_unique_ids(ids, lambda i: refs[i])
    return ids, refs


def _first_key(record, keys: tuple[str, ...]) -> str | None:
    return next((key for key in keys if key in record), None)


def _listed_id(value, where: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise FusebenchError(f"{where}: {key!r} must be a non-empty string or an integer, got {value!r}.")
    return str(value)


def _listed_path(value, where: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise FusebenchError(f"{where}: {key!r} must be a non-empty string (an image path), got {value!r}.")
    return value


def _txt_rows(path: Path) -> tuple[list[str], list[str | None], list[str]]:
    paths, wheres = [], []
    for lineno, text in utf8_lines(path):
        line = text.rstrip("\r\n")
        if line.strip():
            paths.append(line)
            wheres.append(f"{path}:{lineno}")
    return paths, [None] * len(paths), wheres


def _jsonl_rows(path: Path) -> tuple[list[str], list[str | None], list[str]]:
    paths, ids, wheres = [], [], []
    for lineno, text in utf8_lines(path):
        if not text.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise FusebenchError(f"{where}: not valid JSON ({err.msg} at column {err.colno}); each line must be one "
                                 'object like {"path": "images/1.jpg", "id": "1"}.') from None
        path_key = _first_key(record, PATH_KEYS) if isinstance(record, dict) else None
        if path_key is None:
            raise FusebenchError(f"{where}: expected an object with a 'path' (or 'image_path') key, like "
                                 '{"path": "images/1.jpg", "id": "1"}; got ' f"{text.strip()[:80]}")
        id_key = _first_key(record, ID_KEYS)
        paths.append(_listed_path(record[path_key], where, path_key))
        ids.append(None if id_key is None else _listed_id(record[id_key], where, id_key))
        wheres.append(where)
    return paths, ids, wheres


def _parquet_rows(path: Path) -> tuple[list[str], list[str | None], list[str]]:
    pq = parquet_module(f"gallery.source={str(path)!r}")
    try:
        columns = pq.read_schema(path).names
        path_key, id_key = _first_key(columns, PATH_KEYS), _first_key(columns, ID_KEYS)
        if path_key is None:
            raise FusebenchError(f"{path}: no column 'path' or 'image_path' (its columns: {', '.join(columns)}); "
                                 "a parquet path list needs one (and optionally 'id' or 'key').")
        table = pq.read_table(path, columns=[c for c in (path_key, id_key) if c is not None])
    except (OSError, ValueError) as err:  # pyarrow's errors derive from these
        raise FusebenchError(f"{path}: not a readable parquet file ({err}).") from None
    wheres = [f"{path} row {r + 1}" for r in range(table.num_rows)]
    paths = [_listed_path(v, f"{wheres[r]} column {path_key!r}", path_key)
             for r, v in enumerate(table.column(path_key).to_pylist())]
    ids = ([None] * len(paths) if id_key is None else
           [_listed_id(v, f"{wheres[r]} column {id_key!r}", id_key) for r, v in enumerate(table.column(id_key).to_pylist())])
    return paths, ids, wheres


PATH_LISTS = {".parquet": _parquet_rows, ".jsonl": _jsonl_rows, ".txt": _txt_rows}


def path_list_items(source: str) -> tuple[list[str], list[str]]:
    """(ids, paths) of the images a path list names, in its order (see the module docstring)."""
    path = Path(source).expanduser()
    reader = PATH_LISTS.get(path.suffix.lower())
    if reader is None:
        raise FusebenchError(f"gallery.source={source!r}: a path list must end in {', '.join(PATH_LISTS)} "
                             f"(got {path.suffix or 'no suffix'!r}).")
    not_a_directory(path, "gallery.source", f"a {path.suffix} list of image paths")
    if not path.is_file():
        raise FusebenchError(f"gallery.source={source!r}: file not found.")
    paths, ids, wheres = reader(path)
    ids = [p if i is None else i for p, i in zip(paths, ids)]
    check_unique_ids(ids, lambda i: wheres[i])
    folder = path.parent
    return ids, [str(folder / Path(p).expanduser()) for p in paths]


LISTERS = {"folder": folder_items, "webdataset": webdataset_items, "paths": path_list_items}  # kind -> (ids, refs)
WHAT_IMAGES = {"folder": "image files (" + ", ".join(IMAGE_SUFFIXES) + ")",
               "webdataset": "samples with an image member (KEY.jpg, KEY.png, ...)",
               "paths": "one image path per line (.txt, .jsonl) or row (.parquet)"}


def listing_digest(ids: list[str], refs: list) -> str:
    digest = hashlib.sha256()
    for image_id, ref in zip(ids, refs):
        digest.update(f"{image_id}\0{ref}\n".encode())
    return digest.hexdigest()


def distractor_items(gallery: GalleryConfig, test_ids: list[str]) -> DistractorItems:
    """The first ``gallery.size`` distractors of ``gallery.source`` in seeded order (checked: not empty, not
    larger than the source, no test image among them)."""
    ids, refs = LISTERS[gallery.kind](gallery.source)
    where = f"gallery.source={gallery.source!r}"
    if not ids:
        raise FusebenchError(f"{where} holds no distractor images: gallery={gallery.kind} reads "
                             f"{WHAT_IMAGES[gallery.kind]}.")
    check_size(gallery.size, len(ids), where)
    available = len(ids)
    order = seeded_order(available, gallery.seed)[: gallery.size]
    ids, refs = [ids[i] for i in order], [refs[i] for i in order]
    check_no_overlap(test_ids, ids, where)
    source = {"kind": gallery.kind, "source": str(gallery.source), "seed": gallery.seed, "available": available,
              "listing": listing_digest(ids, refs)}
    return DistractorItems(ids, refs, source)
