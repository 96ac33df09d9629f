"""Cheap fingerprints of files, checkpoints and corpora for cache keys (no model loading, no full reads)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fusebench.data.corpus import Corpus
from fusebench.data.tar_shards import split_ref


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, for one-line error reports."""
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__).rstrip(".") + "."


def path_fingerprint(path: Path) -> list:
    """(relative name, size, mtime_ns) of a file, or of every file under a folder, sorted."""
    path = Path(path)
    if path.is_file():
        stat = path.stat()
        return [[path.name, stat.st_size, stat.st_mtime_ns]]
    if not path.is_dir():
        return [[str(path), None, None]]
    out = []
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        out.append([str(file.relative_to(path)), stat.st_size, stat.st_mtime_ns])
    return out


def hf_hub_revision(repo_id: str, revision: str | None, filename: str = "config.json") -> str | None:
    """The commit of ``repo_id`` in the local Hugging Face cache (found by one ``filename`` every snapshot of the
    repo holds), without touching the network."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except Exception:  # noqa: BLE001 - a missing or odd cache just means 'unknown'
        return None
    if isinstance(found, str):
        parts = Path(found).parts
        if "snapshots" in parts:
            return parts[parts.index("snapshots") + 1]
    return None


def images_fingerprint(corpus: Corpus) -> str:
    """SHA-256 over image ids and each file's path, size and mtime (missing files included as such)."""
    digest = hashlib.sha256()
    paths = corpus.image_paths or [None] * corpus.n_images
    for image_id, path in zip(corpus.image_ids, paths):
        try:
            stat = os.stat(path) if path else None
            entry = f"{image_id}\t{path}\t{stat.st_size if stat else ''}\t{stat.st_mtime_ns if stat else ''}\n"
        except OSError:
            entry = f"{image_id}\t{path}\tmissing\n"
        digest.update(entry.encode("utf-8"))
    return digest.hexdigest()


def _stamp(path: str) -> str:
    """A file's size and mtime (ns) as text, or 'missing'."""
    try:
        stat = os.stat(path)
    except OSError:
        return "missing"
    return f"{stat.st_size}\t{stat.st_mtime_ns}"


def refs_fingerprint(refs: list) -> str:
    """SHA-256 over each distractor ref's file size and mtime (a ``TAR::MEMBER`` ref: its tar's, stat once per
    tar), in order: a file (or tar) replaced under the same name gives another digest, so a shard's key changes
    and it is embedded again. One stat per image file: about 1 s per million files on a local disk."""

    digest, tars = hashlib.sha256(), {}
    for ref in refs:
        text = str(ref)
        member = split_ref(text)
        if member is None:
            stamp = _stamp(text)
        else:
            if member[0] not in tars:
                tars[member[0]] = _stamp(member[0])
            stamp = tars[member[0]]
        digest.update(f"{stamp}\n".encode())
    return digest.hexdigest()


def texts_fingerprint(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()
