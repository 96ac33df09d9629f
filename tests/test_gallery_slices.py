"""One gallery searched in slices (``gallery.slices``, one job per ``gallery.slice``), merged exactly (issue 42,
item 2): the merge equals a slow reference and the one-process pass bit for bit, ties included; sliced runs write
the one-process run's rank and topk files byte for byte, on the joblib launcher too; a missing or killed slice is
computed alone; a slice of another gallery, slice count or a damaged file is never merged; bad keys are one line."""

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.reference import stable_order

from fusebench import FusebenchError
from fusebench.app import gallery_stage
from fusebench.app.pipeline import run
from fusebench.app.run_config import run_config
from fusebench.encoders.distractors import ArrayRows
from fusebench.search.gallery_search import gallery_lists, gallery_pass, pass_tiles
from fusebench.search.model_lists import i2t_ranks
from fusebench.search.slices import merge_slices, part_from_pass, slice_tiles
from fusebench.stores.slice_lists import SliceStore

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))


# ---- the merge, against a slow reference ----------------------------------------------------------------------

def _quarter_rows(rng, n: int, d: int = 16) -> np.ndarray:
    """Unit rows of +-1/4 entries: every dot product is a multiple of 1/16, exact in fp32 in any order, so scores
    tie often and the reference's float64 scores are the same numbers."""
    return (rng.choice([-0.25, 0.25], size=(n, d))).astype(np.float32)


def _tie_case(seed: int = 0):
    """Test images, captions (2-3 per image) and distractors; some distractors are copies of test images (a tie
    with a caption's target) and of other distractors in other slices."""
    rng = np.random.default_rng(seed)
    n_test, n_dis = 37, 173
    image = _quarter_rows(rng, n_test)
    caption_image = np.sort(np.concatenate([np.arange(n_test), rng.integers(0, n_test, 40)]))
    text = image[caption_image] * 0.5 + _quarter_rows(rng, caption_image.size) * 0.5  # near their images
    distractors = _quarter_rows(rng, n_dis)
    distractors[150:160] = image[:10]  # copies of test images, late in the gallery
    distractors[100:130] = distractors[5:35]  # copies across the slices' bounds
    return text, image, caption_image, distractors


def _reference(text, image, caption_image, distractors, depth: int) -> dict:
    """Top-``depth`` lists and ranks by sorting the whole score matrix (float64: these scores are exact)."""
    gallery = np.vstack([image, distractors]).astype(np.float64)
    scores = text.astype(np.float64) @ gallery.T
    order = [stable_order(list(row)) for row in scores]
    t2i_ids = np.array([o[:depth] for o in order])
    query_images = np.unique(caption_image)
    columns = scores[:, query_images].T
    i2t_order = [stable_order(list(col)) for col in columns]
    return {"t2i_ids": t2i_ids, "t2i_scores": np.take_along_axis(scores, t2i_ids, 1),
            "t2i_ranks": np.array([o.index(int(c)) + 1 for o, c in zip(order, caption_image)]),
            "i2t_ids": np.array([o[:depth] for o in i2t_order]),
            "i2t_ranks": np.array([next(p for p, c in enumerate(o, 1) if caption_image[c] == q)
                                   for o, q in zip(i2t_order, query_images)])}


def _merged(text, image, caption_image, rows, depth, item_chunk, slices, chunk=16):
    n_items = image.shape[0] + rows.n
    tiles = pass_tiles(n_items, item_chunk)
    walks = slice_tiles(len(tiles), slices)
    passes = [gallery_pass(text, image, caption_image, rows, depth, "cpu", chunk, item_chunk, walk=w) for w in walks]
    parts = [part_from_pass(p, tiles[w.start][0], tiles[w.stop - 1][1]) for p, w in zip(passes, walks)]
    query_images = np.unique(caption_image)
    merged = merge_slices(iter(parts), depth, n_items, len(caption_image), query_images)
    import torch

    merged["i2t_ranks"] = i2t_ranks(merged["i2t_ids"], torch.from_numpy(text), torch.from_numpy(image),
                                    torch.from_numpy(query_images), torch.from_numpy(caption_image),
                                    min(chunk, len(caption_image)) * min(item_chunk, n_items))
    return merged


