"""Cheap fingerprints of files, checkpoints and corpora for cache keys (no model loading, no full reads)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fusebench.data.corpus import Corpus


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


def hf_hub_revision(repo_id: str, revision: str | None) -> str | None:
    """The commit of ``repo_id`` in the local Hugging Face cache, without touching the network."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
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


def texts_fingerprint(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()
