"""W&B's offline run file (``wandb/offline-run-*/run-*.wandb``) read back: the one place fusebench relies on how
W&B stores a run, to check what a run logged (``tests/test_tracking.py``) without a W&B server.

W&B has no public reader for it: ``wandb.Api`` reads a server, ``wandb sync`` only uploads, and the Python reader
W&B once shipped (``wandb.sdk.internal.datastore``) left with wandb-core (0.31 writes the file from its Go
service; an offline run's ``files/`` holds only ``requirements.txt``). So this module reads the file itself. What
it relies on, none of it W&B's public API:

- the file layout of W&B's LevelDB-style log: a 7-byte header (``:W&B``, the magic ``0xBEE1``, version ``0``), then
  32 KiB blocks of records, each with a 7-byte header (CRC-32, length, type: 1 full, 2 first, 3 middle, 4 last;
  a zero header pads a block's end);
- ``wandb.proto.wandb_internal_pb2.Record``: each record's protobuf message, its ``record_type`` oneof and the
  fields ``RECORD_FIELDS`` names.

Checked against wandb 0.31.0 with protobuf 7.36.2 (``CHECKED``). ``tests/test_wandb_files.py`` reads a file wandb
0.31.0 wrote and checks the installed wandb's messages against ``RECORD_FIELDS``, failing with the version and the
field when W&B changes them. Imported only where a file is read (wandb is an extra; never at start-up).
"""

from __future__ import annotations

import struct
from pathlib import Path

CHECKED = {"wandb": ("0.31.0",), "protobuf": ("7.36.2",)}  # the versions this reader was checked against
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)  # ident, magic, the one log version read
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
# the Record fields fusebench reads: record type -> the paths into it (message.field, repeated fields by name)
RECORD_FIELDS = {"run": ("config.update.key", "config.update.value_json"),
                 "config": ("update.key", "update.value_json"),
                 "summary": ("update.key", "update.nested_key", "update.value_json"),
                 "history": ("item.key", "item.nested_key"),
                 "artifact": ("type", "manifest.contents.path")}


def _record_bytes(data: bytes) -> list[bytes]:
    """Each record's bytes, its pieces (first, middle..., last) joined."""
    pos, records, pending = len(HEADER), [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += left - 7
            continue
        chunk = data[pos:pos + length]
        pos += length
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            records.append(pending + chunk)
    return records


def read_wandb_file(path: str | Path) -> list:
    """The protobuf records (``wandb_internal_pb2.Record``) of an offline ``.wandb`` file, in order. A file that
    is not one, or of a log version this reader does not know, is a ValueError naming it."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != HEADER[:4]:
        raise ValueError(f"{path} is not a W&B run file")
    if data[:len(HEADER)] != HEADER:
        raise ValueError(f"{path} is a W&B run file of another layout (header {data[:len(HEADER)]!r}; this reader "
                         f"reads {HEADER!r}, as wandb {', '.join(CHECKED['wandb'])} writes it)")
    return [pb.Record.FromString(r) for r in _record_bytes(data)]


def shape_problems() -> list[str]:
    """What in the installed wandb differs from what this reader relies on (``RECORD_FIELDS``): one line per
    field, naming wandb's version. Empty when it matches."""
    import wandb
    from wandb.proto import wandb_internal_pb2 as pb

    where = f"wandb {wandb.__version__} (this reader was checked against {', '.join(CHECKED['wandb'])})"
    record = pb.Record.DESCRIPTOR
    oneof = record.oneofs_by_name.get("record_type")
    if oneof is None:
        return [f"{where}: wandb_internal_pb2.Record has no oneof 'record_type'"]
    problems = []
    kinds = {f.name: f for f in oneof.fields}
    for kind, paths in RECORD_FIELDS.items():
        if kind not in kinds:
            problems.append(f"{where}: Record.record_type has no '{kind}'")
            continue
        for dotted in paths:
            message = kinds[kind].message_type
            for part in dotted.split("."):
                field = None if message is None else message.fields_by_name.get(part)
                if field is None:
                    problems.append(f"{where}: Record.{kind}.{dotted} is gone ('{part}' missing)")
                    break
                message = field.message_type
    return problems