@pytest.mark.parametrize("slices,item_chunk,depth", [(3, 16, 12), (5, 8, 40), (1, 32, 7), (13, 16, 5)])
def test_the_merge_equals_sorting_the_whole_score_matrix(slices, item_chunk, depth):
    text, image, caption_image, distractors = _tie_case()
    rows = ArrayRows(distractors)
    merged = _merged(text, image, caption_image, rows, depth, item_chunk, slices)
    expected = _reference(text, image, caption_image, distractors, depth)
    assert np.array_equal(merged["t2i_ids"], expected["t2i_ids"])
    assert np.array_equal(merged["t2i_scores"], expected["t2i_scores"].astype(np.float32))
    assert np.array_equal(merged["t2i_ranks"], expected["t2i_ranks"])
    assert np.array_equal(merged["i2t_ids"], expected["i2t_ids"])
    assert np.array_equal(merged["i2t_ranks"], expected["i2t_ranks"])
    # the ties are there: copies of targets ahead of nothing (a target wins its ties), copies of listed items
    assert (np.diff(merged["t2i_scores"], axis=1) == 0).mean() > 0.3


@pytest.mark.parametrize("slices", [2, 3, 7])
def test_the_merge_equals_the_one_process_pass_bit_for_bit(slices):
    rng = np.random.default_rng(3)
    image = rng.standard_normal((50, 24)).astype(np.float32)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    caption_image = np.repeat(np.arange(50), 3)
    text = image[caption_image] + 0.7 * rng.standard_normal((150, 24)).astype(np.float32)
    distractors = rng.standard_normal((301, 24)).astype(np.float32)
    distractors[200:240] = distractors[10:50]  # exact copies: equal bits, ties across slices
    distractors[290:300] = image[:10]
    rows = ArrayRows(distractors)
    one = gallery_lists(text, image, caption_image, rows, 30, "cpu", 64, 32).arrays()
    merged = _merged(text, image, caption_image, rows, 30, 32, slices, chunk=64)
    for name in ("t2i_ids", "t2i_scores", "t2i_ranks", "i2t_ranks"):
        assert merged[name].dtype == one[name].dtype and np.array_equal(merged[name], one[name]), name
    assert np.array_equal(merged["i2t_ids"].astype(np.int32), one["i2t_ids"])
    assert np.array_equal(merged["i2t_scores"].view(np.int32), one["i2t_scores"].view(np.int32))
    assert np.array_equal(merged["t2i_scores"].view(np.int32), one["t2i_scores"].view(np.int32))


def test_slices_whose_target_scores_differ_or_that_leave_a_gap_are_refused():
    text, image, caption_image, distractors = _tie_case()
    rows = ArrayRows(distractors)
    tiles = pass_tiles(image.shape[0] + rows.n, 16)
    walks = slice_tiles(len(tiles), 3)
    parts = [part_from_pass(gallery_pass(text, image, caption_image, rows, 10, "cpu", 16, 16, walk=w),
                            tiles[w.start][0], tiles[w.stop - 1][1]) for w in walks]
    query_images = np.unique(caption_image)
    n_items = image.shape[0] + rows.n
    parts[2].target_score = parts[2].target_score.copy()
    parts[2].target_score[5] = np.nextafter(parts[2].target_score[5], np.float32(2))  # one ULP: another machine's
    with pytest.raises(FusebenchError, match=r"the slice of items 144\.\.209 scores the captions' targets with other"):
        merge_slices(iter(parts), 10, n_items, len(caption_image), query_images)
    with pytest.raises(ValueError, match="after items up to"):
        merge_slices(iter([parts[0], parts[2]]), 10, n_items, len(caption_image), query_images)
    with pytest.raises(ValueError, match="cover items"):
        merge_slices(iter(parts[:2]), 10, n_items, len(caption_image), query_images)


def test_slices_are_whole_tiles_in_order_none_empty():
    assert slice_tiles(19, 4) == [range(0, 4), range(4, 9), range(9, 14), range(14, 19)]
    assert all(len(w) >= 1 for w in slice_tiles(7, 7))
    with pytest.raises(ValueError):
        slice_tiles(3, 4)


# ---- whole runs -------------------------------------------------------------------------------------------------

SMALL = ["dataset.n_images=200", "dataset.n_captions=600", "eval.bootstrap.draws=50", "plots=false", "logger=none",
         "views=inline", "gallery=sim", "gallery.near_duplicate=null", "gallery.size=1003", "eval.item_chunk_size=64",
         "eval.chunk_size=128", "eval.save_topk=30"]
MODELS = ("sim_siglip2_like", "sim_dfn5b_like")


class DupRows:
    """A sim gallery with copies: each distractor ``dst`` reads distractor ``src``'s row (ties across slices)."""

    def __init__(self, base, copies: dict[int, int]):
        self.base, self.copies, self.n, self.dim = base, copies, base.n, base.dim

    @property
    def key(self) -> dict:
        return {"kind": "dup", "base": self.base.key, "copies": sorted(self.copies.items())}

    def read(self, start: int, stop: int) -> np.ndarray:
        rows = np.array(self.base.read(start, stop))
        for dst, src in self.copies.items():
            if start <= dst < stop:
                rows[dst - start] = self.base.read(src, src + 1)[0]
        return rows


