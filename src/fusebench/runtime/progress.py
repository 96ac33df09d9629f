"""Progress bars (tqdm) that stay quiet in logs: on a terminal they refresh ten times a second; written to a
file or a pipe (a sweep's job log, a cluster's stdout), at most every ``LOG_INTERVAL`` seconds, because each
refresh is a line's worth of text that a log keeps (a 2 s job wrote hundreds of them)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm.auto import tqdm

Progress = Callable[[str, int], Callable[[int], None]]  # (description, total) -> update(n): a bar's factory
LOG_INTERVAL = 30.0  # seconds between refreshes when the bar does not go to a terminal


def _to_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def bar(*args, **kwargs) -> tqdm:
    """``tqdm(*args, **kwargs)``, refreshed at most every ``LOG_INTERVAL`` seconds unless it writes to a terminal."""
    from tqdm.auto import tqdm  # tqdm.auto brings asyncio: loaded with the first bar, not at a command's start

    if not _to_terminal(kwargs.get("file") or sys.stderr):
        kwargs.setdefault("mininterval", LOG_INTERVAL)
    return tqdm(*args, **kwargs)
