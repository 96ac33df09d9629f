"""Decode and preprocess images in DataLoader worker processes, with a policy for unreadable files."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fusebench import FusebenchError
from fusebench.data.tar_shards import read_member, split_ref

BAD_IMAGE_POLICIES = ("fail", "skip")


class BadImageError(FusebenchError):
    pass


class _Member(io.BytesIO):
    """A tar member's bytes, shown as its ``TAR::MEMBER`` ref: PIL's messages name an in-memory file by its repr
    (``cannot identify image file <_io.BytesIO object at 0x...>``), which told the user nothing."""

    def __init__(self, data: bytes, ref: str):
        super().__init__(data)
        self.ref = ref

    def __repr__(self) -> str:
        return repr(self.ref)


def open_rgb(path: str | None) -> Image.Image:
    """The image file (or ``TAR::MEMBER``, a member of a webdataset shard) decoded to RGB; raises (anything) when
    it cannot be read."""
    if path is None:
        raise FileNotFoundError("the dataset gives no file path for this image")
    source = _Member(read_member(path), path) if split_ref(path) else path
    return _decoded(source)


def _decoded(source) -> Image.Image:
    with Image.open(source) as image:
        image.load()
        return image.convert("RGB")


def image_bytes(path: str) -> bytes:
    """The bytes of an image file or ``TAR::MEMBER`` (what its content digest is of); raises OSError when it
    cannot be read."""
    if split_ref(path):
        return read_member(path)
    with open(path, "rb") as fh:
        return fh.read()


def content_digest(data: bytes) -> str:
    """An image's content digest: the SHA-256 of its file's (or tar member's) bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def read_rgb(path: str | None) -> tuple[Image.Image | None, str | None, BaseException | None]:
    """An image's bytes read once: (decoded RGB image, content digest of the bytes, None), or what failed: the
    digest is None when the bytes could not be read, the image None when they could not be decoded."""
    if path is None:
        return None, None, FileNotFoundError("the dataset gives no file path for this image")
    try:
        data = image_bytes(path)
    except Exception as err:  # noqa: BLE001 - an unreadable file is a bad image
        return None, None, err
    try:
        return _decoded(_Member(data, path)), content_digest(data), None
    except Exception as err:  # noqa: BLE001 - any decoder failure is a bad image
        return None, content_digest(data), err


def bad_image_error(row: int, path: str | None, err: BaseException) -> BadImageError:
    """The one-line error for an unreadable image under embed.on_bad_image=fail."""
    return BadImageError(f"image {row} ({path}) cannot be read: {err}. Fix or remove the file, or set "
                         "embed.on_bad_image=skip to leave such images (and their captions) out.")


class ImageFiles(Dataset):
    """Row ``i`` -> (row index, model input), or for an unreadable file (row index, None) under the skip policy
    and (row index, BadImageError) under fail: returned, not raised, so that it is raised in the main process
    (a DataLoader worker's exception reaches the user as torch's many-line re-raise). With ``digests``, a third
    element: the content digest of the bytes decoded (``read_rgb``: the file read once), None when unreadable."""

    def __init__(self, paths: Sequence[str | None], rows: np.ndarray, transform: Callable, on_bad_image: str,
                 digests: bool = False):
        self.paths, self.rows, self.transform, self.on_bad_image = paths, rows, transform, on_bad_image
        self.digests = digests

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = int(self.rows[i])
        path = self.paths[row]
        if self.digests:
            image, digest, err = read_rgb(path)
            if err is not None:
                return row, (None if self.on_bad_image == "skip" else bad_image_error(row, path, err)), None
            return row, self.transform(image), digest
        try:
            image = open_rgb(path)
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad image
            return row, (None if self.on_bad_image == "skip" else bad_image_error(row, path, err))
        return row, self.transform(image)


def _collate(items):
    rows = [item[0] for item in items]
    digests = [item[2] if len(item) > 2 else None for item in items]
    bad = [item[1] for item in items if isinstance(item[1], BadImageError)]
    if bad:  # the batch's first unreadable image, raised by image_batches in the main process
        return rows, [], bad[0], digests
    good = [(item[0], item[1]) for item in items if item[1] is not None]
    if not good:
        return rows, [], None, digests
    inputs = [x for _, x in good]
    if isinstance(inputs[0], dict):
        batch = {key: torch.stack([x[key] for x in inputs]) for key in inputs[0]}
    elif isinstance(inputs[0], torch.Tensor):
        batch = torch.stack(inputs)
    else:  # a backend that preprocesses in its encode (sentence_transformers: PIL images)
        batch = inputs
    return rows, [row for row, _ in good], batch, digests


def image_batches(paths: Sequence[str | None], rows: np.ndarray, transform: Callable, batch_size: int,
                  num_workers: int, pin_memory: bool, on_bad_image: str,
                  digests: bool = False) -> Iterator[tuple]:
    """Yield (all rows of the batch, rows that decoded, stacked model inputs or None), and with ``digests`` a
    fourth element: each row's content digest (None: unreadable); under the fail policy the first unreadable
    image raises BadImageError here, in the calling process, whatever ``num_workers``."""
    if on_bad_image not in BAD_IMAGE_POLICIES:
        raise FusebenchError(f"embed.on_bad_image={on_bad_image!r} is not valid; valid: {', '.join(BAD_IMAGE_POLICIES)}.")
    loader = DataLoader(ImageFiles(paths, rows, transform, on_bad_image, digests), batch_size=batch_size,
                        shuffle=False, num_workers=num_workers, pin_memory=pin_memory, collate_fn=_collate,
                        persistent_workers=False, prefetch_factor=4 if num_workers > 0 else None)
    for all_rows, good_rows, batch, found in loader:
        if isinstance(batch, BadImageError):
            raise batch
        yield (all_rows, good_rows, batch, found) if digests else (all_rows, good_rows, batch)