@pytest.fixture
def duplicated(monkeypatch):
    """Sim distractors 380..529 are copies of distractors 0..149 (items 580..729 of 200..349: other slices)."""
    real = gallery_stage.sim_distractor_rows
    monkeypatch.setattr(gallery_stage, "sim_distractor_rows",
                        lambda *a: DupRows(real(*a), {380 + i: i for i in range(150)}))


def _run(compose_cfg, out: Path, cache: Path, *extra):
    return run(compose_cfg([*SMALL, f"embed.cache.dir={cache}", *extra]), str(out))


def _same_files(one: Path, other: Path) -> list[Path]:
    """The rank and topk files of ``one``, each checked byte for byte against ``other``'s (returned: those compared)."""
    files = sorted(p for folder in ("ranks", "topk") for p in (one / folder).rglob("*") if p.is_file())
    assert files
    for path in files:
        assert filecmp.cmp(path, other / path.relative_to(one), shallow=False), path
    return files


def _slice_json(out: Path) -> dict:
    return json.loads((out / "slice.json").read_text())


@pytest.mark.slow
def test_sliced_runs_write_the_one_process_files_byte_for_byte(compose_cfg, tmp_path, duplicated):
    _run(compose_cfg, tmp_path / "one", tmp_path / "c1")
    for s in (0, 2, 3):  # slice 1 never ran: the merge computes it itself
        assert _run(compose_cfg, tmp_path / f"s{s}", tmp_path / "c2", "gallery.slices=4", f"gallery.slice={s}") is None
        record = _slice_json(tmp_path / f"s{s}")
        assert record["slice"] == s and not any(m["hit"] for m in record["models"].values())
        assert not (tmp_path / f"s{s}" / "metrics.json").exists()
    bounds = [(_slice_json(tmp_path / f"s{s}")["models"][MODELS[0]]["start"],
               _slice_json(tmp_path / f"s{s}")["models"][MODELS[0]]["stop"]) for s in (0, 2, 3)]
    assert bounds == [(0, 256), (576, 896), (896, 1203)]  # whole tiles of 64; 1,203 items: not a multiple
    merged = _run(compose_cfg, tmp_path / "merged", tmp_path / "c2", "gallery.slices=4")
    files = _same_files(tmp_path / "one", tmp_path / "merged")
    assert {p.name for p in files} >= {"sim_siglip2_like.t2i.npy", "fused.t2i.npy", "queries.npz"}
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())["retrievers"]
    assert json.loads((tmp_path / "merged" / "metrics.json").read_text())["retrievers"] == one
    assert merged.run.lists[MODELS[0]]["stored"]
    topk = np.load(tmp_path / "one" / "topk" / f"{MODELS[0]}.t2i.npz")
    ids = topk[next(k for k in topk.files if "id" in k)]
    assert np.isin(ids, np.arange(580, 730)).any() and np.isin(ids, np.arange(200, 350)).any()  # copies listed
    entries = SliceStore(tmp_path / "c2").entries()
    assert len(entries) == 8 and all(e["complete"] for e in entries)  # slice 1 of each model stored by the merge


