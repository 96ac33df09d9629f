"""Runs through an approximate backend, end to end: FAISS flat gives exact search's numbers, an engine's run records
its parity and leaves no database behind (one left by a killed run is removed, never read), and a backend whose
package is missing stops the run before any embedding work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fusebench import FUSED, FusebenchError
from fusebench.app import pipeline
from fusebench.app.pipeline import run
from fusebench.evaluation.search_record import EXACT_FUSED

pytestmark = pytest.mark.slow  # whole jobs

SMALL = ["dataset.n_images=300", "dataset.n_captions=900", "eval.bootstrap.draws=200", "plots=false", "logger=none",
         "fusion.top_k=20", "eval.lists.depth=20"]


def _run(compose_cfg, tmp_path, name, overrides):
    out = tmp_path / name
    return run(compose_cfg(SMALL + [f"embed.cache.dir={tmp_path / 'cache'}", *overrides]), str(out)), out


def test_faiss_flat_gives_exact_search_numbers(compose_cfg, tmp_path):
    pytest.importorskip("faiss")
    exact, exact_out = _run(compose_cfg, tmp_path, "exact", [])
    flat, flat_out = _run(compose_cfg, tmp_path, "flat", ["search=faiss_flat"])
    assert exact.search is None and flat.search.backend == "faiss" and flat.search.index == "flat"
    for name in ("sim_siglip2_like", "sim_dfn5b_like", FUSED):
        for direction in ("t2i", "i2t"):
            ours = np.load(flat_out / "ranks" / f"{name}.{direction}.npy")
            theirs = np.load(exact_out / "ranks" / f"{name}.{direction}.npy")
            if name != FUSED:  # exact ranks past the list are missed (0) through an index
                theirs = np.where(theirs <= 20, theirs, 0)
            assert (ours == theirs).mean() > 0.99  # equal up to float-rounding ties
            assert flat.retrievers[name].recall(direction, 1) == pytest.approx(exact.retrievers[name].recall(direction, 1), abs=0.5)
    assert flat.retrievers[EXACT_FUSED].recall("t2i", 1) == exact.retrievers[FUSED].recall("t2i", 1)
    quality = flat.search.models["sim_siglip2_like"]["t2i"]
    assert quality.neighbour_recall > 0.999 and quality.top1_agreement > 0.99 and quality.index_bytes > 0
    assert flat.comparison(EXACT_FUSED, FUSED, "t2i", 1) is not None
    again, _ = _run(compose_cfg, tmp_path, "again", ["search=faiss_flat"])  # the index store: built once
    assert all(q.hit for by in again.search.models.values() for q in by.values())
    saved = json.loads((flat_out / "metrics.json").read_text())
    assert saved["search"]["label"] == "faiss flat" and EXACT_FUSED in saved["retrievers"]


def test_an_engine_run_records_parity_and_leaves_no_database(compose_cfg, tmp_path, caplog):
    pytest.importorskip("qdrant_client")
    out = tmp_path / "qdrant"
    from fusebench.backends.engine_dirs import fresh_workdir

    leftover = fresh_workdir(out, "t2i")  # as a killed run leaves it: fusebench's marked folder
    (leftover / "half-written").write_text("a killed run's database")
    record, _ = _run(compose_cfg, tmp_path, "qdrant", ["search=qdrant", "search.latency_queries=5"])
    assert "left by a run that did not finish" in caplog.text
    assert not (out / "engine_db").exists()
    assert record.fusion.preset == "qdrant_dbsf"
    for direction in ("t2i", "i2t"):
        parity = record.search.parity[direction]
        assert parity.identical_top10 >= 0.99 and parity.differ - parity.explained <= 0.01 * parity.n_queries
        assert record.search.engine[direction].latency_queries == 5
    assert record.search.version.startswith("qdrant-client")
    kept, kept_out = _run(compose_cfg, tmp_path, "kept", ["search=qdrant", "search.latency_queries=0",
                                                            "search.keep_db=true"])
    assert (kept_out / "engine_db" / "t2i").is_dir() and kept.search.engine["t2i"].latency_ms_median is None


@pytest.mark.parametrize("put", ["file", "nested", "folder", "unmarked", "in kept t2i", "folder in kept i2t", "seal"])
def test_a_users_file_in_engine_db_is_refused_and_kept(compose_cfg, tmp_path, put, monkeypatch):
    """fusebench removes only the engine folders it marked; anything else there stops the run before any work."""
    from fusebench import FusebenchError
    from fusebench.app import pipeline
    from fusebench.backends.engine_dirs import fresh_workdir

    out = tmp_path / "run"
    root = out / "engine_db"
    if put == "file":
        fresh_workdir(out, "t2i")
        mine = root / "notes.txt"
    elif put == "nested":
        fresh_workdir(out, "t2i")
        (root / "mine").mkdir()
        mine = root / "mine" / "data.bin"
    elif put == "folder":
        fresh_workdir(out, "t2i")
        (root / "i2t").mkdir()  # a direction's name, but not a folder fusebench made
        mine = root / "i2t" / "keep.txt"
    elif put in ("in kept t2i", "folder in kept i2t", "seal"):  # a database kept by search.keep_db, sealed
        from fusebench.backends.engine_dirs import SEAL, seal

        for direction in ("t2i", "i2t"):
            folder = fresh_workdir(out, direction)
            (folder / "collection").mkdir()
            (folder / "collection" / "storage.sqlite").write_text("the engine's")
            seal(folder)
        mine = {"in kept t2i": root / "t2i" / "notes.txt", "folder in kept i2t": root / "i2t" / "mine" / "f",
                "seal": root / "t2i" / SEAL}[put]
    else:
        root.mkdir(parents=True)  # no marker: not fusebench's
        mine = root / "t2i" / "collection.db"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text("the user's")
    embedded = []
    monkeypatch.setattr(pipeline, "_embeddings", lambda *a: embedded.append(1))
    monkeypatch.setattr("fusebench.backends.base.require", lambda backend: None)  # no engine needed to refuse
    cfg = compose_cfg([*SMALL, "search=qdrant", "logger=none", "plots=false", f"embed.cache.dir={tmp_path / 'c'}"])
    with pytest.raises(FusebenchError, match="engine_db") as err:
        pipeline.run(cfg, str(out))
    assert "move it away" in str(err.value) and not embedded
    assert mine.read_text() == "the user's"


def test_a_missing_backend_stops_the_run_before_any_embedding(compose_cfg, tmp_path, monkeypatch):
    import importlib

    real = importlib.import_module

    def no_faiss(name, *args, **kwargs):
        if name == "faiss":
            raise ImportError("No module named 'faiss'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_faiss)
    monkeypatch.setattr(pipeline, "_embeddings", lambda *a: pytest.fail("embedded before refusing"))
    with pytest.raises(FusebenchError, match=r"pip install 'fusebench\[faiss\]'"):
        run(compose_cfg(SMALL + ["search=faiss_hnsw"]), str(tmp_path / "out"))


def test_index_sizes_are_refused_before_any_embedding(compose_cfg, tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    monkeypatch.setattr(pipeline, "_embeddings", lambda *a: pytest.fail("embedded before refusing"))
    with pytest.raises(FusebenchError, match=r"search.nprobe=52 is more than the 7 lists of the t2i index"):
        run(compose_cfg(SMALL + ["search=faiss_ivf_flat", "search.nlist=null"]), str(tmp_path / "out"))
    with pytest.raises(FusebenchError, match=r"search.nlist=500 is more than the 300 items"):
        run(compose_cfg(SMALL + ["search=faiss_ivf_flat", "search.nlist=500", "search.nprobe=4"]), str(tmp_path / "o2"))


def test_an_engine_keyed_by_document_marks_each_entry_with_its_model(compose_cfg, tmp_path):
    """fuse_on=document: an entry is one model's hit, so its contributor bit is that model's, as in fusebench's own
    fused lists; and parity is read on the whole fused lists even when the saved lists are shorter."""
    pytest.importorskip("qdrant_client")
    record, out = _run(compose_cfg, tmp_path, "doc", ["search=qdrant", "fusion=qdrant_rrf", "fusion.fuse_on=document",
                                                      "search.latency_queries=0", "eval.save_topk=3"])
    engine, exact = np.load(out / "topk" / "fused.t2i.npz"), np.load(out / "topk" / "exact_fused.t2i.npz")
    assert engine["ids"].shape[1] == 3
    same = engine["ids"] == exact["ids"]
    assert same.mean() > 0.99 and (engine["contributors"][same] == exact["contributors"][same]).all()
    assert set(np.unique(engine["contributors"])) <= {1, 2}
    assert record.search.parity["t2i"].identical_top10 >= 0.99 and record.search.depth == 20


def test_a_sealed_database_left_as_the_engine_left_it_is_removed_and_rebuilt(tmp_path):
    from fusebench.backends.engine_dirs import check_engine_dir, fresh_workdir, seal

    out = tmp_path / "run"
    folder = fresh_workdir(out, "t2i")
    (folder / "collection").mkdir()
    (folder / "collection" / "storage.sqlite").write_text("the engine's")
    seal(folder)
    check_engine_dir(out)  # only what the engine left: fusebench's to remove
    again = fresh_workdir(out, "t2i")
    assert again == folder and not (folder / "collection").exists()


def test_a_cut_short_seal_of_fusebenchs_leaves_the_database_the_engines(tmp_path):
    from fusebench.backends.engine_dirs import SEAL, check_engine_dir, fresh_workdir, seal

    out = tmp_path / "run"
    folder = fresh_workdir(out, "t2i")
    (folder / "data.bin").write_text("the engine's")
    seal(folder)
    whole = (folder / SEAL).read_bytes()
    for cut in (40, 30, 0):  # fusebench's, damaged (down to empty: a beginning of what it writes)
        (folder / SEAL).write_bytes(whole[:cut])
        check_engine_dir(out)
    assert not (fresh_workdir(out, "t2i") / "data.bin").exists()  # removed, rebuilt: never a dead end


def test_a_target_recall_run_records_what_it_chose_and_an_unreachable_one_writes_nothing(compose_cfg, tmp_path):
    pytest.importorskip("faiss")
    record, out = _run(compose_cfg, tmp_path, "target", ["search=faiss_ivf_flat", "search.nlist=8",
                                                         "search.target_recall=0.9"])
    saved = json.loads((out / "metrics.json").read_text())["search"]
    assert saved["label"] == "faiss ivf_flat nlist=8 target_recall=0.9"
    for model, by in saved["models"].items():
        for direction, quality in by.items():
            target = quality["target"]
            params = saved["params"][direction]
            chosen = (params[model] if model in params else params)["nprobe"]
            assert target["value"] == chosen and 1 <= chosen <= 8 and target["sample_recall_low"] >= 0.9
            assert target["tried"][str(chosen)]["low"] == target["sample_recall_low"]
            assert chosen == 1 or target["tried"].get(str(chosen - 1), {"low": 0})["low"] < 0.9
            assert quality["neighbour_recall"] > 0.8 and target["queries"]["source"] == "split"
    # the tuning queries are the sim corpus's val draw: the reported corpus is the one an exact run reports on
    assert record.dataset.n_captions == _run(compose_cfg, tmp_path, "exact", [])[0].dataset.n_captions
    assert "index_tuning_held_out_images" not in record.dataset.meta
    with pytest.raises(FusebenchError, match=r"search.target_recall=1 is not reached by model .* on its \d+ tuning "
                                             r"queries the best neighbour recall@\d+ is 0\.\d+ \(one-sided 95% lower "
                                             r"bound 0\.\d+\), at nprobe="):
        _run(compose_cfg, tmp_path, "unreached", ["search=faiss_ivf_pq", "search.nlist=4", "search.nbits=4",
                                                  "search.pq_m=2", "search.target_recall=1"])
    assert not (tmp_path / "unreached" / "metrics.json").exists()


@pytest.mark.parametrize("kill_after", [0, 1, 2, 3])
def test_a_removal_killed_midway_leaves_a_folder_the_rerun_still_removes(tmp_path, monkeypatch, kill_after):
    """The marker goes last (then the empty folder): a removal killed after any unlink leaves the folder marked or
    empty, which the next run removes and rebuilds, never a dead end ('a folder fusebench did not make')."""
    import os

    from fusebench.backends import engine_dirs

    out = tmp_path / "run"
    folder = engine_dirs.fresh_workdir(out, "t2i")
    for name in ("a.bin", "b.bin"):
        (folder / name).write_text("the engine's")
    engine_dirs.seal(folder)
    unlinks, real = [], os.unlink

    class Killed(BaseException):
        pass

    def dies(path, *args, **kwargs):
        if len(unlinks) == kill_after:
            raise Killed
        unlinks.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", dies)
    with pytest.raises(Killed):
        engine_dirs.remove_workdir(folder)
    monkeypatch.setattr(os, "unlink", real)
    engine_dirs.check_engine_dir(out)  # not refused
    again = engine_dirs.fresh_workdir(out, "t2i")
    assert again == folder and sorted(p.name for p in again.iterdir()) == [engine_dirs.MARKER]
    empty = out / "engine_db" / "i2t"  # the folder left empty by a kill between its marker and its rmdir
    empty.mkdir()
    engine_dirs.check_engine_dir(out)
    assert (engine_dirs.fresh_workdir(out, "i2t") / engine_dirs.MARKER).is_file()


def test_a_refusal_inside_the_engine_leaves_no_engine_folder(compose_cfg, tmp_path):
    """search.pq_m that does not divide a width is LanceDB's refusal once the rows are known: one line, and the
    engine_db folder made for the run is gone with it."""
    pytest.importorskip("lancedb")
    from fusebench.app.pipeline import run

    cfg = compose_cfg(["dataset=sim", "dataset.n_images=300", "dataset.n_captions=600", "search=lancedb",
                       "search.index=ivf_pq", "search.nlist=8", "search.nprobe=4", "search.pq_m=7", "logger=none",
                       "plots=false", f"paths.output_dir={tmp_path}", f"embed.cache.dir={tmp_path / 'cache'}"])
    with pytest.raises(FusebenchError, match=r"search.pq_m=7 does not divide"):
        run(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "engine_db").exists()


def test_cleanup_after_a_stopped_run_keeps_an_earlier_kept_database_and_a_users_file(tmp_path):
    """remove_bare_root takes engine_db/ only when nothing but its mark is left; remove_workdir leaves a kept
    database that someone put a file into (refused by the next run, naming it, never deleted)."""
    from fusebench.backends import engine_dirs

    out = tmp_path / "run"
    kept = engine_dirs.fresh_workdir(out, "i2t")
    (kept / "data.bin").write_text("an earlier run's kept database")
    engine_dirs.seal(kept)
    engine_dirs.remove_bare_root(out)
    assert (kept / "data.bin").is_file()
    (kept / "my_notes.txt").write_text("the user's")
    engine_dirs.remove_workdir(kept)
    assert (kept / "my_notes.txt").is_file() and (kept / "data.bin").is_file()
    with pytest.raises(FusebenchError, match="my_notes.txt"):
        engine_dirs.check_engine_dir(out)
    (kept / "my_notes.txt").unlink()
    engine_dirs.remove_workdir(kept)
    engine_dirs.remove_bare_root(out)
    assert not (out / "engine_db").exists()
