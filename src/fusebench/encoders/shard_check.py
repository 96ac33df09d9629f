"""``fusebench-cache verify``: a gallery shard's images read again and checked against the content digests recorded
when they were embedded (the entry's ``contents.json``: each row's file and the SHA-256 of the bytes decoded).

A shard's cache key holds each file's size and mtime (one stat per file when a run makes the key), so a file
replaced with the same size and mtime keeps the key, and a run reads the old rows. This check is what finds it: it
reads every image's bytes (no decoding) and names the rows whose bytes differ from what was embedded, or that
cannot be read now. A row that could not be read when it was embedded (digest None: skipped under
``embed.on_bad_image=skip``) is not checked here: a run tries such a file again on every read of its shard.
"""

from __future__ import annotations

from collections.abc import Callable

from fusebench.encoders.fingerprint import first_line
from fusebench.encoders.images import content_digest, image_bytes


def changed_images(contents: list, progress: Callable[[int], None] | None = None) -> list[dict]:
    """The rows of a shard's content record (``[ref, digest]`` per row) whose file's bytes are not the ones
    embedded: ``{"row", "ref", "why"}``, in row order (``why``: "content changed", or why it cannot be read)."""
    changed = []
    for row, (ref, digest) in enumerate(contents):
        if progress is not None:
            progress(1)
        if digest is None:
            continue
        try:
            now = content_digest(image_bytes(ref))
        except Exception as err:  # noqa: BLE001 - a file gone or unreadable is a changed image, named as such
            changed.append({"row": row, "ref": ref, "why": f"cannot be read now: {first_line(err)}"})
            continue
        if now != digest:
            changed.append({"row": row, "ref": ref, "why": "content changed"})
    return changed
