"""The ``fusebench-embed`` command: embedding only (no evaluation), over the same config tree as ``fusebench``.

    fusebench-embed dataset=coco5k gallery=folder gallery.source=/data/web gallery.size=1000000 gallery.shard=3
        one shard of the gallery's distractors (gallery.shard_size images), for every real model of the run
    fusebench-embed ... gallery.shard=null
        every shard the gallery needs, and the test split's images and captions (the normal cache entries)
    fusebench-embed -m ... 'gallery.shard=range(0,100)' hydra/launcher=submitit_slurm | submitit_local | joblib
        one job per shard, run by a Hydra launcher (SLURM array jobs, local processes)

Each shard is one content-addressed cache entry (``fusebench.encoders.shards``): a finished shard is skipped, a
killed one resumes from its saved chunks, two jobs of one shard compute it once. Each job logs, per model, the
shards already in the cache with an ETA for the rest, shows a progress bar per shard (images/s), and writes
``shard.json`` in its job dir (``shard.taskN.json`` per task of a multi-task cluster job, which deals the shards
among its tasks). At the end of a multirun, :func:`sweep_summary` prints and writes (``shards.md``, ``shards.json``
in the sweep dir) the jobs done, the failed ones with their error (a killed job: no result), and the images that
failed to decode, by file. Models of kind sim and vectors have nothing to embed; a run of only those says so and
ends with 0. Exit codes as ``fusebench``'s (``fusebench.app.cli``); a launcher that lost a job's process ends with 1
after the summary.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import DictConfig

from fusebench.app.callback import SweepReport
from fusebench.app.cli import CONFIG_DIR, run_command, run_job, user_error_message
from fusebench.app.rundir import check_writable
from fusebench.config.gallery import FILE_KINDS
from fusebench.config.specs import RealModel
from fusebench.data import load_corpus
from fusebench.data.distractor_sources import distractor_items
from fusebench.runtime import run_lock
from fusebench.runtime.layout import is_error_file
from fusebench.stores.files import atomic_write_text

log = logging.getLogger(__name__)
SUMMARY_FILES = ("shards.md", "shards.json")  # what a multirun's summary writes into its sweep dir


def record_name(rank: int, tasks: int) -> str:
    return "shard.json" if tasks == 1 else f"shard.task{rank}.json"


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress_line(model: str, done: list[int], total: int, seconds: float, images: int, remaining: int) -> str:
    """Overall progress at a job's start: shards in the cache, and an ETA for the rest from their recorded time."""
    line = f"{model}: {len(done)} of {total} shards in the cache"
    if len(done) == total:
        return line + " (all done)"
    if seconds > 0 and images:
        rate = images / seconds
        line += (f"; the {total - len(done)} left ({remaining:,} images) take about {duration(remaining / rate)} "
                 f"of one job's time at {rate:.1f} images/s (the finished shards' rate)")
    return line


@dataclass
class JobRecord:
    """What one embed job (or task) did: shard.json in its job dir, rewritten after each shard."""

    path: Path
    shard: int | None
    task: list[int]
    gallery: dict = field(default_factory=dict)
    status: str = "running"  # running | done | failed | interrupted | nothing
    n_shards: int = 0
    shards: list[dict] = field(default_factory=list)  # ShardResult.to_json(), one per (shard, model)
    cache: dict = field(default_factory=dict)  # model -> {"done": [shards complete in the cache at the end], "total"}
    test_split: dict = field(default_factory=dict)  # model -> its image and text entries (gallery.shard=null)
    note: str | None = None
    error: str | None = None
    started: float = field(default_factory=time.time)

    def write(self, **changes) -> None:
        for name, value in changes.items():
            setattr(self, name, value)
        data = {name: value for name, value in vars(self).items() if name != "path"}
        data["seconds"] = round(time.time() - self.started, 3)
        atomic_write_text(self.path, json.dumps(data, indent=2))


