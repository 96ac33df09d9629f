"""The ``fusebench`` command: a Hydra app over ``conf/`` (run ``fusebench --help`` for the config groups)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fusebench import FusebenchError

# conf/ lives at the repository root (install with `pip install -e .`, as the Makefile does).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    from fusebench.pipeline import run  # imported here so --help and --cfg stay fast

    try:
        run(cfg, HydraConfig.get().runtime.output_dir)
    except FusebenchError as err:
        print(f"fusebench: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
