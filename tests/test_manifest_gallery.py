"""A manifest's caption-less lines searched as a gallery (gallery kind ``manifest``): ranks equal to the in-memory
search over every image, lists equal bit for bit to the same rows given as a clip-retrieval dump through
``gallery=vectors``, and bad rows refused in one line."""

import json

import numpy as np
import pytest

from fusebench import FusebenchError
from fusebench.app import gallery_stage
from fusebench.app.pipeline import run
from fusebench.app.run_config import run_config
from fusebench.data.distractor_items import seeded_order
from fusebench.data.manifest import load_manifest
from tests.helpers.corpora import write_manifest

pq = pytest.importorskip("pyarrow.parquet")
import pyarrow as pa  # noqa: E402 - after the skip: the gallery extra

MODELS = (("a", 24, 0.5), ("b", 20, 0.6))


def _write(folder, records, z, caption_image, rng):
    """The manifest and each model's image and text .npy (float32) for ``records`` with image latents ``z``."""
    manifest = write_manifest(folder / "M.jsonl", records)
    text_latent = z[caption_image] + 0.9 * rng.standard_normal((len(caption_image), z.shape[1]))
    files = {}
    for name, dim, noise in MODELS:
        proj = rng.standard_normal((z.shape[1], dim))
        image = ((z + noise * rng.standard_normal(z.shape)) @ proj).astype(np.float32)
        text = ((text_latent + noise * rng.standard_normal(text_latent.shape)) @ proj).astype(np.float32)
        np.save(folder / f"{name}_img.npy", image)
        np.save(folder / f"{name}_txt.npy", text)
        files[name] = (folder / f"{name}_img.npy", folder / f"{name}_txt.npy")
    return manifest, files


@pytest.fixture
def case(tmp_path):
    """30 images with captions and 50 caption-less ones, interleaved (some before the first captioned line);
    about a tenth of the caption-less ones close to some test image (hard distractors)."""
    rng = np.random.default_rng(11)
    n, latent = 80, 12
    captioned = np.sort(rng.choice(np.arange(3, n), 30, replace=False))
    records, caption_image = [], []
    z = rng.standard_normal((n, latent))
    for i in range(n):
        caps = (2 + i % 2) if i in captioned else 0
        records.append({"image_id": f"im{i:03d}", "captions": [f"c{j} of {i}" for j in range(caps)]})
        caption_image += [i] * caps
        if not caps and rng.random() < 0.1:
            z[i] = z[rng.choice(captioned)] + 0.3 * rng.standard_normal(latent)
    manifest, files = _write(tmp_path, records, z, np.array(caption_image), rng)
    return {"dir": tmp_path, "manifest": manifest, "files": files, "records": records, "captioned": captioned}


def _overrides(manifest, files, extra=()):
    out = ["dataset=manifest", f"dataset.manifest={manifest}", "models=[]", "fusion=dbsf", "eval.bootstrap.draws=50",
           "eval.save_topk=40", "plots=false", "eval.item_chunk_size=16", "eval.chunk_size=8"]
    for name, (image, text) in files.items():
        out += [f"+models.{name}.kind=vectors", f"+models.{name}.image_embeddings={image}",
                f"+models.{name}.text_embeddings={text}"]
    return out + list(extra)


def _outputs(out):
    """ranks, topk (ids mapped to image ids where gallery_items.jsonl says; scores as bits) and the retrievers."""
    metrics = json.loads((out / "metrics.json").read_text())
    items = out / "topk" / "gallery_items.jsonl"
    names = [json.loads(line) for line in items.read_text().splitlines()] if items.is_file() else None
    ranks, topk = {}, {}
    for path in sorted((out / "ranks").glob("*.npy")):
        ranks[path.stem] = np.load(path)
    for path in sorted((out / "topk").glob("*.npz")):
        with np.load(path) as z:
            ids, scores = z["ids"], z["scores"]
        topk[path.stem] = (ids, scores)
    return metrics, ranks, topk, names


def _reference_ranks(case):
    """t2i ranks the obvious way: each caption against every image of the manifest, 1 + the images scoring
    strictly above its own (no ties in these rows)."""
    corpus = load_manifest(case["manifest"])
    out = {}
    for name, (image, text) in case["files"].items():
        img, txt = np.load(image).astype(np.float64), np.load(text).astype(np.float64)
        img /= np.linalg.norm(img, axis=1, keepdims=True)
        txt /= np.linalg.norm(txt, axis=1, keepdims=True)
        scores = txt @ img.T
        own = scores[np.arange(len(txt)), corpus.caption_image]
        out[name] = 1 + (scores > own[:, None] + 1e-9).sum(axis=1)
    return out


