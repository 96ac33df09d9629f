"""A sweep job's plots drawn on a second thread (report.background) while the next job runs."""

import logging
import shutil

import pytest

from fusebench.app import pipeline
from fusebench.report import background
from fusebench.report.plots import run_plots

pytestmark = pytest.mark.slow  # whole jobs: not in the fast tier

SMALL_SIM = ["dataset.n_images=200", "dataset.n_captions=900", "eval.bootstrap.draws=100"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two finished run dirs (no plots yet) and their records, as two jobs of a sweep leave them."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fusebench.config import CONFIG_DIR

    root, runs = tmp_path_factory.mktemp("runs"), []
    for method in ("rrf", "dbsf"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
            cfg = compose(config_name="config", overrides=[*SMALL_SIM, f"fusion={method}", "logger=none", "plots=false"])
        runs.append((root / method, pipeline.run(cfg, str(root / method))))
    GlobalHydra.instance().clear()
    return runs


def test_plots_drawn_in_the_background_are_the_inline_plots(two_runs, tmp_path):
    """Byte for byte the PNGs run_plots draws on the calling thread, for every queued run, all drawn by the
    time finish returns."""
    expected = {}
    for run_dir, record in two_runs:
        inline = tmp_path / f"inline_{run_dir.name}"
        shutil.copytree(run_dir, inline)
        expected[run_dir.name] = {p.name: p.read_bytes() for p in run_plots(inline, record)}
        shutil.rmtree(run_dir / "plots", ignore_errors=True)
    for run_dir, record in two_runs:
        background.draw_later(run_dir, record)
    drawn = background.finish()
    assert len(drawn) == sum(len(v) for v in expected.values()) == 10
    for run_dir, _ in two_runs:
        got = {p.name: p.read_bytes() for p in (run_dir / "plots").glob("*.png")}
        assert got == expected[run_dir.name]


def test_a_failed_plot_is_a_warning_and_the_others_are_drawn(two_runs, monkeypatch, caplog):
    from fusebench.report import plots

    draw = plots.run_plots

    def fails_for_rrf(run_dir, record):
        if run_dir.name == "rrf":
            raise RuntimeError("no fonts")
        return draw(run_dir, record)

    monkeypatch.setattr(plots, "run_plots", fails_for_rrf)
    for run_dir, record in two_runs:
        background.draw_later(run_dir, record)
    with caplog.at_level(logging.WARNING):
        drawn = background.finish()
    assert {p.parent.parent.name for p in drawn} == {"dbsf"}
    assert "could not draw plots for" in caplog.text and "rrf" in caplog.text and "no fonts" in caplog.text


def test_cancel_drops_the_plots_not_started(two_runs, monkeypatch):
    import threading

    from fusebench.report import plots

    started, release = threading.Event(), threading.Event()
    calls = []

    def slow(run_dir, record):
        calls.append(run_dir.name)
        started.set()
        release.wait(30)
        return []

    monkeypatch.setattr(plots, "run_plots", slow)
    for run_dir, record in two_runs * 2:
        background.draw_later(run_dir, record)
    started.wait(30)
    background.cancel()
    release.set()
    background._POOL.submit(lambda: None).result(30)  # the thread has finished what it was drawing
    assert calls == ["rrf"] and background.finish() == []


@pytest.mark.parametrize("logger, later", [("none", True), ("wandb", False)])
def test_a_sweep_job_hands_its_plots_over_unless_its_logger_needs_them(compose_cfg, tmp_path, monkeypatch, logger,
                                                                        later):
    """With another job to follow in this process, the plots go to the background thread; W&B logs the PNGs
    with the run, so a W&B job draws them itself first (and a single run always does)."""
    queued = []
    monkeypatch.setattr(background, "draw_later", lambda run_dir, record: queued.append(run_dir))
    cfg = compose_cfg([*SMALL_SIM, f"logger={logger}"])
    pipeline.run(cfg, str(tmp_path / "job"), next_job_follows=True)
    assert queued == ([str(tmp_path / "job")] if later else [])
    assert (tmp_path / "job" / "plots" / "recall_bars.png").is_file() != later
    pipeline.run(cfg, str(tmp_path / "alone"))
    assert len(queued) == (1 if later else 0) and (tmp_path / "alone" / "plots" / "recall_bars.png").is_file()


def test_score_distributions_of_the_same_single_models_are_drawn_once(two_runs, tmp_path, monkeypatch):
    """Jobs that differ only in fusion show the same single-model scores: the process draws that plot once and
    copies it (the same bytes as a fresh drawing); other inputs, or a PNG changed since, are drawn."""
    from dataclasses import replace

    from fusebench.report import plots

    monkeypatch.setattr(plots, "_DRAWN", {})
    drawn = []
    draw = plots._draw_score_distributions
    monkeypatch.setattr(plots, "_draw_score_distributions", lambda *args: drawn.append(1) or draw(*args))
    (rrf_dir, rrf), (dbsf_dir, dbsf) = two_runs
    assert rrf.fusion.get("ddof", 0) == dbsf.fusion.get("ddof", 0)
    first = plots.score_distributions(rrf_dir, rrf, tmp_path / "rrf.png")
    copied = plots.score_distributions(dbsf_dir, dbsf, tmp_path / "dbsf.png")
    assert len(drawn) == 1 and copied.read_bytes() == first.read_bytes()
    monkeypatch.setattr(plots, "_DRAWN", {})
    fresh = plots.score_distributions(dbsf_dir, dbsf, tmp_path / "fresh.png")
    assert len(drawn) == 2 and fresh.read_bytes() == copied.read_bytes()
    other = plots.score_distributions(dbsf_dir, replace(dbsf, fusion={**dbsf.fusion, "ddof": 1}), tmp_path / "ddof1.png")
    assert len(drawn) == 3 and other.read_bytes() != fresh.read_bytes()
    fresh.write_bytes(b"changed since")  # the PNG a copy would come from is not what was drawn: draw again
    again = plots.score_distributions(dbsf_dir, dbsf, tmp_path / "again.png")
    assert len(drawn) == 4 and again.read_bytes() == copied.read_bytes()
