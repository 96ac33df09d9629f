"""The ``fusebench`` command: a Hydra app over ``conf/`` (run ``fusebench --help`` for the config groups)."""

from __future__ import annotations

import sys
from pathlib import Path

import traceback

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fusebench import FusebenchError

# conf/ lives at the repository root (install with `pip install -e .`, as the Makefile does).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def registry() -> list[str]:
    """The model configs in conf/models/, by name."""
    return sorted(p.stem for p in (Path(CONFIG_DIR) / "models").glob("*.yaml"))


def unknown_models(argv: list[str]) -> list[str]:
    """Names in ``models=...`` overrides (lists and sweeps too) that have no conf/models/NAME.yaml."""
    names = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+~") == "models":
            names += [n.strip() for n in value.replace("[", ",").replace("]", ",").split(",") if n.strip()]
    known = set(registry())
    return [n for n in names if n not in known]


def main() -> None:
    """Console entry: check model names against the registry, then run the Hydra app."""
    missing = unknown_models(sys.argv[1:])
    if missing:
        print(f"fusebench: error: unknown model(s) {', '.join(missing)}. The registry (conf/models/) has: "
              f"{', '.join(registry())}. Add a YAML file there, or describe a model inline with "
              "+models.NAME.kind=... overrides.", file=sys.stderr)
        raise SystemExit(2)
    app()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    from fusebench.pipeline import run  # imported here so --help and --cfg stay fast

    hydra_cfg = HydraConfig.get()
    out_dir = hydra_cfg.runtime.output_dir
    if hydra_cfg.mode == RunMode.MULTIRUN:  # one failed job must not stop the others
        try:
            run(cfg, out_dir)
        except Exception as err:  # noqa: BLE001 - recorded in the job dir and the sweep report
            Path(out_dir, "error.txt").write_text("".join(traceback.format_exception(err)), encoding="utf-8")
            print(f"fusebench: job {hydra_cfg.job.num} failed: {err} (see {out_dir}/error.txt)", file=sys.stderr)
        return
    try:
        run(cfg, out_dir)
    except FusebenchError as err:
        print(f"fusebench: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
