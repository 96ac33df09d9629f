"""Decode and preprocess images in DataLoader worker processes, with a policy for unreadable files."""

from __future__ import annotations

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
    with Image.open(source) as image:
        image.load()
        return image.convert("RGB")


def bad_image_error(row: int, path: str | None, err: BaseException) -> BadImageError:
    """The one-line error for an unreadable image under embed.on_bad_image=fail."""
    return BadImageError(f"image {row} ({path}) cannot be read: {err}. Fix or remove the file, or set "
                         "embed.on_bad_image=skip to leave such images (and their captions) out.")


class ImageFiles(Dataset):
    """Row ``i`` -> (row index, model input), or for an unreadable file (row index, None) under the skip policy
    and (row index, BadImageError) under fail: returned, not raised, so that it is raised in the main process
    (a DataLoader worker's exception reaches the user as torch's many-line re-raise)."""

    def __init__(self, paths: Sequence[str | None], rows: np.ndarray, transform: Callable, on_bad_image: str):
        self.paths, self.rows, self.transform, self.on_bad_image = paths, rows, transform, on_bad_image

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = int(self.rows[i])
        path = self.paths[row]
        try:
            image = open_rgb(path)
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad image
            return row, (None if self.on_bad_image == "skip" else bad_image_error(row, path, err))
        return row, self.transform(image)


def _collate(items):
    rows = [row for row, _ in items]
    bad = [x for _, x in items if isinstance(x, BadImageError)]
    if bad:  # the batch's first unreadable image, raised by image_batches in the main process
        return rows, [], bad[0]
    good = [(row, x) for row, x in items if x is not None]
    if not good:
        return rows, [], None
    inputs = [x for _, x in good]
    if isinstance(inputs[0], dict):
        batch = {key: torch.stack([x[key] for x in inputs]) for key in inputs[0]}
    else:
        batch = torch.stack(inputs)
    return rows, [row for row, _ in good], batch


def image_batches(paths: Sequence[str | None], rows: np.ndarray, transform: Callable, batch_size: int,
                  num_workers: int, pin_memory: bool, on_bad_image: str) -> Iterator[tuple[list, list, object]]:
    """Yield (all rows of the batch, rows that decoded, stacked model inputs or None); under the fail policy the
    first unreadable image raises BadImageError here, in the calling process, whatever ``num_workers``."""
    if on_bad_image not in BAD_IMAGE_POLICIES:
        raise FusebenchError(f"embed.on_bad_image={on_bad_image!r} is not valid; valid: {', '.join(BAD_IMAGE_POLICIES)}.")
    loader = DataLoader(ImageFiles(paths, rows, transform, on_bad_image), batch_size=batch_size, shuffle=False,
                        num_workers=num_workers, pin_memory=pin_memory, collate_fn=_collate,
                        persistent_workers=False, prefetch_factor=4 if num_workers > 0 else None)
    for all_rows, good_rows, batch in loader:
        if isinstance(batch, BadImageError):
            raise batch
        yield all_rows, good_rows, batch
