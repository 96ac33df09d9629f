"""Starting is fast: the commands that run no job, and every config mistake, import no heavy library.

Structural checks in a fresh interpreter (which modules ``sys.modules`` holds afterwards), not timings:
``scripts/bench_start.py`` times the commands themselves (target: under 1.0 s each on a 2-core CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# every test starts a fresh interpreter (the fast tier keeps test_api's test_the_api_is_imported_on_first_use)
pytestmark = pytest.mark.slow

# imported only by the code that needs them: a job (torch, numba, scipy), plots, real models, W&B, notebooks
HEAVY = ("torch", "numba", "llvmlite", "scipy", "matplotlib", "transformers", "open_clip", "wandb", "pandas", "sklearn",
         "skimage")


def loaded_after(code: str, tmp_path) -> dict:
    """Run ``code`` in a fresh interpreter (outputs under ``tmp_path``); its last line is JSON it printed, to
    which this adds ``heavy``: the heavy libraries imported by then."""
    script = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        result["heavy"] = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
        print(json.dumps(result))
    """)
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_commands_and_composing_configs_imports_nothing_heavy(tmp_path):
    result = loaded_after("""
        import fusebench.app.cli, fusebench.app.cache_cli, fusebench.app.callback, fusebench.report.cli
        import hydra_plugins.fusebench_sweeper.sweeper
        import fusebench.config as config
        from fusebench.app.run_config import run_config
        from hydra import compose, initialize_config_dir

        result = {"composed": 0}
        with initialize_config_dir(version_base="1.3", config_dir=config.CONFIG_DIR):
            for overrides in ([], ["experiment=fusion_ablation"], ["experiment=article_coco"],
                              ["dataset=tiny", "fusion=qdrant_rrf", "tune=weights", "logger=none"]):
                cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
                result["composed"] += 1
            run_config(compose(config_name="config"))  # the typed config the CLI converts before a job starts
    """, tmp_path)
    assert result["composed"] == 4
    assert result["heavy"] == []


def test_commands_that_run_no_job_and_config_mistakes_import_nothing_heavy(tmp_path):
    """``fusebench --help``, ``--cfg job``, an unknown option, a value of the wrong type or out of range,
    ``fusebench-models``, ``fusebench-cache list`` and ``fusebench-report --help``, in one interpreter."""
    result = loaded_after("""
        import contextlib, io, os, sys
        from hydra.core.global_hydra import GlobalHydra
        from fusebench.app import cache_cli, cli
        from fusebench.report import cli as report_cli

        def run(name, entry, argv):
            sys.argv = [name, *argv]
            os.environ.pop("HYDRA_FULL_ERROR", None)  # main sets it for Hydra: each command starts as a user's would
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = entry()
                except SystemExit as end:
                    code = end.code
            GlobalHydra.instance().clear()
            return [code or 0, out.getvalue(), err.getvalue()]

        result = {
            "help": run("fusebench", cli.main, ["--help"]),
            "cfg": run("fusebench", cli.main, ["--cfg", "job"]),
            "unknown": run("fusebench", cli.main, ["fusion=nosuch"]),
            "type": run("fusebench", cli.main, ["eval.bootstrap.draws=abc"]),
            "range": run("fusebench", cli.main, ["fusion.top_k=0"]),
            "models": run("fusebench-models", lambda: cli.list_models([]), []),
            "cache": run("fusebench-cache", lambda: cache_cli.main(["list"]), []),
            "report": run("fusebench-report", lambda: report_cli.main(["--help"]), []),
        }
    """, tmp_path)
    assert result["heavy"] == []
    assert result["help"][0] == 0 and "fusion: " in result["help"][1] and "models: " in result["help"][1]
    assert result["cfg"][0] == 0 and "fusion:" in result["cfg"][1]
    for mistake in ("unknown", "type", "range"):
        code, _, err = result[mistake]
        assert code == 2 and err.startswith("fusebench: error: ") and err.count("\n") == 1, (mistake, err)
    assert "fusion=nosuch is not an option" in result["unknown"][2]
    assert result["models"][0] == 0 and "sim_siglip2_like" in result["models"][1]
    assert result["cache"][0] == 0 and "no cache entries" in result["cache"][1]
    assert result["report"][0] == 0 and "usage: fusebench-report" in result["report"][1]


def test_console_scripts_start_without_heavy_imports(tmp_path):
    """The installed console scripts themselves (what a user types), each a fresh process."""
    bin_dir = os.path.dirname(sys.executable)
    for argv in (["fusebench", "--help"], ["fusebench", "fusion=nosuch"], ["fusebench-models"]):
        script = os.path.join(bin_dir, argv[0])
        if not os.path.exists(script):
            pytest.skip(f"{argv[0]} is not installed beside this Python (pip install -e .)")
        code = (f"import runpy, sys; sys.argv = {argv!r}\n"
                f"try:\n    runpy.run_path({script!r}, run_name='__main__')\nexcept SystemExit as end:\n    code = end.code\n"
                "result = {'code': code or 0}\n")
        result = loaded_after(code, tmp_path)
        assert result["heavy"] == [], argv
        assert result["code"] == (2 if "fusion=nosuch" in argv else 0), argv


def test_help_loads_no_numpy_nor_tqdm(tmp_path):
    """``fusebench --help`` (Hydra importing the callback and every plugin, the config's registries scanned) loads
    neither numpy nor tqdm, as before issue 40 moved the imports to the modules' tops (tests/test_imports.py
    counts both as heavy for what a command's start loads)."""
    result = loaded_after("""
        import contextlib, io, sys
        from fusebench.app import cli

        sys.argv = ["fusebench", "--help"]
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                cli.main()
            except SystemExit:
                pass
        result = {"light": sorted({m.split(".")[0] for m in sys.modules} & {"numpy", "tqdm", "asyncio"})}
    """, tmp_path)
    assert result["light"] == []
