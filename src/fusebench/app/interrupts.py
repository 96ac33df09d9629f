"""Ctrl-C that always stops fusebench, even when Python drops the KeyboardInterrupt it raised.

Python raises KeyboardInterrupt wherever the main thread happens to be when the signal arrives. If that is
inside a weakref callback, a ``__del__`` or a garbage-collector callback (torch and numpy run some), the
exception is "ignored": printed with a traceback and dropped, and the run goes on (a sweep then finished and
exited 0). So the handler also remembers the press: ``check()`` raises it again
at the points where a run may stop (each sweep job's start, before a run writes its outputs, and at exit),
and a KeyboardInterrupt that Python would drop is dropped silently (the remembered press stands for it). The
press is remembered in the process state (``runtime.state``).
"""

from __future__ import annotations

import signal
import sys

from fusebench.runtime import state


def _on_ctrl_c(signum, frame) -> None:
    state.current().ctrl_c = True
    raise KeyboardInterrupt


def watch() -> None:
    """Remember every Ctrl-C from now on (main thread, when Ctrl-C has Python's default action: a process
    started with SIGINT ignored, as a shell's background job, keeps ignoring it)."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    previous = sys.unraisablehook

    def quiet_dropped_interrupt(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and state.current().ctrl_c:
            return  # remembered: check() raises it where the run can stop
        previous(unraisable)

    signal.signal(signal.SIGINT, _on_ctrl_c)
    sys.unraisablehook = quiet_dropped_interrupt


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed (and its exception may have been dropped)."""
    if state.current().ctrl_c:
        raise KeyboardInterrupt
