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
    parser.add_argument("--level", type=float, default=0.95, help="interval coverage (default 0.95)")
    args = parser.parse_args(argv)
    folder = Path(args.sweep_dir)
    if not 0 < args.level < 1:
        print(f"fusebench-report: error: --level={args.level} is not valid; valid: a number in (0, 1), e.g. 0.95",
              file=sys.stderr)
        return 2
    if args.draws < 1:
        print(f"fusebench-report: error: --draws={args.draws} is not valid; valid: an integer >= 1", file=sys.stderr)
        return 2
    if not folder.is_dir():
        print(f"fusebench-report: error: {folder} is not a folder", file=sys.stderr)
        return 2
    from fusebench.report.runs import scan_runs
    from fusebench.report.sweep import write_report

    scan = scan_runs(folder)
    if not scan.runs:
        print(f"fusebench-report: error: no finished runs (a run dir with a readable metrics.json) below {folder}"
              + "".join(f"\n  {name}: {why}" for name, why in scan.failed.items()), file=sys.stderr)
        return 2
    try:
        write_report(folder, draws=args.draws, seed=args.seed, level=args.level, scan=scan)
    except OSError as err:
        print(f"fusebench-report: error: cannot write the report into {folder}: {err.strerror or err}",
              file=sys.stderr)
        return 2
    print((folder / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
