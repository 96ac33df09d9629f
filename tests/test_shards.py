"""Gallery shards (issue 22 item 2): a real model's distractors embedded one shard per cache entry and read back as
one gallery, range by range; the shard summary of an embed sweep. Tiny random-weight open_clip models, small PNGs,
in this process (tests/e2e/test_embed_shards.py drives fusebench-embed's launchers in separate processes)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_models import build_hf, build_open_clip
from PIL import Image

import fusebench.encoders.shards as shards_module
from fusebench import FusebenchError
from fusebench.app.embed_cli import _job_records, spans, sweep_summary
from fusebench.config.gallery import GalleryConfig
from fusebench.config.schema import EmbedConfig
from fusebench.config.specs import model_spec
from fusebench.data.corpus import Corpus
from fusebench.data.distractor_sources import distractor_items
from fusebench.encoders.distractors import FirstRows, normalised
from fusebench.encoders.images import BadImageError
from fusebench.encoders.real import embed_real, real_run
from fusebench.encoders.shards import (
    FAULT_ENV,
    ShardPlan,
    ShardRows,
    cache_progress,
    check_shard,
    embed_shard,
    shard_rows,
    without_failed,
)

BROKEN = b"\x89PNG\r\n\x1a\n this is not a png"


def write_gallery(folder: Path, n: int = 40, broken: tuple[int, ...] = ()) -> Path:
    """``n`` small random PNGs of varying size (``broken``: files that are not images)."""
    rng = np.random.default_rng(3)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        path = folder / f"img_{i:03d}.png"
        if i in broken:
            path.write_bytes(BROKEN)
        else:
            shape = (int(rng.integers(16, 40)), int(rng.integers(16, 40)), 3)
            Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(path)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    specs = {name: {"kind": "open_clip", "model": f"local-dir:{build_open_clip(root / name, seed)}"}
             for name, seed in (("oc", 0), ("oc2", 1))}
    specs["clip"] = {"kind": "hf", "checkpoint": str(build_hf(root / "clip", "clip"))}
    return {name: model_spec(name, spec, []) for name, spec in specs.items()}


def runtime(cache: Path, **changes) -> EmbedConfig:
    return EmbedConfig.with_defaults(str(cache), batch_size=1, num_workers=0, chunk_rows=2, **changes)


def plan_of(folder: Path, size: int = 40, shard_size: int = 5) -> ShardPlan:
    gallery = GalleryConfig(kind="folder", source=str(folder), size=size, shard_size=shard_size)
    return ShardPlan(distractor_items(gallery, ["test0"]), shard_size)


def unsharded(spec, plan: ShardPlan, cache: Path, **changes) -> np.ndarray:
    """The slow obvious reference: the same images embedded in one piece, as a corpus's images (one process,
    the normal cache entry), then normalised as the gallery normalises its rows."""
    items = plan.items
    corpus = Corpus("gallery", list(items.ids), ["a photo"] * len(items), np.arange(len(items)), list(items.refs))
    raw = embed_real(spec, corpus, runtime(cache, **changes))
    return normalised(raw.image)


def test_shard_bounds_and_an_index_past_the_last_names_both_numbers(tmp_path):
    plan = plan_of(write_gallery(tmp_path / "g", 12), size=12, shard_size=5)
    assert plan.n_shards == 3 and [plan.bounds(i) for i in range(3)] == [(0, 5), (5, 10), (10, 12)]
    assert plan.part(2).ids == plan.items.ids[10:12]
    with pytest.raises(FusebenchError, match=r"gallery.shard=3 but gallery.size=12 .* makes 3 shard\(s\) \(valid: 0 to 2\)"):
        check_shard(GalleryConfig(kind="folder", source="x", size=12, shard_size=5, shard=3))
    check_shard(GalleryConfig(kind="folder", source="x", size=12, shard_size=5, shard=2))
    assert spans([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and spans([4]) == "4"


@pytest.mark.slow  # runs tiny real models
@pytest.mark.parametrize("name,dim", [("oc", 32), ("clip", 24)])  # open_clip and hf backends
def test_shard_rows_equal_a_one_piece_embedding_bit_for_bit(models, tmp_path, monkeypatch, name, dim):
    plan = plan_of(write_gallery(tmp_path / "g"))
    run = real_run(models[name], runtime(tmp_path / "cache"))
    rows = shard_rows(run, plan)  # no shard in the cache: each is embedded here, as an evaluation does
    assert isinstance(rows, ShardRows) and (rows.n, rows.dim) == (40, dim) and len(rows.keys) == 8
    expected = unsharded(models[name], plan, tmp_path / "reference")
    whole = rows.read(0, 40)
    assert whole.dtype == np.float32 and whole.flags.c_contiguous and whole.tobytes() == expected.tobytes()
    for start, stop in ((0, 3), (3, 12), (9, 10), (4, 36), (38, 45)):  # within, across and past shard ends
        assert rows.read(start, stop).tobytes() == expected[start:stop].tobytes()
    assert FirstRows(rows, 12).read(0, 50).tobytes() == expected[:12].tobytes()
    assert rows.key == {"kind": "shards", "keys": rows.keys, "n": 40}
    opened = []
    load = np.load
    monkeypatch.setattr(shards_module.np, "load", lambda path, **kw: opened.append(Path(path)) or load(path, **kw))
    rows.read(11, 14)  # rows of shard 2 only: one shard file opened, memory-mapped
    assert opened == [rows.paths[2]]
    # a second reading process finds every shard complete: nothing is embedded, nothing loaded
    again = real_run(models[name], runtime(tmp_path / "cache"))
    assert shard_rows(again, plan).read(0, 40).tobytes() == expected.tobytes() and not again.lazy.loaded
    assert cache_progress(again, plan)[0] == list(range(8))


@pytest.mark.slow
def test_a_killed_shard_resumes_from_its_chunks(models, tmp_path, monkeypatch):
    plan = plan_of(write_gallery(tmp_path / "g", 10), size=10)
    run = real_run(models["oc"], runtime(tmp_path / "cache"))
    original = shards_module.embed_images

    def dies_after_four(run, paths, rows, desc, digests=None):
        for i, item in enumerate(original(run, paths, rows, desc, digests)):
            if i == 4:
                raise KeyboardInterrupt("killed")
            yield item

    monkeypatch.setattr(shards_module, "embed_images", dies_after_four)
    with pytest.raises(KeyboardInterrupt):
        embed_shard(run, plan, 1)
    monkeypatch.setattr(shards_module, "embed_images", original)
    result, _ = embed_shard(run, plan, 1)
    assert (result.hit, result.computed, result.images) == (False, 1, 5)  # chunks of rows 0-1 and 2-3 were kept
    expected = unsharded(models["oc"], plan, tmp_path / "reference")
    rows = shard_rows(run, plan)
    assert rows.read(5, 10).tobytes() == expected[5:10].tobytes()
    assert FAULT_ENV == "FUSEBENCH_FAULT_KILL_SHARD"
    import hashlib  # the content record spans the chunks the killed job saved and those the resumed one made

    record = json.loads((rows.paths[1].parent / "contents.json").read_text())
    assert record == [[ref, hashlib.sha256(Path(ref).read_bytes()).hexdigest()] for ref in plan.part(1).refs]


@pytest.mark.slow
def test_a_shard_of_another_model_is_refused_by_its_key(models, tmp_path):
    plan = plan_of(write_gallery(tmp_path / "g", 10), size=10)
    cache = tmp_path / "cache"
    first = shard_rows(real_run(models["oc"], runtime(cache)), plan)
    other = real_run(models["oc2"], runtime(cache))
    keys = [embed_shard(other, plan, i)[1].key for i in range(2)]
    assert not set(keys) & set(first.keys)  # another model's shards have other keys: never found for this one
    # a shard dir of model oc put where oc2's shard 0 lives: its meta.json is another entry's, so it is refused
    target = other.cache.entry_dir(keys[0])
    shutil.rmtree(target)
    shutil.copytree(Path(first.paths[0]).parent, target)
    rows = shard_rows(other, plan)
    expected = unsharded(models["oc2"], plan, tmp_path / "reference")
    assert rows.read(0, 10).tobytes() == expected.tobytes()
    assert rows.read(0, 5).tobytes() != first.read(0, 5).tobytes()
    assert json.loads((target / "meta.json").read_text())["key"] == keys[0]


@pytest.mark.slow
def test_two_launches_of_one_shard_compute_it_once(models, tmp_path, monkeypatch):
    plan = plan_of(write_gallery(tmp_path / "g", 10), size=10)
    original = shards_module.embed_images

    def slow(*args):
        for item in original(*args):
            time.sleep(0.2)  # long enough for the second launch to reach the entry's lock meanwhile
            yield item

    monkeypatch.setattr(shards_module, "embed_images", slow)
    results = []

    def launch():
        results.append(embed_shard(real_run(models["oc"], runtime(tmp_path / "cache")), plan, 1)[0])

    threads = [threading.Thread(target=launch) for _ in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    for thread in threads:
        thread.join()
    assert sorted((r.hit, r.computed) for r in results) == [(False, 5), (True, 0)]
    assert results[0].key == results[1].key


@pytest.mark.slow
def test_bad_images_are_skipped_by_file_or_fail_naming_it(models, tmp_path):
    folder = write_gallery(tmp_path / "g", 10, broken=(3,))
    plan = plan_of(folder, size=10)
    broken = str(folder / "img_003.png")
    position = plan.items.refs.index(broken)
    with pytest.raises(BadImageError, match=f"gallery shard {position // 5}: .*{broken}"):
        shard_rows(real_run(models["oc"], runtime(tmp_path / "cache")), plan)
    run = real_run(models["oc"], runtime(tmp_path / "cache", on_bad_image="skip"))
    result, _ = embed_shard(run, plan, position // 5)
    assert [f["ref"] for f in result.failed_images] == [broken] and result.failed_images[0]["row"] == position % 5
    rows = shard_rows(run, plan)
    assert rows.failed.tolist() == [position] and rows.failed_refs == [broken]
    assert np.isnan(rows.read(position, position + 1)).all()
    kept_rows, kept, dropped = without_failed({"oc": rows}, plan.items)
    assert dropped == [broken] and len(kept) == 9 and broken not in kept.refs
    good = [i for i in range(10) if i != position]
    expected = unsharded(models["oc"], plan, tmp_path / "reference", on_bad_image="skip")[good]
    assert kept_rows["oc"].n == 9 and kept_rows["oc"].read(0, 9).tobytes() == expected.tobytes()
    # fail after a skip run filled the cache: the cached shard raises as a fresh computation would
    with pytest.raises(BadImageError, match=f"distractor {position} \\({broken}\\) cannot be read"):
        shard_rows(real_run(models["oc"], runtime(tmp_path / "cache")), plan)
    # the file reads now: its shard is embedded again, and nothing is left out
    Image.new("RGB", (20, 20), (10, 200, 30)).save(broken)
    again = shard_rows(real_run(models["oc"], runtime(tmp_path / "cache")), plan)
    assert again.failed.size == 0 and not np.isnan(again.read(0, 10)).any()
    assert without_failed({"oc": again}, plan.items)[2] == []


# ---------------------------------------------------------------- the summary of an embed sweep (no model runs)

def _job(folder: Path, name: str, shard: int, record: dict | None, error: str | None = None) -> None:
    job = folder / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(f"- gallery=folder\n- gallery.shard={shard}\n")
    if record is not None:
        (job / "shard.json").write_text(json.dumps(record))
    if error:
        (job / "error.txt").write_text(f"fusebench: error: {error}\n")


def _result(shard: int, computed: int = 5, failed: tuple[str, ...] = ()) -> dict:
    return {"shard": shard, "model": "oc", "key": f"{shard:064x}", "images": 5, "computed": computed, "hit": not computed,
            "failed_images": [{"row": 1, "id": ref, "ref": ref} for ref in failed], "seconds": 1.0, "device": "cpu",
            "images_per_s": 5.0}


def test_sweep_summary_names_failed_and_killed_jobs_and_bad_files(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    done = {"status": "done", "shards": [_result(0, failed=("/data/bad.png",))], "n_shards": 4,
            "cache": {"oc": {"done": [0], "total": 4}}, "task": [0, 1]}
    _job(sweep, "0", 0, done)
    _job(sweep, "1", 1, {**done, "shards": [_result(1, computed=0)], "cache": {"oc": {"done": [0, 1], "total": 4}}})
    _job(sweep, "2", 2, {"status": "running", "shards": [], "cache": {}, "task": [0, 1]})  # SIGKILLed
    _job(sweep, "3", 3, {"status": "failed", "shards": [], "cache": {}, "task": [0, 1],
                         "error": "gallery shard 3: image 2 (/data/x.png) cannot be read"})
    _job(sweep, "4", 3, None)  # killed before it wrote anything
    (sweep / "5" / ".hydra").mkdir(parents=True)
    (sweep / "5" / "shard.json").write_text('{"status": "done", "shards": [{"shard": "x"}]}')  # damaged
    failed = sweep_summary(sweep)
    out = capsys.readouterr().out
    assert failed == ["2", "3", "4", "5"]
    assert "6 job(s)" in out and "2 done, 4 failed" in out
    assert "oc: 2 shard(s) done by this sweep, 5 images embedded; 2 of 4 shards in the cache, not yet: 2-3" in out
    assert "job 2 (gallery.shard=2): no result: the job was killed" in out
    assert "job 3 (gallery.shard=3): failed: gallery shard 3: image 2 (/data/x.png) cannot be read" in out
    assert "job 4 (gallery.shard=3): no result" in out and "job 5: failed: shard.json is not a record" in out
    assert "1 image(s) failed to decode" in out and "oc shard 0: /data/bad.png" in out
    assert (sweep / "shards.md").read_text().strip() == out.strip()
    data = json.loads((sweep / "shards.json").read_text())
    assert data["failed"] == failed and data["models"]["oc"]["in_cache"] == [0, 1]
    assert [name for name, _, _ in _job_records(sweep)] == ["0", "1", "2", "3", "4", "5"]


@pytest.mark.slow
def test_shards_of_another_precision_are_named_not_embedded_again(models, tmp_path):
    plan = plan_of(write_gallery(tmp_path / "g", 10), size=10)
    bf16 = shard_rows(real_run(models["oc"], runtime(tmp_path / "cache", precision="bf16")), plan)  # as on a GPU node
    auto = real_run(models["oc"], runtime(tmp_path / "cache"))  # auto: fp32 on this CPU
    with pytest.raises(FusebenchError, match="gallery shard 0 is in the cache embedded with embed.precision=bf16, but "
                                             "embed.precision=auto is fp32 on cpu"):
        shard_rows(auto, plan)
    with pytest.raises(FusebenchError, match="gallery shard 1 is in the cache embedded with embed.precision=bf16"):
        embed_shard(auto, plan, 1)  # a fusebench-embed job on a machine of another kind
    assert not auto.lazy.loaded
    fp32 = shard_rows(real_run(models["oc"], runtime(tmp_path / "cache", precision="fp32")), plan)  # asked: embedded
    assert not set(fp32.keys) & set(bf16.keys) and fp32.read(0, 10).tobytes() != bf16.read(0, 10).tobytes()


@pytest.mark.slow  # runs tiny real models
def test_an_image_replaced_in_place_is_embedded_again_never_read_stale(models, tmp_path):
    """Issue 29: a gallery file replaced under its name (other pixels, size and mtime) gives its shard another key;
    the rows read are a fresh embedding's, never the old file's. A file only touched is re-embedded too (same rows)."""
    import os

    folder = write_gallery(tmp_path / "g", 10)
    cache = tmp_path / "cache"
    run = real_run(models["oc"], runtime(cache))
    before = shard_rows(run, plan_of(folder, size=10)).read(0, 10)
    rng = np.random.default_rng(11)
    Image.fromarray(rng.integers(0, 255, (33, 21, 3), dtype=np.uint8)).save(folder / "img_007.png")
    plan = plan_of(folder, size=10)
    position = plan.items.ids.index(next(i for i in plan.items.ids if "img_007" in i))
    after = shard_rows(run, plan).read(0, 10)
    fresh = unsharded(models["oc"], plan, tmp_path / "reference")
    assert after.tobytes() == fresh.tobytes()
    assert not np.array_equal(after[position], before[position])
    stat = os.stat(folder / "img_003.png")  # touched only: another key, the same rows
    os.utime(folder / "img_003.png", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = shard_rows(run, plan_of(folder, size=10))
    assert again.read(0, 10).tobytes() == fresh.tobytes()


@pytest.mark.slow  # runs tiny real models
def test_a_tar_rewritten_in_place_is_embedded_again(models, tmp_path):
    import io
    import tarfile

    def write_tar(path: Path, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with tarfile.open(path, "w") as tar:
            for i in range(6):
                buffer = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(buffer, format="PNG")
                info = tarfile.TarInfo(f"{i:06d}.png")
                info.size = len(buffer.getvalue())
                tar.addfile(info, io.BytesIO(buffer.getvalue()))

    shard = tmp_path / "web" / "00000.tar"
    shard.parent.mkdir()
    write_tar(shard, 0)
    gallery = GalleryConfig(kind="webdataset", source=str(shard), size=6, shard_size=3)
    run = real_run(models["oc"], runtime(tmp_path / "cache"))
    first = shard_rows(run, ShardPlan(distractor_items(gallery, ["test0"]), 3)).read(0, 6)
    write_tar(shard, 1)  # other pixels under the same names
    plan = ShardPlan(distractor_items(gallery, ["test0"]), 3)
    rows = shard_rows(run, plan).read(0, 6)
    assert rows.tobytes() == unsharded(models["oc"], plan, tmp_path / "reference").tobytes()
    assert not np.array_equal(rows, first)


def write_same_size(path: Path, seed: int) -> None:
    """A 20x20 PNG stored without compression: every such file has the same size, whatever its pixels."""
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path, compress_level=0)


def verify_cli(cache: Path, *args: str) -> int:
    from fusebench.app.cache_cli import main as cache_main

    return cache_main(["--dir", str(cache), "verify", *args])


@pytest.mark.slow  # runs tiny real models
def test_an_image_replaced_with_the_same_size_and_mtime_is_found_by_verify_and_embedded_again(models, tmp_path,
                                                                                               capsys):
    """Issue 39 item 8: the key holds each file's size and mtime, so a file replaced with both kept reads stale on
    a rerun (what the docs say); ``fusebench-cache verify`` reads the images again against the SHA-256 recorded at
    embedding, names the file, and with --remove removes that shard only, which the next run embeds again."""
    import hashlib
    import os

    folder = write_gallery(tmp_path / "g", 10)
    target = folder / "img_007.png"
    write_same_size(target, 1)
    cache = tmp_path / "cache"
    plan = plan_of(folder, size=10)
    before = shard_rows(real_run(models["oc"], runtime(cache)), plan)
    old_rows = before.read(0, 10)
    index = plan.items.refs.index(str(target)) // 5
    # the record: each row's file and the SHA-256 of its bytes, computed the obvious way here
    record = json.loads((before.paths[index].parent / "contents.json").read_text())
    assert record == [[ref, hashlib.sha256(Path(ref).read_bytes()).hexdigest()] for ref in plan.part(index).refs]
    assert "contents" not in before.metas[index]["stats"]  # kept out of meta.json, which every run reads

    capsys.readouterr()
    assert verify_cli(cache) == 0  # nothing changed: both shards checked, nothing embedded again
    out = capsys.readouterr().out
    assert out.count(": unchanged") == 2 and "2 shard(s): 2 unchanged, 0 changed or damaged" in out

    stat = os.stat(target)
    write_same_size(target, 2)  # other pixels, the same size, and the old mtime put back
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(target).st_size == stat.st_size and os.stat(target).st_mtime_ns == stat.st_mtime_ns
    stale = real_run(models["oc"], runtime(cache))
    read = shard_rows(stale, plan_of(folder, size=10))  # as documented: the same key, the old rows
    assert read.keys == before.keys and read.read(0, 10).tobytes() == old_rows.tobytes() and not stale.lazy.loaded

    assert verify_cli(cache) == 1
    captured = capsys.readouterr()
    row = plan.part(index).refs.index(str(target))
    assert f"1 image(s) changed since embedded: row {row} {target} (content changed)" in captured.out
    assert before.keys[index][:12] in captured.out and "1 unchanged, 1 changed or damaged" in captured.out
    assert "verify --remove" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert verify_cli(cache, "--remove") == 0
    assert "removed" in capsys.readouterr().out

    run = real_run(models["oc"], runtime(cache))
    results = [embed_shard(run, plan, i)[0] for i in range(2)]
    assert [r.hit for r in results] == [i != index for i in range(2)]  # only the changed shard embedded again
    after = shard_rows(run, plan).read(0, 10)
    assert after.tobytes() == unsharded(models["oc"], plan, tmp_path / "reference").tobytes()
    position = plan.items.refs.index(str(target))
    assert not np.array_equal(after[position], old_rows[position])
    assert verify_cli(cache) == 0


@pytest.mark.slow  # runs tiny real models
def test_verify_names_bad_input_damaged_records_and_shards_without_one(models, tmp_path, capsys):
    folder = write_gallery(tmp_path / "g", 10)
    cache = tmp_path / "cache"
    rows = shard_rows(real_run(models["oc"], runtime(cache)), plan_of(folder, size=10))
    capsys.readouterr()
    assert verify_cli(cache, "ffffffff") == 2  # bad input: one line naming the prefix and what is valid
    err = capsys.readouterr().err
    assert "'ffffffff' matches no entry; verify checks finished gallery shards (kind shard" in err
    assert len(err.strip().splitlines()) == 1
    assert verify_cli(cache, "ab") == 2 and "at least 4 characters" in capsys.readouterr().err
    first, second = rows.paths[0].parent, rows.paths[1].parent
    (first / "contents.json").write_text("[]")  # damaged: another size and checksum than recorded
    meta = json.loads((second / "meta.json").read_text())
    del meta["contents"]  # as a shard embedded before the record existed
    (second / "meta.json").write_text(json.dumps(meta))
    assert verify_cli(cache, rows.keys[0][:8], rows.keys[1][:8]) == 1
    out = capsys.readouterr().out
    assert "damaged (contents.json has 2 bytes" in out and "no content record" in out
    assert verify_cli(cache, "--remove") == 1  # the damaged one removed; the one without a record cannot be checked
    out = capsys.readouterr().out
    assert "removed" in out and not first.exists() and second.exists()
