"""Weights & Biases logging (``logger=wandb``): offline by default, never a reason for a run to fail.

One W&B run per job, grouped by sweep and named by its overrides; the resolved config (models,
preprocessing, fusion, dataset, library versions, git commit) as run config; summary metrics under stable
names (``t2i/R@1``, ``i2t/R@5``, ``mean/R@1`` for the headline retriever, the fusion when there is one;
``gain/t2i/R@1`` for it over its best single model; ``retrievers/NAME/t2i/R@1`` for every retriever);
a Table of retrievers and one of comparisons; the plots as images; metrics.json and ranks/ as an artifact.
Offline runs are written under the run dir (``wandb/``); ``wandb sync`` uploads them later; reading one back
(W&B's file layout, no public API) is :mod:`fusebench.app.wandb_files`.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from fusebench import DIRECTIONS
from fusebench.config.schema import LoggerConfig, WandbConfig
from fusebench.evaluation.record import RunRecord
from fusebench.evaluation.subrecords import eval_to_json

if TYPE_CHECKING:
    from fusebench.report.sweep import SweepSummary

log = logging.getLogger(__name__)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def job_identity() -> tuple[str | None, str | None]:
    """(group, name) from Hydra: the sweep dir's name for multiruns, the job's overrides as the name."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        name = hc.job.override_dirname or "defaults"
        group = Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None
        return group, name
    except Exception:  # noqa: BLE001 - outside Hydra (tests, notebooks): no identity
        return None, None


def summary_metrics(record: RunRecord) -> dict:
    ks = record.ks
    fusions, headline = record.fusions, record.headline
    out: dict = {"headline": headline, "simulated": record.simulated,
                 "nonstandard": record.dataset.nonstandard}
    for name, result in record.retrievers.items():
        for direction in ("t2i", "i2t", "mean"):
            for k in ks:
                value = result.recall(direction, k)
                out[f"retrievers/{name}/{direction}/R@{k}"] = value
                if name == headline:
                    out[f"{direction}/R@{k}"] = value
    if fusions:
        for direction in DIRECTIONS:
            for k in ks:
                row = record.comparison(headline, record.best_single(direction, k), direction, k)
                if row:
                    out[f"gain/{direction}/R@{k}"] = row.gain
                    out[f"gain_ci_low/{direction}/R@{k}"] = row.ci_low
                    out[f"gain_ci_high/{direction}/R@{k}"] = row.ci_high
    for name, result in record.retrievers.items():  # extra positives: eccv/t2i/mAP@R, cxc/i2t/R@5, ...
        for positive_set, block in result.positives.items():
            for direction, values in block.items():
                for metric, value in values.items():
                    if metric != "n_queries":
                        out[f"retrievers/{name}/{positive_set}/{direction}/{metric}"] = value
                        if name == headline:
                            out[f"{positive_set}/{direction}/{metric}"] = value
    if record.tune:  # tune mode: what the tuning split chose, and its value there
        chosen = record.tune.chosen
        out["tune/value"] = chosen.value
        out.update({f"tune/weight/{n}": w for n, w in chosen.weights.items()})
        out.update({f"tune/{k}": v for k, v in chosen.fusion.items()})
    for c in record.positive_comparisons:
        if c.candidate == headline and c.baseline == record.best_single(c.direction, 1):
            positive_set, metric = c.metric.split(" ", 1)
            out[f"gain/{positive_set}/{c.direction}/{metric}"] = c.gain
    return out


def _tables(wandb, record: RunRecord) -> dict:
    ks = record.ks
    columns = ["retriever"] + [f"{d} R@{k}" for d in ("t2i", "i2t", "mean") for k in ks]
    rows = [[name] + [r.recall(d, k) for d in ("t2i", "i2t", "mean") for k in ks] for name, r in record.retrievers.items()]
    comp_cols = ["candidate", "baseline", "direction", "k", "gain", "ci_low", "ci_high", "cluster_ci_low",
                 "cluster_ci_high", "wins", "losses", "p_value"]
    comps = [[getattr(c, col) for col in comp_cols] for c in record.comparisons]
    tables = {"retrievers": wandb.Table(columns=columns, data=rows),
              "comparisons": wandb.Table(columns=comp_cols, data=comps)}
    if record.tune:  # the tuning split's curve: one row per setting tried
        models = list(record.tune.chosen.weights)
        params = sorted({k for point in record.tune.curve for k in point.fusion})
        tables["tune_curve"] = wandb.Table(columns=[f"weight {m}" for m in models] + params + [record.tune.criterion],
                                           data=[[point.weights[m] for m in models] + [point.fusion.get(p) for p in params]
                                                 + [point.value] for point in record.tune.curve])
    if record.positive_comparisons:
        tables["positive_comparisons"] = wandb.Table(
            columns=["metric", *comp_cols], data=[[c.metric, *(getattr(c, col) for col in comp_cols)]
                                                   for c in record.positive_comparisons])
    return tables


