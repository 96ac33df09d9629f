"""scripts/gpu_check.py stays ready for the session that is lent a GPU: its table and verdicts (pure functions), and
its dry run (``--device cpu``), which takes every code path of the GPU run at tiny sizes and must end with one table
of every check, nothing failed, what needs CUDA marked "skipped: no cuda"."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # imports torch; the dry run runs fusebench jobs in subprocesses

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metrics(where: str, recall: float) -> dict:
    return {"dataset": {"t2i_queries": 2000},
            "run": {"lists": {"m": {"t2i_seconds": 4.0}}},
            "search": {"models": {"m": {"t2i": {"where": where, "neighbour_recall": recall, "query_ms": 0.5,
                                                "build_seconds": 3.0}}}}}


def test_a_faiss_row_passes_only_on_the_gpu_and_a_flat_index_only_at_full_recall():
    g = _script()
    assert g.faiss_row("faiss_flat", _metrics("cuda", 1.0), True, "x")["status"] == "pass"
    assert g.faiss_row("faiss_flat", _metrics("cuda", 0.99), True, "x")["status"] == "FAIL"
    assert g.faiss_row("faiss_ivf_flat", _metrics("cuda", 0.9), True, "x")["status"] == "pass"  # reported
    assert g.faiss_row("faiss_ivf_pq", _metrics("cpu", 0.9), True, "x")["status"] == "FAIL"  # fell back to the CPU
    assert g.faiss_row("faiss_ivf_flat", None, True, "x")["status"] == "FAIL"  # the job failed
    dry = g.faiss_row("faiss_ivf_flat", _metrics("cpu", 0.9), False, "x")
    assert dry["status"] == g.NO_CUDA
    # search: 0.5 ms x 2,000 queries = 1.00 s, against the exact t2i pass's 4 s
    assert "where cpu, recall 0.9000, search 1.00 s = 0.25x exact t2i, build 3.0 s" == dry["measured"]


def test_the_table_pads_every_column_and_a_fail_anywhere_fails_the_run():
    g = _script()
    rows = [g.row("a", "b", "c", "pass"), g.row("longer check", "x", "measured value", g.NO_CUDA)]
    lines = g.table(rows).splitlines()
    assert lines[0].split() == ["check", "expected", "measured", "status"]
    assert lines[2].index("pass") == lines[3].index(g.NO_CUDA) == lines[0].index("status")
    assert g.failed(rows) == []
    assert g.failed([*rows, g.row("d", "e", "f", "FAIL")]) == [g.row("d", "e", "f", "FAIL")]
    assert g.judged(True, cuda=False) == g.judged(False, cuda=False) == g.NO_CUDA
    assert (g.judged(True, cuda=True), g.judged(False, cuda=True)) == ("pass", "FAIL")


def test_the_dry_run_checks_every_path_and_prints_one_table(tmp_path):
    pytest.importorskip("open_clip")
    pytest.importorskip("transformers")
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPT.parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--json", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["check"]: r for r in report["rows"]}
    assert report["gpu"] == "none (cpu dry run)" and report["device"] == "cpu"
    for name in ("open_clip", "hf_clip", "hf_siglip2"):
        for precision, tol in (("fp32", 1e-3), ("bf16", 5e-2)):
            r = rows[f"embed {name} {precision} on cpu vs cpu fp32"]
            assert r["status"] == "skipped: no cuda" and float(r["measured"]) <= tol
    exact = [r for r in report["rows"] if r["check"].startswith("exact ")]
    assert len(exact) == 3 and exact[0]["status"] == "pass" and exact[0]["measured"] == "t2i equal, i2t equal"
    faiss = [r for r in report["rows"] if r["check"].startswith("faiss ")]
    assert [r["check"].split()[1] for r in faiss] == ["flat", "ivf_flat", "ivf_pq", "hnsw"]
    if importlib.util.find_spec("faiss") is not None:  # the jobs ran, on the CPU: their rows say what they measured
        assert all(r["measured"].startswith("where cpu, recall ") for r in faiss[:3])
        assert float(faiss[0]["measured"].split("recall ")[1].split(",")[0]) == 1.0  # flat = exact
        assert all(r["status"] == "skipped: no cuda" for r in faiss[:3])
    else:
        assert all(r["status"] == "skipped: faiss is not installed" for r in faiss[:3])
    assert faiss[3]["status"] == "info"
    (job,) = [r for r in report["rows"] if r["check"].startswith("cold vectors job on cpu")]
    assert job["status"] == "info" and "vs bare fp32 matmuls" in job["measured"]
    assert all(r["status"] != "FAIL" for r in report["rows"])
    table = done.stdout[done.stdout.index("\ncheck "):]  # the one table, at the end of stdout
    assert all(r["check"] in table for r in report["rows"]) and "all checks held" in table
