"""Issue 20: embeddings of any finite scale keep their direction, and input files that are wrong in a way their
first bytes already show (a directory, a .npy header, a misspelt manifest key, a byte-order mark) are refused,
or accepted, before any work, with one message that names the file (and line) or the config key."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.corpora import mini_coco, write_manifest
from helpers.tiers import fast_first

from fusebench import FusebenchError
from fusebench.data.karpathy import load_karpathy, read_annotations
from fusebench.data.manifest import load_manifest
from fusebench.encoders.base import check_embeddings, check_matrix
from fusebench.encoders.models import load_raw
from fusebench.encoders.rownorm import l2_normalise_rows
from fusebench.encoders.vectors import vector_arrays

FUSEBENCH = str(Path(sys.executable).with_name("fusebench"))


def reference_directions(x: np.ndarray) -> np.ndarray:
    """Each row over its length, the obvious way in float64 (math.hypot neither overflows nor underflows)."""
    return np.array([[float(v) / math.hypot(*map(float, row)) for v in row] for row in x])


def _rows(dtype=np.float32, shape=(12, 40), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- rows of any finite scale

@pytest.mark.parametrize("dtype,scale", [
    (np.float32, 1e20), (np.float32, 1e-20), (np.float32, 1e-30), (np.float32, 1e-40), (np.float32, 1e30),
    (np.float64, 1e100), (np.float64, 1e-100), (np.float64, 1e300), (np.float64, 1e-300), (np.float64, 1e-45),
    (np.float16, 1e4), (np.float16, 1e-6),  # float16 never leaves float32's range: checked all the same
])
def test_scaled_rows_keep_their_direction(dtype, scale):
    base = _rows(np.float64)
    x = (base * scale).astype(dtype)
    assert np.isfinite(x).all() and (np.abs(x).max(axis=1) > 0).all()
    out, norms, finite = l2_normalise_rows(x)
    assert out.dtype == np.float32 and finite.all() and (norms > 0).all() and np.isfinite(out).all()
    assert np.allclose(out, reference_directions(x), rtol=0, atol=1e-7)  # the rows as given, to float32 rounding
    if dtype != np.float16 and scale > 1e-38:  # no entry lost precision to the scale: as the unscaled rows
        assert np.allclose(out, reference_directions(base), rtol=0, atol=1e-6)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_rows_at_float32_limits_and_mixed_scales():
    x = _rows(shape=(40, 300), seed=1)
    x[0] = np.float32(3e38) * np.sign(x[0])  # every entry near float32's largest
    x[1, :] = 0
    x[1, 17] = np.float32(3e38)  # one entry at the limit, the rest zero
    x[2] = np.float32(1e-45) * np.sign(x[2])  # the smallest subnormal
    scales = 10.0 ** np.random.default_rng(2).uniform(-37, 37, len(x) - 3)
    x[3:] = (x[3:].astype(np.float64) * scales[:, None]).astype(np.float32)  # a different scale on every row
    out, norms, finite = l2_normalise_rows(x)
    assert finite.all() and np.isfinite(out).all() and (norms > 0).all()
    assert np.allclose(out, reference_directions(x), rtol=0, atol=1e-7)
    assert out[1, 17] == 1 and np.count_nonzero(out[1]) == 1


def test_ordinary_rows_keep_numpy_bits_beside_rescaled_ones():
    x = _rows(shape=(6, 257), seed=3)
    expected = x / np.linalg.norm(x, axis=1)[:, None]
    x[2] *= np.float32(1e25)  # only this row leaves the float32 path
    x[4] *= np.float32(1e-25)
    out, _, _ = l2_normalise_rows(x)
    assert np.array_equal(out[[0, 1, 3, 5]], expected[[0, 1, 3, 5]])
    assert np.allclose(out[[2, 4]], expected[[2, 4]], rtol=0, atol=1e-6)


def test_tiny_rows_are_not_called_all_zeros_but_zero_rows_are():
    for tiny in (np.full((3, 8), 1e-30, np.float32), np.full((3, 8), 1e-50, np.float64)):
        out = check_matrix(tiny, 3, "image embeddings", "x.npy", "images")
        assert np.allclose(out, 1 / np.sqrt(8), rtol=1e-6)
    x = np.full((3, 8), 1e-30, np.float32)
    x[1] = 0
    with pytest.raises(FusebenchError, match=r"x\.npy: image embeddings row 1 is all zeros \(1 zero rows in all\)"):
        check_matrix(x, 3, "image embeddings", "x.npy", "images")
    x = np.full((3, 8), 1e300, np.float64)  # finite, though beyond float32: not NaN or inf
    x[2, 5] = np.inf
    with pytest.raises(FusebenchError, match=r"row 2 contains NaN or inf \(1 bad rows in all\)"):
        check_matrix(x, 3, "image embeddings", "x.npy", "images")


@pytest.mark.parametrize("image_scale,text_scale,dtype", [
    (1e20, 1.0, np.float32), (1.0, 1e-25, np.float32), (3e38, 1e-30, np.float32), (1e200, 1e-200, np.float64)])
def test_scaled_embeddings_rank_as_the_unscaled(vectors_case, image_scale, text_scale, dtype):
    image, text = (np.load(p).astype(np.float64) for p in vectors_case["files"]["A"])
    n_images, n_captions = len(image), len(text)

    def ranks(img, txt):
        model = check_embeddings("a", img, txt, n_images, n_captions, "img.npy", "txt.npy")
        return np.argsort(-(model.text @ model.image.T), axis=1, kind="stable")[:, :10]

    expected = ranks(image.astype(np.float32), text.astype(np.float32))
    biggest = np.abs(image).max()
    scaled = (image * (image_scale / biggest if image_scale > 1e38 else image_scale)).astype(dtype)
    assert np.isfinite(scaled).all()
    assert np.array_equal(ranks(scaled, (text * text_scale).astype(dtype)), expected)


@pytest.mark.slow  # whole jobs
def test_scaled_vectors_score_as_the_unscaled_through_a_run(compose_cfg, tmp_path, vectors_case):
    """The issue's case: image embeddings x 1e20 gave t2i and i2t R@1 of 2.5 (every row a NaN direction)."""
    from fusebench.app.pipeline import run

    img, txt = vectors_case["files"]["A"]
    np.save(tmp_path / "big.npy", np.load(img) * np.float32(1e20))
    np.save(tmp_path / "small.npy", np.load(txt) * np.float32(1e-30))
    results = []
    for image, text in ((img, txt), (tmp_path / "big.npy", tmp_path / "small.npy")):
        cfg = compose_cfg(["dataset=manifest", f"dataset.manifest={vectors_case['manifest']}", "models=[]",
                           "+models.a.kind=vectors", f"+models.a.image_embeddings={image}",
                           f"+models.a.text_embeddings={text}", "eval.bootstrap.draws=20", "logger=none",
                           "plots=false", "eval.lists.store=false"])
        record = run(cfg, str(tmp_path / f"run{len(results)}")).to_json()["retrievers"]["a"]
        results.append({d: record[d]["R@1"] for d in ("t2i", "i2t")})
    assert results[0] == results[1] and results[0]["t2i"] > 30  # 1 in 40 (2.5) when the rows were lost


