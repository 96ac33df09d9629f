"""Ctrl-C stops fusebench even when Python drops its KeyboardInterrupt (raised inside a weakref callback)."""

import gc
import json
import os
import signal
import subprocess
import sys
import weakref

import pytest

from fusebench.app import interrupts
from fusebench.runtime import state


@pytest.fixture
def watched():
    previous, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    signal.signal(signal.SIGINT, signal.default_int_handler)
    state.start()
    interrupts.watch()
    yield
    signal.signal(signal.SIGINT, previous)
    sys.unraisablehook = hook
    state.start()


class Thing:
    pass


def _ctrl_c_inside_a_weakref_callback() -> None:
    thing = Thing()
    ref = weakref.ref(thing, lambda _ref: signal.raise_signal(signal.SIGINT))  # noqa: F841 - kept alive to fire
    del thing  # the callback runs now: the KeyboardInterrupt raised in it is dropped by Python
    gc.collect()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_a_dropped_ctrl_c_is_remembered_quietly_and_raised_by_check(watched, capsys):
    interrupts.check()  # nothing pressed: nothing raised
    _ctrl_c_inside_a_weakref_callback()  # no KeyboardInterrupt got out of there
    assert "Traceback" not in capsys.readouterr().err  # dropped quietly: the press is remembered instead
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_without_the_watch_python_drops_the_interrupt():
    """What fusebench guards against: with Python's own handler the press is lost (the code goes on)."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_inside_a_weakref_callback()  # returns normally: no KeyboardInterrupt reached this frame
    finally:
        signal.signal(signal.SIGINT, previous)
    interrupts.check()  # not watched: nothing remembered


def test_an_ignored_ctrl_c_stays_ignored():
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupts.watch()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_closed_pipe_sends_the_rest_to_dev_null():
    read, write = os.pipe()
    stream = interrupts.PipeSafe(open(write, "w", buffering=1, encoding="utf-8"))  # noqa: SIM115 - closed below
    stream.write("first\n")
    assert os.read(read, 100) == b"first\n"
    os.close(read)  # the reader is gone (`| head -1`)
    for _ in range(3):
        assert stream.write("more\n" * 10_000) == 50_000  # no BrokenPipeError
        stream.flush()
    assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))
    stream.close()


@pytest.mark.slow
def test_a_command_whose_reader_stops_finishes_its_run(tmp_path):
    env = {**os.environ, "FUSEBENCH_OUTPUT": str(tmp_path / "out"), "FUSEBENCH_VIEWS": "inline"}
    proc = subprocess.Popen([sys.executable, "-m", "fusebench.app.cli", "dataset.n_images=200",
                             "dataset.n_captions=1000", "eval.bootstrap.draws=100", "logger=none",
                             "hydra.run.dir=run"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # `fusebench ... | head -1`
    stderr = proc.communicate(timeout=300)[1].decode()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "Logging error" not in stderr, stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())  # the run finished and was written
    assert (tmp_path / "run" / "plots").is_dir()
