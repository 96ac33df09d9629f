"""Reading users' text files (manifests, annotation files) as UTF-8, with errors that name the line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fusebench import FusebenchError


def _not_utf8(path: Path, lineno: int, line: bytes, err: UnicodeDecodeError) -> FusebenchError:
    return FusebenchError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{line[err.start]:02x} at column {err.start + 1}); "
                          "save the file as UTF-8 (for example: iconv -f latin1 -t utf-8).")


def utf8_lines(path: Path, start: int = 1) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line) for each line of ``path``; a line that is not UTF-8 is an error
    naming its number."""
    with Path(path).open("rb") as fh:
        for lineno, line in enumerate(fh, start=start):
            try:
                yield lineno, line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(path, lineno, line, err) from None


def read_utf8(path: Path) -> str:
    """The whole of ``path`` as text; a byte that is not UTF-8 is an error naming its line and column."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line_end = data.find(b"\n", err.start)
        line = data[line_start:None if line_end < 0 else line_end]
        shifted = UnicodeDecodeError(err.encoding, err.object, err.start - line_start, err.end - line_start, err.reason)
        raise _not_utf8(path, data.count(b"\n", 0, err.start) + 1, line, shifted) from None
