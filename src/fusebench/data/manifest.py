"""The ``manifest`` dataset: a JSONL file, one line per image, in order.

``{"image_id": "...", "path": "optional/relative.jpg", "captions": ["...", ...], "caption_ids": [1, ...]}``

``caption_ids`` (optional): one integer per caption, stable across files (COCO's caption annotation ids, as
Karpathy's ``sentids``); extra-positive evaluation (``eval.positives``) needs them, on every line or none.
Any other key is an error naming it (a misspelt ``"caption"`` would otherwise make the image a distractor).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus, validate_corpus
from fusebench.data.input_files import not_a_directory, utf8_lines

KEYS = ("image_id", "path", "captions", "caption_ids")  # a line's keys: any other is a mistake, never ignored


def _unknown_keys(record: dict, where: str) -> None:
    unknown = [str(key) for key in record if key not in KEYS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], KEYS, n=1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        raise FusebenchError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}{guess} (valid keys: "
                             f"{', '.join(KEYS)}).")


def _parse_line(text: str, where: str) -> tuple[str, str | None, list[str], list[int] | None]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise FusebenchError(f"{where}: not valid JSON ({err.msg} at column {err.colno}); each line must be one JSON object.") from None
    if not isinstance(record, dict):
        raise FusebenchError(f"{where}: expected a JSON object like {{\"image_id\": ..., \"captions\": [...]}}, "
                             f"got {type(record).__name__}.")
    _unknown_keys(record, where)
    if "image_id" not in record:
        raise FusebenchError(f"{where}: missing key 'image_id' (valid keys: {', '.join(KEYS)}).")
    image_id = record["image_id"]
    if not isinstance(image_id, (str, int)) or isinstance(image_id, bool):
        raise FusebenchError(f"{where}: 'image_id' must be a string or integer, got {type(image_id).__name__}.")
    path = record.get("path")
    if path is not None and not isinstance(path, str):
        raise FusebenchError(f"{where}: 'path' must be a string or absent, got {type(path).__name__}.")
    captions = record.get("captions", [])
    if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
        raise FusebenchError(f"{where}: 'captions' must be a list of strings (it may be empty for a distractor image).")
    ids = record.get("caption_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) != len(captions)
                            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise FusebenchError(f"{where}: 'caption_ids' must be a list of integers, one per caption "
                             f"({len(captions)} here), or absent.")
    return str(image_id), path, captions, ids


def load_manifest(path: str | Path, name: str = "manifest", image_root: str | Path | None = None) -> Corpus:
    """Read a JSONL manifest into a :class:`Corpus`; errors name the file and the 1-based line.

    Relative image paths are resolved against ``image_root`` (default: the manifest's folder).
    """
    path = Path(path)
    root = Path(image_root).expanduser() if image_root else path.parent
    not_a_directory(path, "dataset.manifest", "the JSONL manifest, one line per image")
    if not path.is_file():
        raise FusebenchError(f"manifest file not found: {path} (set dataset.manifest=/path/to/file.jsonl).")
    image_ids: list[str] = []
    paths: list[str | None] = []
    captions: list[str] = []
    caption_image: list[int] = []
    first_line: dict[str, int] = {}
    caption_ids: list[int] = []
    with_ids: list[int] = []  # line numbers with caption_ids
    without_ids: list[int] = []  # line numbers with captions but no caption_ids
    for lineno, text in utf8_lines(path):
        if not text.strip():
            continue
        where = f"{path}:{lineno}"
        image_id, image_path, caps, ids = _parse_line(text, where)
        if caps:
            (with_ids if ids is not None else without_ids).append(lineno)
            caption_ids.extend(ids or [])
        if image_id in first_line:
            raise FusebenchError(f"{where}: duplicate image_id {image_id!r} (first seen on line {first_line[image_id]}).")
        first_line[image_id] = lineno
        index = len(image_ids)
        image_ids.append(image_id)
        paths.append(None if image_path is None else str(root / Path(image_path).expanduser()))
        captions.extend(caps)
        caption_image.extend([index] * len(caps))
    if not image_ids:
        raise FusebenchError(f"{path}: the manifest is empty; it needs one JSON line per image.")
    if with_ids and without_ids:
        raise FusebenchError(f"{path}:{without_ids[0]}: no 'caption_ids', but line {with_ids[0]} has them; give "
                             "caption ids on every line with captions, or on none.")
    corpus = Corpus(
        name=name,
        image_ids=image_ids,
        captions=captions,
        caption_image=np.asarray(caption_image, dtype=np.int64),
        image_paths=paths,
        meta={"source": str(path)},
        caption_ids=caption_ids if with_ids else None,
        kind="manifest",
    )
    return validate_corpus(corpus, str(path))
