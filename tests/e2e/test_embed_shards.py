"""Drive ``fusebench-embed`` in subprocesses, as users do: a gallery of 40 small PNGs embedded by a tiny open_clip
model in 8 shards, one job per shard, by Hydra's submitit_local and joblib launchers (separate processes); a job
SIGKILLed mid-shard (the test-only hook ``FUSEBENCH_FAULT_KILL_SHARD``); the rerun redoing only the unfinished
work; the shards read back equal, bit for bit, to the same images embedded in one piece in one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_models import build_open_clip
from test_shards import plan_of, runtime, unsharded, write_gallery

from fusebench.config.specs import model_spec
from fusebench.encoders.real import real_run
from fusebench.encoders.shards import FAULT_ENV, shard_material, shard_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EMBED = shutil.which("fusebench-embed") or str(Path(sys.executable).with_name("fusebench-embed"))


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    oc = build_open_clip(root / "oc")
    return {"root": root, "spec": model_spec("oc", {"kind": "open_clip", "model": f"local-dir:{oc}"}, []),
            "gallery": write_gallery(root / "gallery"), "oc": oc}


def args(case, cache: Path, gallery: Path | None = None) -> list[str]:
    return ["dataset=tiny", "dataset.limit=4", "models=[]", "+models.oc.kind=open_clip",
            f"+models.oc.model=local-dir:{case['oc']}", "fusion=none", "logger=none", "gallery=folder",
            f"gallery.source={gallery or case['gallery']}", "gallery.size=40", "gallery.shard_size=5",
            "embed.num_workers=0", "embed.batch_size=1", "embed.cache.chunk_rows=2", f"embed.cache.dir={cache}"]


def embed(*argv, cwd: Path, fault: str | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(cwd / "outputs")}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.run([EMBED, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def entries(case, cache: Path) -> dict[int, Path]:
    """Shard index -> its cache entry's folder (keyed as the jobs key it)."""
    run, plan = real_run(case["spec"], runtime(cache)), plan_of(case["gallery"])
    out = {}
    for index in range(plan.n_shards):
        part = plan.part(index)
        out[index] = run.cache.entry_dir(run.cache.keyed(shard_material(run, part), len(part))[1])
    return out


def state(folders: dict[int, Path]) -> tuple[dict[int, tuple], dict[int, int]]:
    """(complete shards -> their files' identities, partial shards -> rows in their saved chunks)."""
    complete, partial = {}, {}
    for index, folder in folders.items():
        if (folder / "meta.json").is_file():
            complete[index] = tuple((f.stat().st_ino, f.stat().st_mtime_ns) for f in sorted(folder.iterdir()))
        elif folder.is_dir():
            partial[index] = sum(np.load(chunk)["embeddings"].shape[0] for chunk in folder.glob("chunk-*.npz"))
    return complete, partial


def results(sweep: Path) -> dict[int, dict]:
    """Shard index -> what the job that ran it recorded (shard.json)."""
    out = {}
    for record in sweep.glob("*/shard.json"):
        for result in json.loads(record.read_text())["shards"]:
            out[result["shard"]] = result
    return out


def check_rerun(case, cache: Path, sweep: Path, before: tuple[dict, dict]) -> None:
    """The rerun computed only what the first run left unfinished (a partial shard: only its missing rows),
    left every finished shard's files as they were, and the gallery equals a one-piece embedding bit for bit."""
    complete, partial = before
    done = results(sweep)
    assert sorted(done) == list(range(8))
    for index, result in done.items():
        if index in complete:
            assert (result["hit"], result["computed"]) == (True, 0), result
        else:
            assert (result["hit"], result["computed"]) == (False, 5 - partial.get(index, 0)), result
    after, left = state(entries(case, cache))
    assert sorted(after) == list(range(8)) and not left
    assert all(after[i] == complete[i] for i in complete)  # finished shards untouched: same files, same mtimes
    run = real_run(case["spec"], runtime(cache))
    rows = shard_rows(run, plan_of(case["gallery"]))
    assert not run.lazy.loaded  # every shard was in the cache
    expected = unsharded(case["spec"], plan_of(case["gallery"]), cache.parent / "one-process")
    assert rows.read(0, 40).tobytes() == expected.tobytes()