@pytest.mark.slow
def test_manifest_distractors_rank_as_the_in_memory_search(compose_cfg, tmp_path, case, monkeypatch):
    config = run_config(compose_cfg(_overrides(case["manifest"], case["files"])))
    streamed = run(config, str(tmp_path / "streamed"))
    assert streamed.gallery.kind == "manifest" and streamed.gallery.distractors == 50
    monkeypatch.setattr(gallery_stage, "_in_memory_reason", lambda _config: "forced by the test")
    in_memory = run(config, str(tmp_path / "memory"))
    assert in_memory.gallery is None
    metrics_s, ranks_s, topk_s, names_s = _outputs(tmp_path / "streamed")
    metrics_m, ranks_m, topk_m, names_m = _outputs(tmp_path / "memory")
    assert names_m is None and sorted(names_s) == [r["image_id"] for r in case["records"]]
    assert names_s[:30] == [f"im{i:03d}" for i in case["captioned"]]  # test images first, in manifest order
    assert set(ranks_s) == set(ranks_m) and len(ranks_s) == 6
    for key in ranks_s:
        np.testing.assert_array_equal(ranks_s[key], ranks_m[key], err_msg=key)
    assert metrics_s["retrievers"] == metrics_m["retrievers"]
    assert metrics_s["comparisons"] == metrics_m["comparisons"]
    for name, ranks in _reference_ranks(case).items():
        np.testing.assert_array_equal(ranks_s[f"{name}.t2i"], ranks)
    ids_by_index = np.array([r["image_id"] for r in case["records"]])
    for key, (ids, scores) in topk_s.items():  # the same items by id, the same scores
        ids_m, scores_m = topk_m[key]
        if key.endswith(".t2i"):
            ids, ids_m = np.array(names_s)[ids], ids_by_index[ids_m]
        np.testing.assert_array_equal(ids, ids_m, err_msg=key)
        np.testing.assert_allclose(scores, scores_m, rtol=0, atol=1e-6, err_msg=key)


class _HeaderOnly:
    """A mapped image .npy whose rows may not be read through the mapping: its header (shape, dtype) only."""

    def __init__(self, mapped):
        self.shape, self.dtype, self.ndim = mapped.shape, mapped.dtype, mapped.ndim

    def __getitem__(self, _key):
        raise AssertionError("the image .npy was read through its memory map")

    def __array__(self, *_args, **_kwargs):
        raise AssertionError("the image .npy was read whole")


@pytest.mark.slow
def test_the_image_npy_is_read_a_tile_at_a_time_never_whole(compose_cfg, tmp_path, case, monkeypatch):
    """Memory stays bounded by the tiles at any manifest size: each image .npy is read only by row runs
    (``read_sorted_rows``, at most one tile's rows a call: the test split's 30 rows once, then tiles of
    ``eval.item_chunk_size`` = 16 of the caption-less lines), never by np.load nor through its mapping, and
    every row is read exactly once; the ranks are the obvious computation's."""
    from fusebench.encoders import vectors

    images = {str(image) for image, _ in case["files"].values()}
    reads: dict[str, list[int]] = {path: [] for path in images}
    real_read, real_load, real_npy = vectors.read_sorted_rows, np.load, vectors._load_npy

    def counted(npy, offset, dim, dtype, local):
        reads[str(npy)].append(len(local))
        return real_read(npy, offset, dim, dtype, local)

    def guarded_load(path, *args, **kwargs):
        assert str(path) not in images or kwargs.get("mmap_mode") == "r", f"np.load read {path} whole"
        return real_load(path, *args, **kwargs)

    def header_only(path_value, key, name):
        array, source = real_npy(path_value, key, name)
        return (_HeaderOnly(array) if key == "image_embeddings" else array), source

    monkeypatch.setattr(vectors, "read_sorted_rows", counted)
    monkeypatch.setattr(vectors, "_load_npy", header_only)
    monkeypatch.setattr(np, "load", guarded_load)
    fresh = [f"embed.cache.dir={tmp_path / 'cache'}"]  # an empty store: the lists are computed, the rows read
    record = run(compose_cfg(_overrides(case["manifest"], case["files"], fresh)), str(tmp_path / "out"))
    monkeypatch.undo()
    assert record.gallery.kind == "manifest" and record.gallery.distractors == 50
    for path, sizes in reads.items():
        assert sizes[0] == 30 and max(sizes[1:]) <= 16, (path, sizes)  # the test split, then tile by tile
        assert sum(sizes) == 80, (path, sizes)  # every row once: the 30 test rows and the 50 caption-less ones
    _, ranks, _, _ = _outputs(tmp_path / "out")
    for name, expected in _reference_ranks(case).items():
        np.testing.assert_array_equal(ranks[f"{name}.t2i"], expected)


