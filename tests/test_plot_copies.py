"""A plot the process already drew from the same inputs is copied, not drawn again (report.plots.drawn_once)."""

import pytest

from fusebench.app import pipeline
from fusebench.fusion.config import flat_settings
from fusebench.runtime import state

pytestmark = pytest.mark.slow  # whole jobs: not in the fast tier

SMALL_SIM = ["dataset.n_images=200", "dataset.n_captions=900", "eval.bootstrap.draws=100"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two finished run dirs (no plots yet) and their records, as two jobs of a sweep leave them."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fusebench.config import CONFIG_DIR, schema

    schema.register()  # as the CLI does: the groups' schemas the YAML options start from
    root, runs = tmp_path_factory.mktemp("runs"), []
    for method in ("rrf", "dbsf"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
            cfg = compose(config_name="config", overrides=[*SMALL_SIM, f"fusion={method}", "logger=none", "plots=false"])
        runs.append((root / method, pipeline.run(cfg, str(root / method))))
    GlobalHydra.instance().clear()
    return runs


def test_score_distributions_of_the_same_single_models_are_drawn_once(two_runs, tmp_path, monkeypatch):
    """Jobs that differ only in fusion show the same single-model scores: the process draws that plot once and
    copies it (the same bytes as a fresh drawing); other inputs, or a PNG changed since, are drawn."""
    from dataclasses import replace

    from fusebench.report.plots import score_distributions as plots

    state.start()
    drawn = []
    draw = plots._draw_scores
    monkeypatch.setattr(plots, "_draw_scores", lambda *args: drawn.append(1) or draw(*args))
    (rrf_dir, rrf), (dbsf_dir, dbsf) = two_runs
    assert flat_settings(rrf.fusion)["ddof"] == dbsf.fusion.params["ddof"]
    first = plots.score_distributions(rrf_dir, rrf, tmp_path / "rrf.png")
    copied = plots.score_distributions(dbsf_dir, dbsf, tmp_path / "dbsf.png")
    assert len(drawn) == 1 and copied.read_bytes() == first.read_bytes()
    state.start()  # a new process: drawn afresh
    fresh = plots.score_distributions(dbsf_dir, dbsf, tmp_path / "fresh.png")
    assert len(drawn) == 2 and fresh.read_bytes() == copied.read_bytes()
    other = plots.score_distributions(dbsf_dir, replace(dbsf, fusion=replace(dbsf.fusion, params={"ddof": 1})), tmp_path / "ddof1.png")
    assert len(drawn) == 3 and other.read_bytes() != fresh.read_bytes()
    fresh.write_bytes(b"changed since")  # the PNG a copy would come from is not what was drawn: draw again
    again = plots.score_distributions(dbsf_dir, dbsf, tmp_path / "again.png")
    assert len(drawn) == 4 and again.read_bytes() == copied.read_bytes()