# ---------------------------------------------------------------- .npy headers are checked before the rows

def _npy_header_only(path: Path, shape: tuple[int, int], dtype=np.float32) -> Path:
    """A .npy file of ``shape`` whose data is a hole (sparse): what a header check sees, at no disk cost."""
    with path.open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                  "shape": shape})
        fh.truncate(fh.tell() + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return path


@pytest.mark.parametrize("huge", ["image_embeddings", "text_embeddings"])
def test_dimension_mismatch_is_found_in_the_headers(vectors_case, tmp_path, huge):
    """(40, 5,000,000) image rows (800 MB) against 24-wide text rows: refused from the headers, naming both
    files; before, the whole file was read (and its rows of zeros blamed)."""
    img, txt = vectors_case["files"]["A"]
    spec = {"kind": "vectors", "image_embeddings": str(img), "text_embeddings": str(txt)}
    rows = vectors_case["n_images"] if huge == "image_embeddings" else len(vectors_case["caption_image"])
    spec[huge] = str(_npy_header_only(tmp_path / "huge.npy", (rows, 5_000_000)))
    corpus = load_manifest(vectors_case["manifest"])
    with pytest.raises(FusebenchError, match=r"model 'a': image embeddings have dimension \d+ \(.*models\.a\."
                                             r"image_embeddings\) but text embeddings have \d+ .*as the \.npy headers "
                                             r"say") as err:
        load_raw("a", spec, corpus)
    assert str(tmp_path / "huge.npy") in str(err.value)


def test_rows_and_dtype_are_checked_against_the_manifest_from_the_headers(vectors_case, tmp_path):
    img, txt = vectors_case["files"]["A"]
    counts = (vectors_case["n_images"], len(vectors_case["caption_image"]))
    huge = _npy_header_only(tmp_path / "huge.npy", (counts[0], 5_000_000))
    with pytest.raises(FusebenchError, match=r"t\.npy: text embeddings has 99 rows but the corpus has \d+ captions"):
        vector_arrays("a", str(huge), str(_npy_header_only(tmp_path / "t.npy", (99, 5_000_000))), counts)
    with pytest.raises(FusebenchError, match=r"c\.npy: text embeddings must be numeric, got dtype complex64"):
        vector_arrays("a", str(img), str(_npy_header_only(tmp_path / "c.npy", (counts[1], 24), np.complex64)), counts)
    image, text, _, _ = vector_arrays("a", str(img), str(txt), counts)
    assert isinstance(image, np.memmap) and image.shape == (counts[0], 24)  # nothing read yet


# ---------------------------------------------------------------- a directory where a file is needed

def test_directory_given_as_a_file_names_the_key(vectors_case, tmp_path):
    folder = tmp_path / "looks_like.jsonl"
    folder.mkdir()
    with pytest.raises(FusebenchError, match=r"dataset\.manifest=.*looks_like\.jsonl is a directory; it must name a "
                                             r"file \(the JSONL manifest"):
        load_manifest(folder)
    for name in ("dataset_coco.json", "flickr30k_test_karpathy.txt"):
        (tmp_path / name).mkdir()
        with pytest.raises(FusebenchError, match=rf"dataset\.annotations=.*{name.replace('.', '[.]')} is a directory"):
            read_annotations(tmp_path / name)
    img, txt = vectors_case["files"]["A"]
    (tmp_path / "vectors.npy").mkdir()
    with pytest.raises(FusebenchError, match=r"models\.m\.text_embeddings=.*vectors\.npy is a directory; it must name "
                                             r"a file \(a \.npy file"):
        vector_arrays("m", str(img), str(tmp_path / "vectors.npy"))


# ---------------------------------------------------------------- byte-order marks

BOM = b"\xef\xbb\xbf"


def test_byte_order_mark_is_accepted(tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"image_id": "a", "captions": ["x"]},
                                                     {"image_id": "b", "captions": ["y", "z"]}])
    manifest.write_bytes(BOM + manifest.read_bytes())
    corpus = load_manifest(manifest)
    assert corpus.image_ids == ["a", "b"] and corpus.n_captions == 3
    coco = mini_coco(tmp_path / "coco")
    coco.write_bytes(BOM + coco.read_bytes())
    assert load_karpathy(coco, tmp_path / "coco").n_images == 3
    flickr = tmp_path / "flickr30k_test_karpathy.txt"
    flickr.write_bytes(BOM + b"image,caption\n1.jpg,a dog\n2.jpg,a cat\n")
    assert [r[0] for r in read_annotations(flickr)] == ["1.jpg", "2.jpg"]
    bom_later = write_manifest(tmp_path / "late.jsonl", ['{"image_id": "a", "captions": ["x"]}'])
    bom_later.write_bytes(bom_later.read_bytes() + BOM + b'{"image_id": "b", "captions": ["y"]}\n')
    with pytest.raises(FusebenchError, match=r"late\.jsonl:2: not valid JSON"):  # only at the start of the file
        load_manifest(bom_later)