def nothing_to_embed(config, real: dict) -> str | None:
    """Why this job has nothing to embed (no real model; simulated data; distractors with no images), or None."""
    others = ", ".join(f"{name} ({spec.kind})" for name, spec in config.models.items() if name not in real)
    if not real:
        return f"the models {others} bring their own rows (sim: simulated, vectors: given); no model runs here"
    if config.dataset.kind == "sim":
        return "dataset=sim is simulated: real models run as their sim stand-ins, and nothing is embedded"
    return None


def embed_job(config, out_dir: str, key: str) -> None:
    """The ``fusebench-embed`` job: the shards of ``gallery.shard`` (null: every shard, and the test split) for
    every real model, recorded in the job dir."""
    from fusebench.encoders.shards import check_shard  # lazy: heavy (torch, numba, PIL)

    gallery = config.gallery
    check_writable(out_dir, key)
    real = {name: spec for name, spec in config.models.items() if isinstance(spec, RealModel)}
    rank, tasks = run_lock.task_share()
    record = JobRecord(Path(out_dir) / record_name(rank, tasks), gallery.shard, [rank, tasks],
                       {"kind": gallery.kind, "source": gallery.source, "size": gallery.size,
                        "shard_size": gallery.shard_size, "seed": gallery.seed})
    try:
        record.write()
        if gallery.kind in FILE_KINDS:
            check_shard(gallery)  # before any work: an index past the gallery's shards is a user's mistake
        reason = nothing_to_embed(config, real)
        if reason:
            record.write(status="nothing", note=reason)
            print(f"fusebench-embed: nothing to embed: {reason}.")
            return
        _embed(config, real, record, rank, tasks)
    except BaseException as err:
        try:
            record.write(status="interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
                         error=user_error_message(err) or f"{type(err).__name__}: {err}")
        except OSError:  # the job dir cannot be written: the error itself is what the user must see
            pass
        raise
    record.write(status="done")
    print(job_line(record))


def _embed(config, real: dict, record: JobRecord, rank: int, tasks: int) -> None:
    from fusebench.encoders.real import embed_real, real_run  # lazy: heavy (torch, numba, PIL)
    from fusebench.encoders.shards import ShardPlan, cache_progress, embed_shard  # lazy: heavy (torch, numba, PIL)

    gallery = config.gallery
    check_writable(config.embed.cache.dir, "embed.cache.dir")
    corpus = load_corpus(config.dataset)
    plan = None
    if gallery.kind in FILE_KINDS and gallery.active:
        plan = ShardPlan(distractor_items(gallery, corpus.image_ids), gallery.shard_size)
        record.write(n_shards=plan.n_shards)
    shards = ([gallery.shard] if gallery.shard is not None else list(range(plan.n_shards)) if plan else [])[rank::tasks]
    for name, spec in real.items():
        run = real_run(spec, config.embed)
        if plan is not None:
            done, seconds, images = cache_progress(run, plan)
            remaining = sum(len(plan.part(i)) for i in range(plan.n_shards) if i not in done)
            log.info("%s", progress_line(name, done, plan.n_shards, seconds, images, remaining))
        for index in shards:
            result, _ = embed_shard(run, plan, index)
            record.shards.append(result.to_json())
            record.write()
            print(shard_line(result.to_json(), plan.n_shards), flush=True)
        if plan is not None:
            record.cache[name] = {"done": cache_progress(run, plan)[0], "total": plan.n_shards}
        if gallery.shard is None and rank == 0:  # the test split, through the cache entries a run reads
            raw = embed_real(spec, corpus, config.embed, run)
            record.test_split[name] = {"images": corpus.n_images, "captions": corpus.n_captions,
                                       "skipped_images": raw.info["skipped_images"], **raw.info["cache"]}
        record.write()


def shard_line(result: dict, n_shards: int) -> str:
    """One shard's line: what the job did, how fast, which images it could not read."""
    if result["hit"]:
        how = "already in the cache"
    else:
        resumed = result["images"] - result["computed"]
        how = f"embedded {result['computed']:,}" + (f" (resumed: {resumed:,} from saved chunks)" if resumed else "")
    rate = f", {result['images_per_s']:.1f} images/s on {result['device']}" if result["images_per_s"] else ""
    failed = result["failed_images"]
    bad = f"; {len(failed)} failed to decode: {', '.join(f['ref'] for f in failed[:3])}" if failed else ""
    if len(failed) > 3:
        bad += ", ..."
    return (f"{result['model']} shard {result['shard']} of 0..{n_shards - 1}: {result['images']:,} images, {how}"
            f"{rate}{bad}; key {result['key'][:12]}")


