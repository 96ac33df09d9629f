"""Atomic file writes: write a temp file beside the target, then rename it into place."""

from __future__ import annotations

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