# ---------------------------------------------------------------- misspelt manifest keys

@pytest.mark.parametrize("line,key,guess", [
    ({"image_id": "c", "caption": ["a cat"]}, "'caption'", "; did you mean 'captions'?"),
    ({"image_id": "c", "captions": ["a cat"], "caption_id": [3]}, "'caption_id'", "; did you mean 'caption_ids'?"),
    ({"imageid": "c", "captions": ["a cat"]}, "'imageid'", "; did you mean 'image_id'?"),
    ({"image_id": "c", "captions": ["a cat"], "width": 640}, "'width'", " "),
])
def test_unknown_manifest_key_names_file_line_and_valid_keys(tmp_path, line, key, guess):
    path = write_manifest(tmp_path / "m.jsonl", [{"image_id": "a", "captions": ["x"]}, {"image_id": "b", "captions": []},
                                                 line])
    with pytest.raises(FusebenchError) as err:
        load_manifest(path)
    assert str(err.value).startswith(f"{path}:3: unknown key(s) {key}{guess.strip()}")
    assert "(valid keys: image_id, path, captions, caption_ids)" in str(err.value)


# ---------------------------------------------------------------- ECCV / CxC advice that fits the dataset kind

@pytest.mark.parametrize("name", fast_first(["eccv", "cxc"]))
def test_positives_on_a_manifest_give_advice_a_manifest_can_follow(tmp_path, name):
    pytest.importorskip("eccv_caption", reason="eccv-caption is a dependency")
    from fusebench.evaluation.positives import load_positives

    path = write_manifest(tmp_path / "m.jsonl", [{"image_id": i, "captions": [f"c{i}"], "caption_ids": [100 + i]}
                                                 for i in range(1, 5)])
    with pytest.raises(FusebenchError) as err:
        load_positives(name, load_manifest(path))
    message = str(err.value)
    assert "allow_nonstandard" not in message  # a manifest has no such key
    assert "integer COCO image id as image_id" in message and "caption_ids" in message
    coco = tmp_path / "coco"
    karpathy = load_karpathy(mini_coco(coco), coco)  # COCO-shaped ids, but not the 5k test split's
    with pytest.raises(FusebenchError, match=r"dataset\.allow_nonstandard=true"):
        load_positives(name, karpathy)