def _init(cfg: WandbConfig, out_dir: Path, config: dict, group: str | None, name: str | None, job_type: str):
    """Start a W&B run; an online start that fails (no network: W&B would wait 90 s) gives up after
    ``logger.init_timeout`` seconds and logs offline instead, so the record can be uploaded later."""
    import wandb

    mode = cfg.mode or os.environ.get("WANDB_MODE") or "offline"

    def start(mode: str):
        # only an online start gets the short timeout; an offline one keeps W&B's own (a busy machine is slow)
        timeout = {"init_timeout": cfg.init_timeout} if mode == "online" else {}
        return wandb.init(project=cfg.project, entity=cfg.entity, mode=mode, dir=str(out_dir), config=config,
                          group=group, name=name, job_type=job_type, tags=list(cfg.tags),
                          reinit="finish_previous", settings=wandb.Settings(silent=True, console="off",
                                                                            x_disable_stats=True, **timeout))

    if mode != "online":
        return wandb, start(mode)
    try:
        return wandb, start("online")
    except Exception as err:  # noqa: BLE001 - no network, no key, server down: keep an offline record
        reason = (str(err).strip().splitlines() or [""])[0]
        log.warning("W&B could not start online within logger.init_timeout (%s%s); logging offline under "
                    "%s/wandb instead (upload later with `wandb sync`)", type(err).__name__,
                    f": {reason}" if reason and reason != "<no message>" else "", out_dir)
        return wandb, start("offline")


def log_run(cfg: LoggerConfig | None, record: RunRecord, out_dir: str | Path, plots: list[Path],
            resolved: dict | None = None, identity: tuple[str | None, str | None] | None = None) -> None:
    """Log one finished run (``cfg``: the logger group, typed; ``resolved``: the composed config, logged as the
    W&B run's config; ``identity``: its (group, name), read from Hydra when not given); any W&B failure is a
    warning, the run dir stays the record."""
    if not isinstance(cfg, WandbConfig):  # logger=none
        return
    out_dir = Path(out_dir)
    try:
        group, name = identity if identity is not None else job_identity()
        config = {**(resolved or {}), "fusebench": {"git_commit": git_commit(), "versions": record.run.versions},
                  "dataset_summary": record.dataset.to_json(), "fusion": asdict(record.fusion),
                  "eval": eval_to_json(record.eval)}
        wandb, run = _init(cfg, out_dir, config, group, name, "evaluate")
        try:
            run.summary.update(summary_metrics(record))
            payload = _tables(wandb, record)
            payload.update({f"plots/{p.stem}": wandb.Image(str(p)) for p in plots})
            run.log(payload)
            artifact = wandb.Artifact(f"run-{run.id}", type="fusebench-run", metadata={"dataset": record.dataset.to_json()})
            artifact.add_file(str(out_dir / "metrics.json"))
            artifact.add_dir(str(out_dir / "ranks"), name="ranks")
            run.log_artifact(artifact)
        finally:
            run.finish()
    except Exception as err:  # noqa: BLE001 - W&B failing or absent never fails a run
        log.warning("W&B logging failed (%s); the run dir %s holds every result", err, out_dir)


def log_sweep(cfg: LoggerConfig | None, folder: str | Path, report: SweepSummary) -> None:
    """The sweep summary run: the sweep's tables and plots, grouped with its jobs."""
    if not isinstance(cfg, WandbConfig):
        return
    folder = Path(folder)
    try:
        wandb, run = _init(cfg, folder, {"sweep_dir": str(folder), "runs": len(report.runs),
                                         "failed": report.failed, "damaged": report.damaged}, folder.name,
                     "sweep-summary", "summary")
        try:
            payload = {}
            for key in ("article", "gains", "cost"):
                rows = getattr(report, key)
                if rows:
                    columns = list(rows[0])
                    payload[key] = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
            payload.update({f"plots/{p.stem}": wandb.Image(str(p)) for p in report.plots})
            run.log(payload)
            run.summary.update({"runs": len(report.runs), "failed_runs": len(report.failed),
                                "damaged_runs": len(report.damaged)})
        finally:
            run.finish()
    except Exception as err:  # noqa: BLE001
        log.warning("W&B sweep summary failed (%s); %s/summary.md holds the report", err, folder)

