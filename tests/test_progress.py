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


def test_a_sweep_line_names_the_job_and_estimates_the_rest_from_finished_jobs():
    assert progress.sweep_line(1, 21, ["gallery.size=1000000", "search=exact"], 3.4, []) == (
        "job 1/21 (gallery.size=1000000 search=exact), 3s elapsed, time left for the sweep unknown until a job "
        "finishes")
    # two jobs took 100 s and 200 s: 150 s each on average, for jobs 3..7 (this one included): 750 s
    assert progress.sweep_line(3, 7, ["search=faiss_hnsw"], 300.0, [100.0, 200.0]) == (
        "job 3/7 (search=faiss_hnsw), 5m00s elapsed, about 12m30s left for the sweep")
    assert progress.sweep_line(7, 7, [], 3900.0, [650.0] * 6).endswith(
        "(no overrides), 1h05m elapsed, about 10m50s left for the sweep")


def test_durations_read_as_a_wait():
    assert [progress.duration(s) for s in (0, 0.4, 59.4, 60, 3599, 3600, 7322, -1)] == [
        "0s", "0s", "59s", "1m00s", "59m59s", "1h00m", "2h02m", "0s"]


def test_tqdms_own_switch_turns_progress_off(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert progress.enabled()
    monkeypatch.setenv("TQDM_DISABLE", "")
    assert progress.enabled()
    for value in ("1", "0", "true"):  # tqdm turns its bars off for any value but empty: so does the sweep's line
        monkeypatch.setenv("TQDM_DISABLE", value)
        assert not progress.enabled()
