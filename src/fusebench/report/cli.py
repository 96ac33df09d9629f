"""``fusebench-report SWEEP_DIR``: write summary.md, summary.csv, gains.csv and cost.csv for run dirs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fusebench-report", description=__doc__)
    parser.add_argument("sweep_dir", help="a multirun dir, or any folder holding run dirs")
    parser.add_argument("--draws", type=int, default=2000, help="bootstrap draws per paired comparison")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = Path(args.sweep_dir)
    if not folder.is_dir():
        print(f"fusebench-report: error: {folder} is not a folder", file=sys.stderr)
        return 2
    from fusebench.report.sweep import load_runs, write_report

    runs, failed = load_runs(folder)
    if not runs:
        print(f"fusebench-report: error: no finished runs (metrics.json) below {folder}"
              + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
        return 2
    write_report(folder, draws=args.draws, seed=args.seed)
    print((folder / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