# ---------------------------------------------------------------- through the command line: exit 2, one line

def _cli(*args, cwd):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(Path(cwd) / "out"), "WANDB_MODE": "disabled"}
    return subprocess.run([FUSEBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_input_mistakes_exit_2_with_one_line(vectors_case, tmp_path):
    img, txt = vectors_case["files"]["A"]
    (tmp_path / "dir.npy").mkdir()
    misspelt = tmp_path / "M2.jsonl"
    shutil.copy(vectors_case["manifest"], misspelt)
    lines = misspelt.read_text().splitlines()
    lines[6] = lines[6].replace('"captions"', '"caption"')
    misspelt.write_text("\n".join(lines) + "\n")
    cases = [(vectors_case["manifest"], tmp_path / "dir.npy", "models.a.image_embeddings=", "is a directory"),
             (misspelt, img, f"{misspelt}:7: unknown key(s) 'caption'", "valid keys")]
    for manifest, image, *fragments in cases:
        result = _cli("dataset=manifest", f"dataset.manifest={manifest}", "models=[]", "+models.a.kind=vectors",
                      f"+models.a.image_embeddings={image}", f"+models.a.text_embeddings={txt}", "logger=none",
                      "plots=false", "hydra.run.dir=run", cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        (line,) = [x for x in result.stderr.splitlines() if "fusebench: error:" in x]
        assert all(f in line for f in fragments), (fragments, line)
        assert not (tmp_path / "run" / "metrics.json").exists()