def _dump(folder, rows, ids, seed=0):
    """A one-shard clip-retrieval dump whose seeded order (gallery.seed) gives ``rows`` in their order."""
    order = seeded_order(len(rows), seed)
    shard, keys = np.empty_like(rows), np.empty(len(rows), dtype=object)
    shard[order], keys[order] = rows, ids
    (folder / "img_emb").mkdir(parents=True)
    (folder / "metadata").mkdir()
    np.save(folder / "img_emb" / "img_emb_0.npy", shard)
    pq.write_table(pa.table({"key": list(keys), "caption": [""] * len(keys)}), folder / "metadata" / "metadata_0.parquet")
    return folder


@pytest.mark.slow
def test_manifest_distractors_equal_the_same_rows_as_a_dump_bit_for_bit(compose_cfg, tmp_path, case):
    records, captioned = case["records"], case["captioned"]
    without = np.array([i for i in range(len(records)) if i not in set(captioned)])
    test_dir = tmp_path / "test_split"
    test_dir.mkdir()
    manifest = write_manifest(test_dir / "T.jsonl", [records[i] for i in captioned])
    files, dumps = {}, []
    for name, (image, text) in case["files"].items():
        rows = np.load(image)
        np.save(test_dir / f"{name}_img.npy", rows[captioned])
        files[name] = (test_dir / f"{name}_img.npy", text)
        dump = _dump(tmp_path / f"dump_{name}", rows[without], [records[i]["image_id"] for i in without])
        dumps.append(f"+gallery.vectors.{name}={dump}")
    run(compose_cfg(_overrides(case["manifest"], case["files"])), str(tmp_path / "manifest"))
    run(compose_cfg(_overrides(manifest, files, ["gallery=vectors", f"gallery.size={len(without)}",
                                                 "gallery.near_duplicate=null", *dumps])), str(tmp_path / "dump"))
    metrics_m, ranks_m, topk_m, names_m = _outputs(tmp_path / "manifest")
    metrics_d, ranks_d, topk_d, names_d = _outputs(tmp_path / "dump")
    assert names_m == names_d
    assert ranks_m.keys() == ranks_d.keys() and topk_m.keys() == topk_d.keys()
    for key in ranks_m:
        np.testing.assert_array_equal(ranks_m[key], ranks_d[key], err_msg=key)
    for key, (ids, scores) in topk_m.items():
        np.testing.assert_array_equal(ids, topk_d[key][0], err_msg=key)
        np.testing.assert_array_equal(scores.view(np.uint32), topk_d[key][1].view(np.uint32), err_msg=key)
    for name, result in metrics_m["retrievers"].items():  # (each model's spec names its own image .npy)
        assert {d: result[d] for d in ("t2i", "i2t")} == {d: metrics_d["retrievers"][name][d] for d in ("t2i", "i2t")}
    assert metrics_m["comparisons"] == metrics_d["comparisons"]
    assert metrics_m["gallery"]["distractors"] == metrics_d["gallery"]["distractors"] == len(without)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_manifest_without_caption_less_lines_is_searched_as_before(compose_cfg, case):
    records = [r for r in case["records"] if r["captions"]]
    manifest = write_manifest(case["dir"] / "only.jsonl", records)
    config = run_config(compose_cfg(_overrides(manifest, case["files"])))
    assert gallery_stage.manifest_split(config, load_manifest(manifest)) is None
    config = run_config(compose_cfg(_overrides(case["manifest"], case["files"])))
    split = gallery_stage.manifest_split(config, load_manifest(case["manifest"]))
    assert split.test.n_images == 30 and len(split.ids) == 50 and split.n_images == 80
    np.testing.assert_array_equal(split.test_rows, case["captioned"])


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("extra", [["tune=weights"], ["fusion.top_k=null"]])
def test_runs_the_streamed_path_cannot_serve_keep_the_in_memory_search(compose_cfg, case, extra):
    config = run_config(compose_cfg(_overrides(case["manifest"], case["files"], extra)))
    assert gallery_stage._in_memory_reason(config) is not None
    assert gallery_stage.manifest_split(config, load_manifest(case["manifest"])) is None


