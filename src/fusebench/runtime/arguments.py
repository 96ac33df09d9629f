"""argparse for fusebench's small commands, its errors one line: ``PROG: error: MESSAGE (PROG --help: usage)``,
exit 2 (argparse prints its usage block first, three lines or more, where every other mistake is one line)."""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"{self.prog}: error: {message} ({self.prog} --help shows the usage)", file=sys.stderr)
        raise SystemExit(2)
