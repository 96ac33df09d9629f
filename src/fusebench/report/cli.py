"""``fusebench-report DIR``: write summary.md, summary.csv, gains.csv, cost.csv and the plots for the run dirs below
DIR, into DIR (or ``--out``), with report.sha256 recording them (``fusebench.report.report_files``). A file there
that fusebench did not write is never replaced: exit 2, one line naming it."""

from __future__ import annotations

import sys
from pathlib import Path

from fusebench import FusebenchError
from fusebench.config.schema import check_draws
from fusebench.report.report_files import ReportBlocked, check
from fusebench.report.runs import scan_runs
from fusebench.runtime import run_lock
from fusebench.runtime.arguments import OneLineParser


def _error(message: str) -> int:
    print(f"fusebench-report: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The command; Ctrl-C is one line and exit 130 (a report is drawn into staging and moved into place at the
    end; an interrupted one is run again)."""
    try:
        return _report(argv)
    except KeyboardInterrupt:
        print("\nfusebench-report: interrupted; run it again for a whole report (a file fusebench did not write is "
              "never touched)", file=sys.stderr)
        return 130


def _report(argv: list[str] | None) -> int:
    parser = OneLineParser(prog="fusebench-report", description=__doc__)
    parser.add_argument("sweep_dir", help="a multirun dir, or any folder holding run dirs (a run dir too)")
    parser.add_argument("--out", default=None,
                        help="the folder to write the report into (default: the sweep dir itself); created if missing")
    parser.add_argument("--draws", type=int, default=2000, help="bootstrap draws per paired comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=float, default=0.95, help="interval coverage (default 0.95)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.strip():  # an unset shell variable: not the current folder
        return _error(f"SWEEP_DIR is empty ({args.sweep_dir!r}; an unset shell variable?): give the folder of run "
                      "dirs, e.g. fusebench-report outputs/multirun/DATE/TIME (the current folder: .)")
    if args.out is not None and not args.out.strip():
        return _error(f"--out is empty ({args.out!r}; an unset shell variable?): give the folder to write the report "
                      "into, or leave --out out to write it into SWEEP_DIR")
    folder = Path(args.sweep_dir)
    out = folder if args.out is None else Path(args.out)
    if not 0 < args.level < 1:
        return _error(f"--level={args.level} is not valid; valid: a number in (0, 1), e.g. 0.95")

    try:
        check_draws(args.draws, "--draws")
    except FusebenchError as err:
        return _error(str(err))
    if not folder.is_dir():
        return _error(f"{folder} is not a folder")
    if out.exists() and not out.is_dir():
        return _error(f"--out {out} is not a folder")

    try:  # a run dir's report: not while a run writes there (its outputs would swap in beside this report)
        taken = (out / run_lock.LOCK_NAME).is_file() and run_lock.hold(out, "--out", what="report folder")
    except FusebenchError as err:
        return _error(str(err))
    try:
        return _write(folder, out, args)
    finally:
        if taken:
            run_lock.release(out)


def _write(folder: Path, out: Path, args) -> int:
    """Scan the runs below ``folder`` and write their report into ``out``; the command's exit code."""
    from fusebench.report.sweep import write_report  # lazy: heavy (scipy)

    try:
        check(out)  # before the work: a file in the way is one line, not minutes later
    except ReportBlocked as err:
        return _error(f"{err}: move it away, or write the report into another folder with --out FOLDER")
    scan = scan_runs(folder)
    if scan.newer:  # a report without them would leave out runs only because this fusebench is older
        more = f" (and {len(scan.newer) - 1} more)" if len(scan.newer) > 1 else ""
        return _error(f"{scan.newer[0]}{more}")
    if not scan.runs:
        shown = [f"{name}: {why}" for name, why in list(scan.failed.items())[:3]]
        more = f"; and {len(scan.failed) - 3} more" if len(scan.failed) > 3 else ""
        return _error(f"no finished runs (a run dir with a readable metrics.json) below {folder}"
                      + (f"; {len(scan.failed)} not reported ({'; '.join(shown)}{more})" if shown else ""))
    try:
        write_report(folder, draws=args.draws, seed=args.seed, level=args.level, scan=scan, out=out)
    except ReportBlocked as err:  # appeared while the report was drawn
        return _error(f"{err}: move it away, or write the report into another folder with --out FOLDER")
    except OSError as err:
        return _error(f"cannot write the report into {out}: {err.strerror or err}")
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
