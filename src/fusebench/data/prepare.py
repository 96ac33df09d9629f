"""Get COCO 5k / Flickr30k 1k onto a machine: download what can be downloaded, verify what is there.

Downloads resume (HTTP Range) after a dropped connection, show a progress bar, check free disk space
before starting, and are checked (size, SHA-256 when known, zip CRCs) before they are renamed into place
or extracted; nothing half-written is left under its final name. Layout under ROOT:

    ROOT/coco/dataset_coco.json           ROOT/coco/val2014/*.jpg
    ROOT/flickr30k/dataset_flickr30k.json ROOT/flickr30k/flickr30k-images/*.jpg
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fusebench import FusebenchError
from fusebench.runtime.progress import bar as progress_bar
from fusebench.stores.files import file_sha256

log = logging.getLogger(__name__)

SOURCES = {
    # Karpathy's splits (dataset_coco.json, dataset_flickr30k.json, dataset_flickr8k.json), as he published them.
    "karpathy_splits": {"url": "https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip",
                        "sha256": None},
    # The official COCO 2014 validation images (the Karpathy test split is drawn from val2014).
    "coco_val2014": {"url": "http://images.cocodataset.org/zips/val2014.zip", "sha256": None},
}
FLICKR_HELP = (
    "Flickr30k images are distributed by their owners only after you accept their terms: request them with the "
    "form at https://shannon.cs.illinois.edu/DenotationGraph/ , then unpack the archive so that the .jpg files "
    "are in {folder} and run this command again to verify them.")


@dataclass(frozen=True)
class Benchmark:
    name: str
    folder: str
    annotations: str
    images: str  # the image root the dataset config uses, relative to ROOT
    expected: tuple[int, int]


BENCHMARKS = {
    "coco5k": Benchmark("coco5k", "coco", "dataset_coco.json", "coco", (5000, 25010)),
    "flickr1k": Benchmark("flickr1k", "flickr30k", "dataset_flickr30k.json", "flickr30k/flickr30k-images", (1000, 5000)),
}


def _check_space(folder: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise FusebenchError(f"not enough disk space in {folder} for {what}: need {needed / 1e9:.2f} GB, "
                             f"{free / 1e9:.2f} GB free. Free some space or choose another --root.")


def download(url: str, dest: Path, sha256: str | None = None, retries: int = 5, timeout: float = 60.0,
             block: int = 1 << 20, backoff: float = 1.0) -> Path:
    """Download ``url`` to ``dest`` via ``dest.part``, resuming after dropped connections."""
    dest = Path(dest)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    total = None
    for attempt in range(retries + 1):
        have = part.stat().st_size if part.is_file() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                if have and response.status != 206:  # the server ignored the range: start again
                    have = 0
                length = response.headers.get("Content-Length")
                total = have + int(length) if length is not None else None
                if total is not None:
                    _check_space(dest.parent, total - have, dest.name)
                with part.open("ab" if have else "wb") as fh, progress_bar(total=total, initial=have, unit="B",
                                                                  unit_scale=True, desc=dest.name, leave=False) as bar:
                    while chunk := response.read(block):
                        fh.write(chunk)
                        bar.update(len(chunk))
            if total is not None and part.stat().st_size < total:
                raise http.client.IncompleteRead(b"", total - part.stat().st_size)
            break
        except urllib.error.HTTPError as err:
            if err.code == 416 and have:  # nothing left to send: the part file is complete
                break
            raise FusebenchError(f"download of {url} failed: HTTP {err.code} {err.reason}.") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError) as err:
            if attempt == retries:
                raise FusebenchError(f"download of {url} failed after {retries + 1} attempts ({err}); the partial "
                                     f"file {part} is kept, so running again resumes it.") from None
            got = part.stat().st_size if part.is_file() else 0
            log.warning("connection to %s dropped at %d bytes (%s); resuming", url, got, err)
            time.sleep(backoff * min(2 ** attempt, 30))
    if total is not None and part.stat().st_size != total:
        size = part.stat().st_size
        part.unlink()
        raise FusebenchError(f"{url}: received {size} bytes, the server announced {total}; removed the partial file.")
    if sha256 is not None:
        found = file_sha256(part)
        if found != sha256:
            part.unlink()
            raise FusebenchError(f"{url}: checksum mismatch (sha256 {found}, expected {sha256}); the file is corrupt "
                                 "and was removed. Run again to download it afresh.")
    os.replace(part, dest)
    return dest


def extract(archive: Path, target: Path, members: list[str] | None = None, flatten: bool = False) -> None:
    """Test every member's CRC, then extract into a temp folder beside ``target`` and move into place."""
    try:
        with zipfile.ZipFile(archive) as zf:
            bad = zf.testzip()
            if bad is not None:
                raise zipfile.BadZipFile(f"CRC error in member {bad}")
            names = zf.namelist() if members is None else [n for n in zf.namelist() if Path(n).name in members]
            if members is not None and len(names) < len(members):
                raise FusebenchError(f"{archive} lacks {sorted(set(members) - {Path(n).name for n in names})}.")
            _check_space(target.parent if target.parent.exists() else Path("."),
                         sum(zf.getinfo(n).file_size for n in names), f"extracting {archive.name}")
            target.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=target))
            try:
                for name in progress_bar(names, desc=f"extract {archive.name}", unit="file", leave=False):
                    zf.extract(name, staging)
                for name in names:
                    source = staging / name
                    if source.is_dir():
                        continue
                    final = target / (Path(name).name if flatten else name)
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(source, final)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except zipfile.BadZipFile as err:
        archive.unlink(missing_ok=True)
        raise FusebenchError(f"{archive} is not a valid zip archive ({err}); it was removed. Run again to "
                             "download it afresh.") from None


def prepare(name: str, root: str | Path, sources: dict | None = None, download_files: bool = True,
            verify: bool = True, expected: tuple[int, int] | None = None) -> str:
    """Download (where possible), extract and verify one benchmark; return the override to use it."""
    if name not in BENCHMARKS:
        raise FusebenchError(f"unknown dataset {name!r}; valid: {', '.join(BENCHMARKS)}.")
    bench = BENCHMARKS[name]
    root = Path(root).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    sources = {**SOURCES, **(sources or {})}
    folder = root / bench.folder
    downloads = root / "downloads"
    if download_files and not (folder / bench.annotations).is_file():
        src = sources["karpathy_splits"]
        archive = download(src["url"], downloads / "caption_datasets.zip", src.get("sha256"))
        extract(archive, folder, members=[bench.annotations], flatten=True)
    if name == "coco5k" and download_files and not (folder / "val2014").is_dir():
        src = sources["coco_val2014"]
        extract(download(src["url"], downloads / "val2014.zip", src.get("sha256")), folder)
    image_root = root / bench.images
    if name == "flickr1k" and not image_root.is_dir():
        raise FusebenchError(FLICKR_HELP.format(folder=image_root))
    if verify:
        from fusebench.data.karpathy import load_karpathy  # lazy: heavy (PIL)

        images, captions = expected or bench.expected
        corpus = load_karpathy(folder / bench.annotations, image_root, name=name, verify="full",
                               expected={"images": images, "captions": captions})
        log.info("%s verified: %d images, %d captions, every image present and decodable", name, corpus.n_images,
                 corpus.n_captions)
    (root / f".{name}.prepared.json").write_text(json.dumps({"root": str(root), "verified": verify}))
    return f"fusebench dataset={name} paths.data_root={root}   (or: export FUSEBENCH_DATA={root})"
