"""The ``hf`` dataset kind's reading: a table with an image column and a captions column, as COCO Karpathy and
Flickr30k are commonly shared on the Hugging Face hub (nlphuji/flickr30k, yerevann/coco-karpathy): a ``.parquet``
file, a folder of them, or a folder written by ``datasets``' ``save_to_disk`` (a Dataset, or a DatasetDict with
``dataset.split`` naming one of its splits).

Two layouts: one row per image with a list of captions (``caption_column`` a list of strings; ids unique), or one
caption per row (``caption_column`` a string; rows grouped by ``id_column`` in first-appearance order, every row of
an image holding the same image). An image is ``{"bytes", "path"}`` (``datasets``' Image feature), bytes, or a path
string (relative to ``image_root``). Images given as bytes are written once, unchanged, to ``image_dir`` under their
content digest (``SHA256.png``), so the corpus holds file paths as every other kind's does and the encoders read them
as files; the same bytes give the same path, so embedding caches keyed on the paths are reused.

Parquet needs pyarrow only; a ``save_to_disk`` folder needs ``datasets`` (``pip install 'fusebench[datasets]'``).
Every mistake in the data is one FusebenchError naming the file, the column and what is valid.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus, validate_corpus

EXTRA = "pip install 'fusebench[datasets]'"
SAVED = ("dataset_dict.json", "state.json")  # what datasets' save_to_disk writes: a DatasetDict's, a Dataset's
SHOW = 8  # values listed in a message
MAGIC = {b"\x89PNG": ".png", b"\xff\xd8\xff": ".jpg", b"GIF8": ".gif", b"RIFF": ".webp", b"BM": ".bmp"}



def one_line(err: BaseException) -> str:
    """A library's error text as one line (pyarrow's schema errors print both schemas over many lines)."""
    return " ".join(str(err).split())

def _pyarrow():
    try:
        import pyarrow as pa  # optional: the gallery and datasets extras install it
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        raise FusebenchError(f"dataset kind hf reads parquet with pyarrow, which is not installed: {EXTRA} "
                             "(or pip install pyarrow).") from None
    return pa, pc, pq


def _listing(values) -> str:
    values = list(values)
    more = f", ... ({len(values)} in all)" if len(values) > SHOW else ""
    return ", ".join(map(str, values[:SHOW])) + more


def _saved_dataset(path: Path, split: str | None):
    """The table of a ``save_to_disk`` folder (the DatasetDict's ``split``), and whether ``split`` chose it."""
    try:
        import datasets  # optional and heavy: only a save_to_disk folder needs it
    except ImportError:
        raise FusebenchError(f"dataset.path={path} is a folder written by datasets' save_to_disk, which needs the "
                             f"datasets package: {EXTRA} (or save it as parquet: Dataset.to_parquet).") from None
    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - any failure to read the folder is the user's data
        raise FusebenchError(f"dataset.path={path}: datasets.load_from_disk cannot read it ({one_line(err)}).") from None
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise FusebenchError(f"dataset.split={split!r} is not a split of the DatasetDict {path}; valid: "
                                 f"{_listing(saved)}.")
        return saved[split].with_format("arrow")[:], True
    return saved.with_format("arrow")[:], False


def read_table(path: Path, split: str | None):
    """(table, the file named in messages, whether ``split`` chose a saved DatasetDict's split)."""
    pa, _, pq = _pyarrow()
    if not path.exists():
        raise FusebenchError(f"dataset.path={path} does not exist; give a .parquet file, a folder of .parquet files, "
                             "or a folder written by datasets' save_to_disk.")
    if path.is_dir() and any((path / name).is_file() for name in SAVED):
        table, chose = _saved_dataset(path, split)
        return table, str(path), chose
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FusebenchError(f"dataset.path={path} holds no .parquet file (nor a datasets save_to_disk folder).")
    tables = []
    for file in files:
        try:
            tables.append(pq.read_table(file))
        except (OSError, ValueError) as err:  # pyarrow's errors derive from these
            raise FusebenchError(f"{file}: not a readable parquet file ({one_line(err)}).") from None
    try:
        return pa.concat_tables(tables), str(path if len(files) > 1 else files[0]), False
    except (pa.ArrowInvalid, ValueError) as err:
        raise FusebenchError(f"dataset.path={path}: its parquet files do not share one schema ({one_line(err)}).") from None


def _column(table, name: str, key: str, source: str):
    if name not in table.column_names:
        raise FusebenchError(f"{source}: no column {name!r} ({key}); its columns: {', '.join(table.column_names)}.")
    return table.column(name)


def _rows_of_split(table, params, source: str, chose: bool):
    """The rows of ``params.split``: by ``split_column``, by a saved DatasetDict's split, or every row."""
    pa, pc, _ = _pyarrow()
    if params.split_column is None:
        if params.split is not None and not chose:
            raise FusebenchError(f"dataset.split={params.split!r}: {source} is one table; name the column holding "
                                 "each row's split (dataset.split_column, e.g. split), or set dataset.split=null for "
                                 "every row.")
        return table
    column = _column(table, params.split_column, "dataset.split_column", source)
    values = column.to_pylist()
    bad = next((row for row, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):  # a null
        raise FusebenchError(f"{source}: column {params.split_column!r} (dataset.split_column), row {bad}: no split "
                             "(null); every row needs its split's name.")
    if not all(isinstance(v, str) for v in values):
        raise FusebenchError(f"{source}: column {params.split_column!r} (dataset.split_column) is {column.type}; it "
                             "must hold each row's split as a string (test, val, train).")
    rows = table.filter(pc.equal(column, params.split))
    if rows.num_rows == 0:
        counts = {v: values.count(v) for v in sorted(set(values))}
        raise FusebenchError(f"{source}: no rows with {params.split_column} = {params.split!r} (dataset.split); "
                             f"valid: {_listing(f'{v} ({n})' for v, n in counts.items())}.")
    return rows


def _captions(table, name: str, source: str) -> tuple[list, bool]:
    """Each row's captions, and whether the column is a list per row (else one caption per row)."""
    pa, _, _ = _pyarrow()
    column = _column(table, name, "dataset.caption_column", source)
    kind = column.type
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    text = kind.value_type if listed else kind
    if not (pa.types.is_string(text) or pa.types.is_large_string(text)):
        raise FusebenchError(f"{source}: column {name!r} (dataset.caption_column) is {kind}; valid: a list of "
                             "strings per image, or one string per row (with dataset.id_column grouping the rows).")
    values = column.to_pylist()
    for row, value in enumerate(values):
        if value is None or listed and any(c is None for c in value):
            raise FusebenchError(f"{source}: column {name!r} (dataset.caption_column), row {row}: a caption is null; "
                                 "every caption must be a string.")
    return values, listed


def _images(table, name: str, source: str) -> list:
    """Each row's image: bytes, or a path string."""
    pa, _, _ = _pyarrow()
    column = _column(table, name, "dataset.image_column", source)
    kind = column.type
    fields = {kind.field(i).name for i in range(kind.num_fields)} if pa.types.is_struct(kind) else set()
    if not (fields & {"bytes", "path"} or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise FusebenchError(f"{source}: column {name!r} (dataset.image_column) is {kind}; valid: datasets' Image "
                             "({bytes, path}), the image file's bytes, or its path as a string.")
    out = []
    for row, value in enumerate(column.to_pylist()):
        if isinstance(value, dict):
            value = value.get("bytes") or value.get("path")
        if not value:
            raise FusebenchError(f"{source}: column {name!r} (dataset.image_column), row {row}: no image (neither "
                                 "bytes nor a path).")
        out.append(value)
    return out


def _ids(table, params, source: str) -> list[str]:
    if params.id_column is None:
        return [str(row) for row in range(table.num_rows)]
    values = _column(table, params.id_column, "dataset.id_column", source).to_pylist()
    for row, value in enumerate(values):
        if value is None or isinstance(value, (bytes, dict, list, float)):
            raise FusebenchError(f"{source}: column {params.id_column!r} (dataset.id_column), row {row}: {value!r} is "
                                 "not an image id; valid: a string or an integer per row.")
    return [str(value) for value in values]


def _grouped(ids: list[str], images: list, captions: list, listed: bool, params, source: str):
    """(image ids, images, captions per image), in first-appearance order."""
    if listed:
        first: dict[str, int] = {}
        for row, image_id in enumerate(ids):
            if image_id in first:
                raise FusebenchError(f"{source}: column {params.id_column!r} (dataset.id_column): image id {image_id!r} "
                                     f"is on rows {first[image_id]} and {row}; with a list of captions per row "
                                     "(dataset.caption_column) each image is one row, its id unique.")
            first[image_id] = row
        return ids, images, captions
    if params.id_column is None:
        raise FusebenchError(f"{source}: column {params.caption_column!r} (dataset.caption_column) holds one caption "
                             "per row; set dataset.id_column to the column naming each row's image, which groups "
                             "the captions of one image.")
    first: dict[str, int] = {}  # image id -> its first row
    index: dict[str, int] = {}  # image id -> its place in the corpus
    out_images, out_captions = [], []
    for row, (image_id, image, caption) in enumerate(zip(ids, images, captions)):
        if image_id not in index:
            first[image_id], index[image_id] = row, len(index)
            out_images.append(image)
            out_captions.append([])
        elif images[first[image_id]] != image:
            raise FusebenchError(f"{source}: image id {image_id!r} (dataset.id_column={params.id_column}) has a "
                                 f"different image on rows {first[image_id]} and {row}; the rows of one image id "
                                 "must hold the same image.")
        out_captions[index[image_id]].append(caption)
    return list(index), out_images, out_captions


def image_file(data: bytes, folder: Path) -> str:
    """The file holding ``data`` unchanged in ``folder``, named by its SHA-256 (written once, atomically)."""
    digest = hashlib.sha256(data).hexdigest()
    suffix = next((ext for magic, ext in MAGIC.items() if data.startswith(magic)), "")
    path = folder / f"{digest}{suffix}"
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return str(path)  # written before, and still these bytes (a damaged file is written again)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written is left
        raise
    return str(path)


def _paths(images: list, params, path: Path, source: str) -> list[str]:
    root = Path(params.image_root).expanduser() if params.image_root else (path if path.is_dir() else path.parent)
    if any(isinstance(image, bytes) for image in images):
        if not params.image_dir:
            raise FusebenchError(f"{source}: column {params.image_column!r} (dataset.image_column) holds image bytes; "
                                 "set dataset.image_dir to a folder where they are written once as files (e.g. "
                                 "${paths.output_dir}/cache/dataset_images).")
        folder = Path(params.image_dir).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return [image_file(image, folder) if isinstance(image, bytes) else str(root / image) for image in images]
        except OSError as err:
            raise FusebenchError(f"dataset.image_dir={folder}: cannot write the images there ({err}).") from None
    return [str(root / Path(image).expanduser()) for image in images]


def load_table(params) -> Corpus:
    """The corpus of an ``hf`` dataset config (:class:`fusebench.data.kinds.hf.HFDatasetConfig`)."""
    path = Path(params.path).expanduser()
    table, source, chose = read_table(path, params.split)
    table = _rows_of_split(table, params, source, chose)
    captions, listed = _captions(table, params.caption_column, source)
    ids, images, per_image = _grouped(_ids(table, params, source), _images(table, params.image_column, source),
                                      captions, listed, params, source)
    counts = [len(c) for c in per_image]
    corpus = Corpus(name=params.name, image_ids=ids, captions=[c for caps in per_image for c in caps],
                    caption_image=np.repeat(np.arange(len(ids), dtype=np.int64), counts),
                    image_paths=_paths(images, params, path, source),
                    meta={"source": source, **({"split": params.split} if params.split is not None else {})}, kind="hf")
    return validate_corpus(corpus, source)
