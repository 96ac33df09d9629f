"""scripts/prepare_data.py against a local HTTP server on 127.0.0.1 serving miniature archives."""

import hashlib
import importlib.util
import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.corpora import mini_coco, mini_flickr

from fusebench import FusebenchError
from fusebench.data.prepare import download, prepare

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "prepare_data.py"


def load_script():
    spec = importlib.util.spec_from_file_location("prepare_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Server:
    """Serves ``files`` with HTTP Range support; can drop the connection half way through a file once."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.drop_once, self.requests = files, set(), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = outer.files.get(self.path)
                outer.requests.append((self.path, self.headers.get("Range")))
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if self.path in outer.drop_once:
                    outer.drop_once.discard(self.path)
                    self.wfile.write(body[start:start + (len(body) - start) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(2)  # drop the connection mid-body
                    return
                self.wfile.write(body[start:])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def zip_folder(folder: Path, under: str = "") -> bytes:
    """A zip of the files below ``folder / under``, named relative to ``folder`` (val2014/x.jpg)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for path in sorted((folder / under).rglob("*")):
            if path.is_file():
                zf.write(path, str(path.relative_to(folder)))
    return buffer.getvalue()


@pytest.fixture
def archives(tmp_path):
    """caption_datasets.zip (Karpathy's two json files) and val2014.zip (val2014/*.jpg), built here."""
    build = tmp_path / "build"
    mini_coco(build / "coco")
    mini_flickr(build / "flickr")
    splits = build / "splits"
    splits.mkdir()
    (splits / "dataset_coco.json").write_bytes((build / "coco" / "dataset_coco.json").read_bytes())
    (splits / "dataset_flickr30k.json").write_bytes((build / "flickr" / "dataset_flickr30k.json").read_bytes())
    return {"caption_datasets.zip": zip_folder(splits), "val2014.zip": zip_folder(build / "coco", under="val2014"),
            "flickr_images": build / "flickr" / "flickr30k-images"}


def sources(server: Server, archives, sha: bool = True) -> dict:
    return {"karpathy_splits": {"url": server.url + "/caption_datasets.zip",
                                "sha256": hashlib.sha256(archives["caption_datasets.zip"]).hexdigest() if sha else None},
            "coco_val2014": {"url": server.url + "/val2014.zip",
                             "sha256": hashlib.sha256(archives["val2014.zip"]).hexdigest() if sha else None}}


def test_coco_downloads_resumes_verifies_and_prints_override(archives, tmp_path, capsys, monkeypatch):
    waits = []
    monkeypatch.setattr("fusebench.data.prepare.time.sleep", waits.append)  # the retry's backoff, not waited
    server = Server({"/caption_datasets.zip": archives["caption_datasets.zip"], "/val2014.zip": archives["val2014.zip"]})
    server.drop_once = {"/val2014.zip"}
    try:
        sources_file = tmp_path / "sources.json"
        sources_file.write_text(json.dumps(sources(server, archives)))
        root = tmp_path / "data"
        code = load_script().main(["coco5k", "--root", str(root), "--sources", str(sources_file), "--expected", "3,16"])
    finally:
        server.close()
    assert code == 0
    out = capsys.readouterr().out
    assert f"fusebench dataset=coco5k paths.data_root={root.resolve()}" in out
    assert (root / "coco" / "dataset_coco.json").is_file() and len(list((root / "coco" / "val2014").glob("*.jpg"))) == 6
    ranges = [r for p, r in server.requests if p == "/val2014.zip"]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"  # resumed, not restarted
    assert not list(root.rglob("*.part")) and not list(root.rglob(".extract-*"))
    assert waits == [1.0]  # one dropped connection: one retry after the first backoff


def test_corrupt_archive_rejected_by_checksum_and_by_crc(archives, tmp_path):
    broken = bytearray(archives["caption_datasets.zip"])
    broken[len(broken) // 3] ^= 0xFF
    server = Server({"/caption_datasets.zip": bytes(broken), "/val2014.zip": archives["val2014.zip"]})
    try:
        with pytest.raises(FusebenchError, match="checksum mismatch.*corrupt and was removed"):
            prepare("coco5k", tmp_path / "a", sources(server, archives), expected=(3, 16))
        assert not list((tmp_path / "a").rglob("caption_datasets.zip*"))
        with pytest.raises(FusebenchError, match="not a valid zip archive.*removed"):
            prepare("coco5k", tmp_path / "b", sources(server, archives, sha=False), expected=(3, 16))
        assert not list((tmp_path / "b").rglob("caption_datasets.zip*"))
        assert not (tmp_path / "b" / "coco" / "dataset_coco.json").exists()
    finally:
        server.close()


def test_flickr_explains_the_form_then_verifies_placed_images(archives, tmp_path):
    server = Server({"/caption_datasets.zip": archives["caption_datasets.zip"]})
    try:
        with pytest.raises(FusebenchError, match="owners.*shannon.cs.illinois.edu.*flickr30k-images"):
            prepare("flickr1k", tmp_path, sources(server, archives), expected=(2, 10))
        assert (tmp_path / "flickr30k" / "dataset_flickr30k.json").is_file()
        target = tmp_path / "flickr30k" / "flickr30k-images"
        target.mkdir()
        for path in archives["flickr_images"].glob("*.jpg"):
            (target / path.name).write_bytes(path.read_bytes())
        override = prepare("flickr1k", tmp_path, sources(server, archives), expected=(2, 10))
        assert "dataset=flickr1k" in override
        good = (target / "1000.jpg").read_bytes()
        (target / "1000.jpg").write_bytes(b"\xff\xd8\xff broken")
        with pytest.raises(FusebenchError, match="1 unreadable images"):
            prepare("flickr1k", tmp_path, download_files=False, expected=(2, 10))
        (target / "1000.jpg").write_bytes(good)
        with pytest.raises(FusebenchError, match="the standard flickr1k has 1000 and 5000"):
            prepare("flickr1k", tmp_path, download_files=False, verify=True)
    finally:
        server.close()


def test_download_gives_up_cleanly_and_keeps_partial_for_resume(tmp_path):
    server = Server({"/big": b"x" * 5000})
    server.drop_once = {"/big"}
    try:
        with pytest.raises(FusebenchError, match="HTTP 404"):
            download(server.url + "/missing", tmp_path / "missing", retries=0)
        path = download(server.url + "/big", tmp_path / "big", retries=2, backoff=0.0, block=512)
        assert path.read_bytes() == b"x" * 5000
    finally:
        server.close()
    with pytest.raises(FusebenchError, match="failed after 2 attempts"):
        download(server.url + "/big2", tmp_path / "big2", retries=1, backoff=0.0, timeout=2)


def test_not_enough_disk_space_fails_early(tmp_path, monkeypatch):
    import shutil as shutil_module

    from fusebench.data import prepare as prepare_module

    server = Server({"/big": b"x" * 5000})
    monkeypatch.setattr(prepare_module.shutil, "disk_usage", lambda p: shutil_module._ntuple_diskusage(10, 10, 100))
    try:
        with pytest.raises(FusebenchError, match="not enough disk space.*need"):
            download(server.url + "/big", tmp_path / "big", retries=0)
    finally:
        server.close()
    assert not (tmp_path / "big").exists()