@pytest.mark.slow
def test_a_killed_slice_is_computed_alone_and_damage_or_foreign_entries_are_never_merged(compose_cfg, tmp_path,
                                                                                         caplog):
    cache = tmp_path / "cache"
    for s in range(3):
        _run(compose_cfg, tmp_path / f"a{s}", cache, "gallery.slices=3", f"gallery.slice={s}")
    store = SliceStore(cache)
    by_slice = {}
    for entry in store.entries():
        meta = json.loads((Path(entry["path"]) / "meta.json").read_text())
        by_slice.setdefault(meta["material"]["slice"], []).append(Path(entry["path"]))
    # slice 1 killed mid-write (no meta.json: never finished); slice 2: one model's file bit-flipped, the other's cut
    for folder in by_slice[1]:
        (folder / "meta.json").unlink()
    flipped, cut = by_slice[2]
    data = bytearray((flipped / "slice.npz").read_bytes())
    data[len(data) // 2] ^= 0x01
    (flipped / "slice.npz").write_bytes(bytes(data))
    with open(cut / "slice.npz", "r+b") as fh:
        fh.truncate(100)
    mtimes = {f: (f / "slice.npz").stat().st_mtime_ns for f in by_slice[0]}
    for s in range(3):  # the rerun of the sweep
        _run(compose_cfg, tmp_path / f"b{s}", cache, "gallery.slices=3", f"gallery.slice={s}")
    hits = {s: [m["hit"] for m in _slice_json(tmp_path / f"b{s}")["models"].values()] for s in range(3)}
    assert hits == {0: [True, True], 1: [False, False], 2: [False, False]}
    assert {f: (f / "slice.npz").stat().st_mtime_ns for f in by_slice[0]} == mtimes  # slice 0 not recomputed
    assert "does not match its recorded checksum" in caplog.text and "truncated" in caplog.text
    # an entry of another slice count put in slice 0's place: meta.json names other inputs, so it is discarded
    _run(compose_cfg, tmp_path / "four", cache, "gallery.slices=4", "gallery.slice=0")
    four = [Path(e["path"]) for e in store.entries()
            if json.loads((Path(e["path"]) / "meta.json").read_text())["material"]["slices"] == 4]
    target = by_slice[0][0]
    for name in ("slice.npz", "meta.json"):
        (target / name).write_bytes((four[0] / name).read_bytes())
    caplog.clear()
    _run(compose_cfg, tmp_path / "merged", cache, "gallery.slices=3")
    assert "corrupt or outdated" in caplog.text and str(target) in caplog.text
    _run(compose_cfg, tmp_path / "one", tmp_path / "c1")
    _same_files(tmp_path / "one", tmp_path / "merged")
    # another gallery (seed) reads none of these slices: the merge computes its own
    before = {e["key"] for e in store.entries()}
    _run(compose_cfg, tmp_path / "seed1", cache, "gallery.slices=3", "gallery.seed=1")
    assert len({e["key"] for e in store.entries()} - before) == 6


@pytest.mark.parametrize("extra,words", [
    (["gallery.slices=3", "gallery.slice=3"], "gallery.slice=3 but gallery.slices=3: valid gallery.slice is 0..2"),
    (["gallery.slices=3", "gallery.slice=-1"], "gallery.slice"),
    (["gallery.slices=0"], "gallery.slices"),
    (["gallery.slice=1"], "gallery.slice=1 needs gallery.slices=N"),
    (["gallery.slices=2", "search=faiss_flat"], "gallery.slices=2 is the exact search's"),
    (["gallery.slices=2", "eval.lists.store=false"], "eval.lists.store=true"),
    (["gallery.size=0", "gallery.slices=2"], "it needs distractors"),
    (["gallery.slices=2", "eval.search_precision=bf16"], "set eval.search_precision=fp32 or auto"),
    (["gallery.slices=2", "eval.search_precision=tf32"], "set eval.search_precision=fp32 or auto"),
    (["gallery.slices=2", "tune=weights"], "tune=weights with distractors is not supported"),
])
def test_bad_slice_keys_are_one_line_naming_the_key(compose_cfg, extra, words):
    with pytest.raises(FusebenchError) as err:
        run_config(compose_cfg([*SMALL, *extra]))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_more_slices_than_tiles_is_refused_naming_both(compose_cfg, tmp_path):
    with pytest.raises(FusebenchError, match=r"gallery.slices=40 but the gallery's 1,203 items .* make 19 tile"):
        _run(compose_cfg, tmp_path / "x", tmp_path / "c", "gallery.slices=40", "gallery.slice=0")


def _fusebench(tmp_path, *args):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled", "HOME": str(tmp_path)}
    return subprocess.run([FUSEBENCH, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_bad_slice_key_exits_2_in_one_line(tmp_path):
    result = _fusebench(tmp_path, *SMALL, "gallery.slices=2", "gallery.slice=5")
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        next(line for line in result.stderr.splitlines() if "gallery.slice=5" in line)]


@pytest.mark.slow
def test_slices_on_the_joblib_launcher_then_the_merge(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cache = f"embed.cache.dir={tmp_path / 'cache'}"
    sweep = _fusebench(tmp_path, "-m", *SMALL, cache, "gallery.slices=3", "gallery.slice=range(0,3)",
                       "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert sweep.returncode == 0, sweep.stderr
    assert "3 slice job(s)" in sweep.stdout and "3 done (slices 0, 1, 2), 0 failed" in sweep.stdout
    assert json.loads((tmp_path / "sw" / "slices.json").read_text())["done"] == [0, 1, 2]
    assert not (tmp_path / "sw" / "summary.md").exists()
    merge = _fusebench(tmp_path, *SMALL, cache, "gallery.slices=3", f"hydra.run.dir={tmp_path / 'merged'}")
    assert merge.returncode == 0, merge.stderr
    assert "not in the slice store" not in merge.stderr  # every slice came from the jobs
    one = _fusebench(tmp_path, *SMALL, f"embed.cache.dir={tmp_path / 'c1'}", f"hydra.run.dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr
    _same_files(tmp_path / "one", tmp_path / "merged")
