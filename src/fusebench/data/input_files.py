"""Reading users' input files: text (manifests, annotation files) as UTF-8 with or without a byte-order mark,
with errors that name the line; and the check that a path meant as a file is not a directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fusebench import FusebenchError


def _not_utf8(path: Path, lineno: int, line: bytes, err: UnicodeDecodeError) -> FusebenchError:
    return FusebenchError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{line[err.start]:02x} at column {err.start + 1}); "
                          "save the file as UTF-8 (for example: iconv -f latin1 -t utf-8).")


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which some editors (Notepad, Excel) write first: skipped


def not_a_directory(path: Path, key: str, wanted: str) -> None:
    """Refuse ``path`` (the value of config key ``key``) when it is a directory: ``wanted`` says what file it
    must name."""
    if Path(path).is_dir():
        raise FusebenchError(f"{key}={path} is a directory; it must name a file ({wanted}).")


def utf8_lines(path: Path, start: int = 1) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line) for each line of ``path`` (a leading byte-order mark dropped); a line
    that is not UTF-8 is an error naming its number."""
    with Path(path).open("rb") as fh:
        for lineno, line in enumerate(fh, start=start):
            if lineno == start and line.startswith(BOM):
                line = line[len(BOM):]
            try:
                yield lineno, line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(path, lineno, line, err) from None


def read_utf8(path: Path) -> str:
    """The whole of ``path`` as text (a leading byte-order mark dropped); a byte that is not UTF-8 is an error
    naming its line and column."""
    data = Path(path).read_bytes()
    data = data[len(BOM):] if data.startswith(BOM) else data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line_end = data.find(b"\n", err.start)
        line = data[line_start:None if line_end < 0 else line_end]
        shifted = UnicodeDecodeError(err.encoding, err.object, err.start - line_start, err.end - line_start, err.reason)
        raise _not_utf8(path, data.count(b"\n", 0, err.start) + 1, line, shifted) from None
