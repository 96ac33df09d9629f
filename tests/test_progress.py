"""Progress bars refresh ten times a second on a terminal and at most every LOG_INTERVAL seconds in a log."""

import io

import tqdm.std

from fusebench.runtime import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _refreshes(stream, monkeypatch, clock_step: float) -> int:
    now = [0.0]

    def clock() -> float:
        now[0] += clock_step
        return now[0]

    monkeypatch.setattr(tqdm.std, "time", clock)  # tqdm's clock
    bar = progress.bar(total=200, desc="lists", file=stream, miniters=1)
    for _ in range(200):
        bar.update(1)
    bar.close()
    return stream.getvalue().count("\r")


def test_a_log_gets_a_refresh_per_log_interval_and_a_terminal_ten_a_second(monkeypatch):
    step = 0.5  # seconds per update: 100 s of work
    logged = _refreshes(io.StringIO(), monkeypatch, step)
    shown = _refreshes(Terminal(), monkeypatch, step)
    assert logged <= 2 + 200 * step / progress.LOG_INTERVAL  # ~ one per 30 s, plus the first and the last
    assert shown >= 150  # a terminal sees (almost) every update at this pace


def test_a_stream_without_isatty_counts_as_a_log():
    assert not progress._to_terminal(object()) and not progress._to_terminal(io.StringIO())
    assert progress._to_terminal(Terminal())
