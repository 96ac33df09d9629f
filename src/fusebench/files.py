"""Files fusebench writes and checks: atomic writes (a temp file beside the target, renamed into place) and
SHA-256 digests."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_save(path: Path, writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp)`` on a temp file in ``path``'s folder and rename it to ``path``; no partial file is left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_save(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()
