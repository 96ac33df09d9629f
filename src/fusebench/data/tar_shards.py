"""Webdataset tar shards as img2dataset writes them (``NNNNN.tar`` holding ``KEY.jpg``, ``KEY.txt``, ``KEY.json``):
their members listed from the headers alone, their shard patterns expanded, and one member's bytes read by offset.

* :func:`tar_members`: every regular member's (name, data offset, size), read from the 512-byte headers without
  reading any member's data: ustar, GNU (long names) and pax (path, size) headers are parsed here, about 4x
  faster than ``tarfile``'s iteration (which parses every field of every header); a tar using anything else
  (old GNU sparse members, pax keys other than path/size/times/owners) is listed by ``tarfile`` itself.
  Members are named as ``tarfile`` names them.
* :func:`expand_braces`: ``/data/{00000..00099}.tar`` and ``{a,b}`` as webdataset's shard lists expand them.
* :func:`read_member`: the bytes of ``TAR::MEMBER``; each process keeps (in its ``runtime.state``) the image members'
  offsets of every tar it has read from (numpy arrays, ~40 bytes a member) and up to ``OPEN_TARS`` open files,
  read with ``os.pread`` (no shared file position: files inherited by forked DataLoader workers stay correct).
"""

from __future__ import annotations

import os
import re
import tarfile

import numpy as np

from fusebench import FusebenchError
from fusebench.runtime import state

BLOCK = 512
TAR_REF = ".tar::"  # a distractor's ref TAR::MEMBER, e.g. /data/00000.tar::000000012.jpg
IMAGE_EXTENSIONS = frozenset(("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"))  # a sample's image field
OPEN_TARS = 32  # file handles a process keeps open (a gallery spans hundreds of shards, read in seeded order)
_PAX_KEYS = frozenset(("path", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "linkpath",
                       "comment", "charset", "hdrcharset"))  # pax keys that change no listed name, offset or size
_REGULAR = (b"0", b"\0", b"7")  # tarfile.REGULAR_TYPES, less GNU sparse (listed by tarfile instead)
_SKIPPED = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, fifos: no data of an image


class _Unusual(Exception):
    """A header construct the fast reader leaves to tarfile."""


