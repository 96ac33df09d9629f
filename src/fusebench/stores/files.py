"""Files fusebench writes and checks: atomic writes (a temp file beside the target, renamed into place),
SHA-256 digests (of files, and of arrays for store keys), CRC-32 checksums for the score store's large
matrices (2.5x faster to check here), and what sits where a file or a folder belongs (``not_a_file``,
``not_a_folder``, ``clear_path``)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fusebench.runtime import state

if TYPE_CHECKING:  # numpy is imported where an array is digested: run-dir checks start without it
    import numpy as np


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


def save_npy_synced(path: Path, array: np.ndarray) -> None:
    """``array`` as a .npy file at ``path``, flushed to disk before returning (an ``atomic_save`` writer)."""
    import numpy as np

    with path.open("wb") as fh:
        np.save(fh, array, allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    atomic_save(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def path_kind(path: Path) -> str:
    """What is at ``path``, links followed: "a file", "a directory", "missing", "a link to nowhere" or "neither a
    file nor a directory". One ``stat``, so a file another process or thread creates meanwhile (a store's lock
    file) is never taken for something else and removed while it is held."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to nowhere" if os.path.islink(path) else "missing"
    except NotADirectoryError:
        return "missing"  # a file where a parent folder should be: nothing can be at path
    except OSError as err:
        if err.errno == errno.ELOOP:  # links that point at each other
            return "a link to nowhere"
        raise
    if stat.S_ISREG(mode):
        return "a file"
    return "a directory" if stat.S_ISDIR(mode) else "neither a file nor a directory"


def not_a_file(path: Path) -> str | None:
    """What is at ``path`` when it is not a regular file (or a link to one), as ``path_kind`` says; None for one."""
    kind = path_kind(path)
    return None if kind == "a file" else kind


def not_a_folder(path: Path) -> str | None:
    """What is at ``path`` when it is not a folder (or a link to one), as ``path_kind`` says; None for one."""
    kind = path_kind(path)
    return None if kind == "a directory" else kind


def clear_path(path: Path) -> None:
    """Remove whatever is at ``path``: a file, a link (not what it points to), a directory tree; nothing when
    there is nothing (or when another process removed it first)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def array_digest(array: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes."""
    import numpy as np

    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    if array.size:  # memoryview cannot cast an empty array
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def file_crc32(path: Path, block: int = 1 << 24) -> str:
    """CRC-32 of a file's bytes, as 8 hex digits (catches truncation with the size, and any burst of flipped
    bits up to 32 long; an integrity check against damage, not against tampering)."""
    crc = 0
    with path.open("rb") as fh:
        while chunk := fh.read(block):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


class Crc32Writer:
    """A binary file wrapper that keeps the CRC-32 of what is written through it (``hex`` when done), so a
    file's checksum costs no second read."""

    def __init__(self, fh):
        self.fh, self.crc = fh, 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self.fh.write(data)

    @property
    def hex(self) -> str:
        return f"{self.crc:08x}"


CHECKSUMS: dict[str, Callable[[Path], str]] = {"sha256": file_sha256, "crc32": file_crc32}


def file_identity(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns): what changes when a file is replaced or written."""
    stat = Path(path).stat()
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _identity(path: Path, kind: str) -> tuple[str, int, int, int, int]:
    return kind, *file_identity(path)


def remembered_checksum(path: Path, kind: str = "sha256") -> str:
    """The file's ``kind`` checksum (``CHECKSUMS``), read once per process for a file unchanged since (same
    inode, size and mtime to the nanosecond; kept in the process state, ``runtime.state``): a score matrix (~0.5 GB
    per model) is not read again by every dense job of a sweep, nor the run files a job hashed when it wrote
    them by the same process's sweep report. A file changed since (a later mtime: the filesystem's clock) is
    read again."""
    known, key = state.current().checksums, _identity(path, kind)
    if key not in known:
        known[key] = CHECKSUMS[kind](path)
    return known[key]


def remember_checksum(path: Path, kind: str, value: str) -> None:
    """Record the checksum of a file this process has just written (computed from the bytes on their way out),
    so that it is not read back to be verified."""
    state.current().checksums[_identity(path, kind)] = value
