"""Ctrl-C stops fusebench even when Python drops its KeyboardInterrupt (raised inside a weakref callback)."""

import gc
import signal
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