@pytest.mark.slow
@pytest.mark.parametrize("search,module", [(["search=faiss_flat"], "faiss"),
                                           (["search=lancedb", "fusion=lancedb_rrf"], "lancedb")])
def test_an_index_or_engine_searches_the_caption_less_lines_streamed(compose_cfg, tmp_path, case, search, module):
    """FAISS's gallery index and an engine take the caption-less lines as a streamed gallery too: a flat one's
    lists are the exact search's (neighbour recall 1), so each model's recall equals the exact run's."""
    pytest.importorskip(module)
    config = run_config(compose_cfg(_overrides(case["manifest"], case["files"], search)))
    split = gallery_stage.manifest_split(config, load_manifest(case["manifest"]))
    assert split is not None and len(split.ids) == 50
    out = {}
    for name, extra in (("exact", ["fusion=rrf"]), ("index", search)):
        run(compose_cfg(_overrides(case["manifest"], case["files"], ["fusion.top_k=40", "eval.lists.depth=40",
                                                                     *extra])),
            str(tmp_path / name))
        out[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    for model in ("a", "b"):
        assert out["index"]["search"]["models"][model]["t2i"]["neighbour_recall"] == pytest.approx(1.0)
        for direction in ("t2i", "i2t"):  # FAISS's i2t over a gallery is the exact path's
            assert out["index"]["retrievers"][model][direction]["R@1"] == out["exact"]["retrievers"][model][direction]["R@1"]
    assert (tmp_path / "index" / "topk" / "gallery_items.jsonl").is_file()  # the streamed path's item ids


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_max_memory_gb_reads_a_manifests_streamed_gallery_and_nothing_else(compose_cfg, tmp_path, case):
    """search.max_memory_gb is checked once the manifest is read: accepted where its caption-less lines stream as a
    gallery (FAISS's gallery index reads it), one line where every image is searched in memory."""
    pytest.importorskip("faiss")
    extra = ["search=faiss_ivf_flat", "search.nlist=4", "search.nprobe=4", "search.max_memory_gb=1"]
    config = run_config(compose_cfg(_overrides(case["manifest"], case["files"], extra)))
    assert gallery_stage.manifest_split(config, load_manifest(case["manifest"])) is not None
    only = write_manifest(case["dir"] / "only.jsonl", [r for r in case["records"] if r["captions"]])
    with pytest.raises(FusebenchError, match=r"search=faiss reads search.max_memory_gb only over a gallery.*"
                                             r"manifest's images are all searched in memory") as err:
        run(compose_cfg(_overrides(only, case["files"], extra)), str(tmp_path / "out"))
    assert "\n" not in str(err.value) and not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("where", ["test", "distractor"])
def test_a_bad_row_is_one_line_naming_its_row_of_the_npy(compose_cfg, tmp_path, case, where):
    image, text = case["files"]["a"]
    rows = np.load(image)
    row = int(case["captioned"][4]) if where == "test" else next(
        i for i in range(40, 80) if i not in set(case["captioned"]))
    rows[row] = np.nan
    np.save(tmp_path / "bad.npy", rows)
    files = {**case["files"], "a": (tmp_path / "bad.npy", text)}
    with pytest.raises(FusebenchError, match=rf"bad\.npy: image embeddings row {row} contains NaN") as err:
        run(compose_cfg(_overrides(case["manifest"], files)), str(tmp_path / "out"))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_an_npy_with_the_wrong_row_count_is_one_line(compose_cfg, tmp_path, case):
    image, text = case["files"]["a"]
    np.save(tmp_path / "short.npy", np.load(image)[:-1])
    files = {**case["files"], "a": (tmp_path / "short.npy", text)}
    with pytest.raises(FusebenchError, match=r"short\.npy: image embeddings has 79 rows but the corpus has 80 images"):
        run(compose_cfg(_overrides(case["manifest"], files)), str(tmp_path / "out"))


@pytest.mark.slow
def test_a_tie_with_an_earlier_caption_less_copy_now_ranks_the_test_image_first(compose_cfg, tmp_path, case,
                                                                              monkeypatch):
    """The one documented difference: a caption-less line holding a copy of a test image's row, before it in the
    manifest, tied it and ranked first in memory; in the gallery every distractor comes after the test images."""
    records, captioned = case["records"], case["captioned"]
    target = int(captioned[0])
    copy = next(i for i in range(target) if not records[i]["captions"])
    image, text = case["files"]["a"]
    rows = np.load(image)
    rows[copy] = rows[target]
    np.save(tmp_path / "tied.npy", rows)
    files = {"a": (tmp_path / "tied.npy", text)}
    overrides = [o if o != "fusion=dbsf" else "fusion=none" for o in _overrides(case["manifest"], files)]
    config = run_config(compose_cfg(overrides))
    run(config, str(tmp_path / "streamed"))
    monkeypatch.setattr(gallery_stage, "_in_memory_reason", lambda _config: "forced by the test")
    run(config, str(tmp_path / "memory"))
    streamed, memory = (np.load(tmp_path / d / "ranks" / "a.t2i.npy") for d in ("streamed", "memory"))
    tied = load_manifest(case["manifest"]).caption_image == target
    np.testing.assert_array_equal(memory[tied], streamed[tied] + 1)
    np.testing.assert_array_equal(memory[~tied], streamed[~tied])


@pytest.mark.slow
def test_stored_lists_are_read_only_for_the_same_rows(compose_cfg, tmp_path, case, capsys):
    """The list store's key holds the distractor rows: a rerun reads its lists; one changed caption-less row in
    the image .npy (same shape, same name) is another key, computed afresh, and the table names the source."""
    image, text = case["files"]["a"]
    rows = np.load(image)
    np.save(tmp_path / "a.npy", rows)
    files = {"a": (tmp_path / "a.npy", text)}
    overrides = [o if o != "fusion=dbsf" else "fusion=none" for o in _overrides(case["manifest"], files)]
    config = run_config(compose_cfg([*overrides, f"embed.cache.dir={tmp_path / 'cache'}"]))
    first = run(config, str(tmp_path / "1"))
    assert "30 test images + 50 distractors (the manifest's caption-less lines, every one kept)" in capsys.readouterr().out
    again = run(config, str(tmp_path / "2"))
    assert first.run.lists["a"]["hit"] is False and again.run.lists["a"]["hit"] is True
    assert first.retrievers["a"].to_json() == again.retrievers["a"].to_json()
    listed = np.load(tmp_path / "1" / "topk" / "a.t2i.npz")["ids"][:, :5]
    without = [i for i, r in enumerate(case["records"]) if not r["captions"]]
    hard = without[int(np.bincount(listed[listed >= 30] - 30).argmax())]  # the distractor most often listed
    rows[hard] *= -1  # it now scores the opposite for every caption
    np.save(tmp_path / "a.npy", rows)
    changed = run(config, str(tmp_path / "3"))
    assert changed.run.lists["a"]["hit"] is False
    assert changed.run.lists["a"]["key"] != first.run.lists["a"]["key"]
    expected = _reference_ranks({**case, "files": files})["a"]
    np.testing.assert_array_equal(np.load(tmp_path / "3" / "ranks" / "a.t2i.npy"), expected)
    item = without.index(hard) + 30
    assert (np.load(tmp_path / "3" / "topk" / "a.t2i.npz")["ids"][:, :5] == item).sum() < (listed == item).sum()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("extra,key", [(["gallery.size=50"], "gallery.size=50"),
                                       (["gallery.near_duplicate=0.5"], "gallery.near_duplicate=0.5")])
def test_a_gallery_setting_a_manifest_run_does_not_read_is_refused_describing_that_run(compose_cfg, case, extra, key):
    """With gallery=none a manifest's caption-less lines are the run's gallery, every one kept: the refusal says
    so, and what is valid, never "the test split alone" (issue 39, item 8)."""
    with pytest.raises(FusebenchError) as err:
        run_config(compose_cfg(_overrides(case["manifest"], case["files"], extra)))
    message = str(err.value)
    assert message.startswith(key) and "dataset=manifest" in message and "gallery=none" in message
    assert "the manifest's lines without captions (its gallery)" in message and "test split alone" not in message
    assert "every one" in message and ("folder | webdataset | paths | vectors" in message
                                       or "read with every gallery.kind but none" in message)
    assert "\n" not in message
    with pytest.raises(FusebenchError, match="test split alone"):  # a run with no such lines: as before
        run_config(compose_cfg(["dataset=sim", *extra]))