def test_sharded_by_submitit_killed_and_resumed_by_joblib_equals_one_process(case, tmp_path):
    cache = tmp_path / "cache"
    first = embed("-m", *args(case, cache), "gallery.shard=range(0,8)", "hydra/launcher=submitit_local",
                  "hydra.sweep.dir=sweep1", cwd=tmp_path, fault="7:2")  # shard 7 dies after 2 of its 5 rows
    assert first.returncode == 1, first.stderr
    assert "the launcher stopped (UncompletedJobError" in first.stderr and "Traceback" not in first.stderr
    assert "job 7 (gallery.shard=7): no result: the job was killed" in first.stdout
    assert "7 of 8 shards in the cache, not yet: 7" in first.stdout
    before = state(entries(case, cache))
    assert sorted(before[0]) == list(range(7)) and before[1] == {7: 2}  # separate processes: only shard 7 lost
    second = embed("-m", *args(case, cache), "gallery.shard=range(0,8)", "hydra/launcher=joblib",
                   "hydra.sweep.dir=sweep2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "8 job(s)" in second.stdout and "8 done, 0 failed" in second.stdout
    assert "8 shard(s) done by this sweep, 3 images embedded; 8 of 8 shards in the cache" in second.stdout
    check_rerun(case, cache, tmp_path / "sweep2", before)
    assert results(tmp_path / "sweep2")[7]["computed"] == 3  # only shard 7, only its rows after the saved chunk
    assert (tmp_path / "sweep2" / "shards.md").read_text().startswith("fusebench-embed: 8 job(s)")


def test_joblib_losing_a_worker_keeps_the_finished_shards(case, tmp_path):
    cache = tmp_path / "cache"
    first = embed("-m", *args(case, cache), "gallery.shard=range(0,8)", "hydra/launcher=joblib",
                  "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep1", cwd=tmp_path, fault="7:2")
    assert first.returncode == 1, first.stderr
    assert "the launcher stopped (TerminatedWorkerError" in first.stderr and "Traceback" not in first.stderr
    before = state(entries(case, cache))
    assert before[1].get(7) == 2 and 7 not in before[0]  # the killed shard kept its first chunk
    assert f"{len(before[0])} of 8 shards in the cache" in first.stdout
    second = embed("-m", *args(case, cache), "gallery.shard=range(0,8)", "hydra/launcher=joblib",
                   "hydra.sweep.dir=sweep2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    check_rerun(case, cache, tmp_path / "sweep2", before)


def test_two_launches_of_one_shard_compute_it_once(case, tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "outputs")}
    procs = [subprocess.Popen([EMBED, *args(case, cache), "gallery.shard=2", f"hydra.run.dir=run{i}"], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for proc in procs:
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr
    done = [json.loads((tmp_path / f"run{i}" / "shard.json").read_text())["shards"][0] for i in range(2)]
    assert sorted((d["hit"], d["computed"]) for d in done) == [(False, 5), (True, 0)]
    assert done[0]["key"] == done[1]["key"]


def test_shard_out_of_range_nothing_to_embed_and_a_failed_shard(case, tmp_path):
    cache = tmp_path / "cache"
    wrong = embed(*args(case, cache), "gallery.shard=8", "hydra.run.dir=wrong", cwd=tmp_path)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert ("fusebench: error: gallery.shard=8 but gallery.size=40 in shards of gallery.shard_size=5 makes 8 shard(s) "
            "(valid: 0 to 7)") in wrong.stderr
    sim = embed("hydra.run.dir=sim", cwd=tmp_path)  # the default job: two sim models
    assert sim.returncode == 0, sim.stderr
    assert "nothing to embed: the models sim_siglip2_like (sim), sim_dfn5b_like (sim) bring their own rows" in sim.stdout
    # a multirun (Hydra's basic launcher): a shard past the end fails alone; the other job's shard is kept
    sweep = embed("-m", *args(case, cache), "gallery.shard=7,8", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert sweep.returncode == 1 and "1 job(s) of the sweep failed: 1" in sweep.stderr
    assert "job 1 (gallery.shard=8): failed: gallery.shard=8 but gallery.size=40" in sweep.stdout
    assert results(tmp_path / "sweep")[7]["computed"] == 5


def test_bad_images_fail_naming_the_file_or_are_listed_when_skipped(case, tmp_path):
    gallery = write_gallery(tmp_path / "gallery", broken=(3,))
    broken = str(gallery / "img_003.png")
    position = plan_of(gallery).items.refs.index(broken)
    shard = position // 5
    cache, base = tmp_path / "cache", [f"gallery.shard={shard},{(shard + 1) % 8}"]
    failing = embed("-m", *args(case, cache, gallery), *base, "hydra.sweep.dir=fail", cwd=tmp_path)
    assert failing.returncode == 1, failing.stderr
    assert f"(gallery.shard={shard}): failed: gallery shard {shard}: image {position % 5} ({broken}) cannot be read" \
        in failing.stdout
    assert "1 done, 1 failed" in failing.stdout
    skipping = embed("-m", *args(case, cache, gallery), *base, "embed.on_bad_image=skip", "hydra.sweep.dir=skip",
                     cwd=tmp_path)
    assert skipping.returncode == 0, skipping.stderr
    assert "1 image(s) failed to decode and are left out of the gallery" in skipping.stdout
    assert f"oc shard {shard}: {broken}" in skipping.stdout
    record = results(tmp_path / "skip")[shard]
    assert [f["ref"] for f in record["failed_images"]] == [broken] and record["computed"] == 5


def test_a_multi_task_job_deals_every_shard_among_its_tasks(case, tmp_path):
    """gallery.shard=null in one cluster job of two tasks (submitit's tasks_per_node, one GPU each on SLURM):
    each task embeds every other shard, the first also the test split; shard.taskN.json per task."""
    cache = tmp_path / "cache"
    result = embed("-m", *args(case, cache), "gallery.shard=null", "hydra/launcher=submitit_local",
                   "hydra.launcher.tasks_per_node=2", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tasks = [json.loads((tmp_path / "sweep" / "0" / f"shard.task{rank}.json").read_text()) for rank in range(2)]
    assert [[r["shard"] for r in task["shards"]] for task in tasks] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert list(tasks[0]["test_split"]) == ["oc"] and tasks[1]["test_split"] == {}
    assert "1 done, 0 failed" in result.stdout and "8 of 8 shards in the cache" in result.stdout
    assert sorted(state(entries(case, cache))[0]) == list(range(8))