def job_line(record: JobRecord) -> str:
    """The line that ends a job: its shards, images embedded and left out, each model's shards in the cache."""
    results = record.shards
    parts = [f"{len(results)} shard result(s)" if record.shard is None else f"shard {record.shard}",
             f"{sum(r['computed'] for r in results):,} images embedded here",
             f"{sum(len(r['failed_images']) for r in results)} failed to decode"]
    parts += [f"{model}: {len(cache['done'])} of {cache['total']} shards in the cache"
              for model, cache in record.cache.items()]
    parts += [f"{model}: test split in the cache" for model in record.test_split]
    return f"fusebench-embed: done: {'; '.join(parts)} ({record.path})"


def _job_records(folder: Path) -> list[tuple[str, list[dict], list[str]]]:
    """(job dir name, its records, its overrides) for each job dir of a sweep (a folder with Hydra's files or
    a record), in job order."""
    import yaml

    jobs = []
    for job in sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")),
                      key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name)):
        records = []
        for path in sorted(job.glob("shard*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                record = None
            records.append(record if _is_record(record) else
                           {"status": "failed", "error": f"{path.name} is not a record fusebench-embed wrote"})
        try:
            overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text(encoding="utf-8")) or []
        except (OSError, yaml.YAMLError):
            overrides = []
        if records or (job / ".hydra").is_dir():
            jobs.append((job.name, records, [str(o) for o in overrides]))
    return jobs


RESULT_KEYS = {"shard": int, "model": str, "key": str, "images": int, "computed": int, "failed_images": list}


def _is_record(record) -> bool:
    """Whether ``record`` (a shard.json's content) has what the summary reads, of the right types."""
    try:
        return (isinstance(record.get("status"), str)
                and all(isinstance(r[k], t) for r in record["shards"] for k, t in RESULT_KEYS.items())
                and all(isinstance(f["ref"], str) for r in record["shards"] for f in r["failed_images"])
                and all(isinstance(c["total"], int) and all(isinstance(i, int) for i in c["done"])
                        for c in record["cache"].values()))
    except (AttributeError, KeyError, TypeError):
        return False


def _error_file_line(error_file: Path) -> str | None:
    """What a failed job's error.txt says, in one line: a user's mistake as written, a bug's exception line."""

    try:
        if not error_file.is_file() or not is_error_file(error_file):
            return None
        lines = [line for line in error_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    first = lines[0].removeprefix("fusebench: error: ") if lines else ""
    return first if not first.startswith("Traceback") else lines[-1]


def _job_problem(records: list[dict], error_file: Path) -> str | None:
    """Why a job did not finish (its records, else its error.txt; neither: it was killed), or None when it did."""
    error = _error_file_line(error_file)
    for record in records:
        if record.get("status") in ("failed", "interrupted"):
            return f"{record['status']}: {record.get('error') or error}"
    if error:
        return f"failed: {error}"
    tasks = max((r.get("task", [0, 1])[1] for r in records), default=1)
    if len(records) < tasks or any(r.get("status") == "running" for r in records):
        return ("no result: the job was killed (out of memory, a time limit, a signal) or is still running; rerun "
                "the same command: finished shards are skipped, a killed one resumes from its saved chunks")
    return None


def spans(indices) -> str:
    """Shard indices as ranges: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out, run = [], []
    for i in sorted(indices):
        if run and i != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(i)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _models(jobs: list[tuple[str, list[dict], list[str]]]) -> dict[str, dict]:
    """Per model, over every record: the shards done by the sweep, images embedded, the shards found in the
    cache when a job ended (their union), and the images that failed to decode (shard, ref)."""
    models: dict[str, dict] = {}

    def model(name: str) -> dict:
        return models.setdefault(name, {"shards": set(), "computed": 0, "cache": set(), "total": None, "failed": set()})

    for _, records, _ in jobs:
        for record in records:
            for result in record.get("shards", []):
                info = model(result["model"])
                info["shards"].add(result["shard"])
                info["computed"] += result["computed"]
                info["failed"] |= {(result["shard"], f["ref"]) for f in result["failed_images"]}
            for name, cache in record.get("cache", {}).items():
                info = model(name)
                info["cache"] |= set(cache["done"])
                info["total"] = cache["total"]
    return models


def sweep_summary(folder: Path) -> list[str]:
    """The end of an embed multirun: print and write (``SUMMARY_FILES``) the jobs done and failed (with the
    error; a killed job has no result), each model's shards in the cache and those missing, and the images that
    failed to decode, by file. Returns the failed job dirs. Each job is judged on its own files: one job's damage
    never hides another's result."""

    jobs = _job_records(Path(folder))
    failed, lines = [], []
    for name, records, overrides in jobs:
        shard = next((o for o in overrides if o.startswith("gallery.shard=")), None)
        problem = _job_problem(records, Path(folder, name, "error.txt"))
        if problem:
            failed.append(name)
            lines.append(f"  job {name}{f' ({shard})' if shard else ''}: {problem}")
    models = _models(jobs)
    text = [f"fusebench-embed: {len(jobs)} job(s) in {folder}: {len(jobs) - len(failed)} done, {len(failed)} failed"]
    for model, info in models.items():
        line = f"  {model}: {len(info['shards'])} shard(s) done by this sweep, {info['computed']:,} images embedded"
        if info["total"] is not None:
            missing = sorted(set(range(info["total"])) - info["cache"])
            line += (f"; {info['total'] - len(missing)} of {info['total']} shards in the cache"
                     + (f", not yet: {spans(missing)} (rerun: done shards are skipped)" if missing else ""))
        text.append(line)
    text += lines
    decode = sorted((model, shard, ref) for model, info in models.items() for shard, ref in info["failed"])
    if decode:
        text.append(f"  {len(decode)} image(s) failed to decode and are left out of the gallery "
                    "(embed.on_bad_image=skip):")
        text += [f"    {model} shard {shard}: {ref}" for model, shard, ref in decode]
    print("\n".join(text))
    data = {"jobs": len(jobs), "failed": failed, "problems": lines, "failed_images": [list(d) for d in decode],
            "models": {m: {"shards_done": sorted(i["shards"]), "in_cache": sorted(i["cache"]), "total": i["total"],
                           "computed": i["computed"]} for m, i in models.items()}}
    try:
        atomic_write_text(Path(folder, SUMMARY_FILES[0]), "\n".join(text) + "\n")
        atomic_write_text(Path(folder, SUMMARY_FILES[1]), json.dumps(data, indent=2))
    except OSError as err:  # printed already: a sweep dir that cannot be written loses nothing else
        log.error("could not write the shard summary into %s: %s", folder, err)
    return failed


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def embed_app(cfg: DictConfig) -> None:
    run_job(cfg, embed_job)


def main() -> None:
    """Console entry (``fusebench-embed``): ``fusebench``'s checks and exit codes around the embed jobs."""

    try:
        run_command(embed_app, kind="embed",
                    interrupted="finished shards are in the cache; rerun the same command to resume",
                    failed_note=f"{SUMMARY_FILES[0]} in the sweep dir says why")
    except Exception as err:  # a launcher that lost a job's process (SIGKILL, out of memory, a node gone)
        folder = SweepReport.sweep_dir
        if folder is None or not folder.is_dir():
            raise
        failed = sweep_summary(folder)
        why = " ".join(str(err).split())[:300]
        unfinished = f"job(s) {', '.join(failed)} did not finish and later ones" if failed else "some jobs"
        print(f"fusebench: error: the launcher stopped ({type(err).__name__}: {why}); {unfinished} may not have "
              "started. The shards in the cache are kept: rerun the same command (done shards are skipped, a killed "
              "one resumes).", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