def sample_key(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name as webdataset splits it (``base_plus_ext``: the key is everything before
    the first dot of the file name, folders included; the extension, lower-cased, everything after it); None for
    a name without one."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot <= slash:
        return None
    return name[:dot], name[dot + 1:].lower()


def _nts(field: bytes) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU's base-256 when its first byte has the high bit (tarfile.nti)."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    end = field.find(b"\0")
    text = (field if end < 0 else field[:end]).strip()
    return int(text or b"0", 8)


def _pax_records(data: bytes) -> dict[str, str]:
    """A pax header's ``LEN key=value\\n`` records."""
    records, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        records[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _checksum_ok(header: bytes) -> bool:
    stored = _number(header[148:156])
    return stored == sum(header[:148]) + 256 + sum(header[156:])


def _fast_members(fd: int, end: int) -> list[tuple[str, int, int]]:
    """The fast header reader; raises _Unusual where tarfile should decide, ValueError for damage."""
    out, pos, name_next, size_next = [], 0, None, None
    while pos + BLOCK <= end:
        header = os.pread(fd, BLOCK, pos)
        if header.count(0) == BLOCK:  # the end-of-archive marker
            break
        if header[257:262] != b"ustar" or (pos == 0 and not _checksum_ok(header)):
            if pos == 0:
                raise _Unusual  # a v7 tar, a compressed file, not a tar: tarfile says which
            raise ValueError(f"no tar header at byte {pos:,} (the file is damaged or was cut short)")
        size, kind, data = _number(header[124:136]), header[156:157], pos + BLOCK
        if kind in (b"L", b"x", b"g"):
            payload = os.pread(fd, size, data)
            if kind == b"L":
                name_next = _nts(payload)
            else:
                records = _pax_records(payload)
                if kind == b"g" or set(records) - _PAX_KEYS:
                    raise _Unusual
                name_next = records.get("path", name_next)
                size_next = int(records["size"]) if "size" in records else None
        elif kind == b"K":
            pass  # a long link name: applies to a link, which is not listed
        else:
            if size_next is not None:
                size = size_next
            if kind in _REGULAR:
                name = name_next
                if name is None:
                    prefix, name = _nts(header[345:500]), _nts(header[:100])
                    name = f"{prefix}/{name}" if prefix else name
                if not (kind == b"\0" and name.endswith("/")):  # a v7 directory
                    if data + size > end:
                        raise ValueError(f"member {name!r} runs past the end of the file (cut short?)")
                    out.append((name, data, size))
            elif kind not in _SKIPPED:
                raise _Unusual  # GNU sparse, multi-volume, vendor types
            name_next = size_next = None
        pos = data + -(-size // BLOCK) * BLOCK
    else:
        if pos < end:
            raise ValueError(f"the file ends inside a header at byte {pos:,} (cut short?)")
    return out


def _tarfile_members(path: str) -> list[tuple[str, int, int]]:
    with tarfile.open(path, "r:") as archive:
        return [(info.name, info.offset_data, info.size) for info in archive if info.isreg()]


def tar_members(path: str) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of every regular member of the uncompressed tar at ``path``, in archive order,
    from its headers alone; a damaged tar or another kind of file is a FusebenchError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        raise FusebenchError(f"{path}: cannot be opened ({err.strerror or err}).") from None
    try:
        try:
            return _fast_members(fd, os.fstat(fd).st_size)
        except _Unusual:
            return _tarfile_members(path)
    except (ValueError, tarfile.TarError, EOFError) as err:
        raise FusebenchError(f"{path}: not a readable uncompressed tar ({err}); webdataset shards must be plain "
                             ".tar files (img2dataset writes them so; gunzip a .tar.gz).") from None
    finally:
        os.close(fd)


_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


def _brace_group(pattern: str) -> tuple[int, int] | None:
    """(start, end) of the first top-level ``{...}`` of ``pattern``; None when it has none."""
    start = pattern.find("{")
    if start < 0:
        if "}" in pattern:
            raise FusebenchError(f"{pattern!r}: '}}' without '{{' (a brace pattern is like /data/{{00000..00099}}.tar)")
        return None
    depth = 0
    for i in range(start, len(pattern)):
        depth += {"{": 1, "}": -1}.get(pattern[i], 0)
        if depth == 0:
            return start, i
    raise FusebenchError(f"{pattern!r}: '{{' without its '}}' (a brace pattern is like /data/{{00000..00099}}.tar)")


def _alternatives(inner: str) -> list[str]:
    """A group's top-level comma-separated parts, or its numeric range (zero-padded as written)."""
    match = _RANGE.fullmatch(inner)
    if match:
        low, high = match.group(1), match.group(2)
        width = max(len(low), len(high)) if low.lstrip("-").startswith("0") or high.lstrip("-").startswith("0") else 0
        step = 1 if int(high) >= int(low) else -1
        return [str(i).zfill(width) for i in range(int(low), int(high) + step, step)]
    parts, depth, last = [], 0, 0
    for i, char in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(inner[last:i])
            last = i + 1
    return [*parts, inner[last:]]


def expand_braces(pattern: str) -> list[str]:
    """Every string ``pattern`` stands for, in order: ``{00000..00099}`` a zero-padded range, ``{a,b}`` choices,
    groups nested or several in one pattern (as webdataset's braceexpand)."""
    group = _brace_group(pattern)
    if group is None:
        return [pattern]
    start, end = group
    heads = [pattern[:start] + choice for part in _alternatives(pattern[start + 1:end]) for choice in expand_braces(part)]
    return [head + tail for head in heads for tail in expand_braces(pattern[end + 1:])]


def split_ref(ref: str) -> tuple[str, str] | None:
    """(tar path, member name) of a ``TAR::MEMBER`` ref; None for a plain file path."""
    tar, sep, member = ref.partition(TAR_REF)
    return (tar + ".tar", member) if sep else None


class _TarIndex:
    """One tar's image members (names sorted, as bytes) with their data offsets and sizes, and the tar's file
    while it is among the ``OPEN_TARS`` most recently read."""

    def __init__(self, path: str, identity: tuple):
        members = [m for m in tar_members(path) if (sample_key(m[0]) or ("", ""))[1] in IMAGE_EXTENSIONS]
        names = np.array([m[0].encode("utf-8", "surrogateescape") for m in members], dtype=bytes)
        order = np.argsort(names, kind="stable")
        self.identity, self.names, self.file = identity, names[order], None
        self.offsets = np.array([m[1] for m in members], dtype=np.int64)[order]
        self.sizes = np.array([m[2] for m in members], dtype=np.int64)[order]

    def find(self, member: str) -> tuple[int, int] | None:
        key = member.encode("utf-8", "surrogateescape")
        i = int(np.searchsorted(self.names, key))
        if i < len(self.names) and self.names[i] == key:
            return int(self.offsets[i]), int(self.sizes[i])
        return None


def _file_identity(fd: int) -> tuple:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _open_tar(tar: str) -> _TarIndex:
    """The tar's index with its file open (kept in the process state, most recently used last); a tar replaced
    since it was indexed is indexed again; beyond OPEN_TARS open files the least recently used is closed."""
    tars = state.current().tars
    entry = tars.pop(tar, None)
    if entry is None or entry.file is None:
        file = open(tar, "rb", buffering=0)  # noqa: SIM115 - kept open in the process state, closed on eviction
        identity = _file_identity(file.fileno())
        if entry is None or entry.identity != identity:
            entry = _TarIndex(tar, identity)
        entry.file = file
        still_open = [e for e in tars.values() if e.file is not None]
        for old in still_open[: max(0, len(still_open) + 1 - OPEN_TARS)]:
            old.file.close()
            old.file = None
    tars[tar] = entry
    return entry


def read_member(ref: str) -> bytes:
    """The bytes of the image member a ``TAR::MEMBER`` ref names; a member the tar does not hold is a
    FileNotFoundError naming both."""
    tar, member = split_ref(ref)
    entry = _open_tar(tar)
    found = entry.find(member)
    if found is None:
        raise FileNotFoundError(f"tar {tar} has no image member {member!r}")
    offset, size = found
    data = os.pread(entry.file.fileno(), size, offset)
    if len(data) != size:
        raise OSError(f"tar {tar}: member {member!r} is cut short ({len(data)} of {size} bytes)")
    return data
