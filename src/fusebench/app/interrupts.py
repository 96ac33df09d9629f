"""Ctrl-C that always stops fusebench, even when Python drops the KeyboardInterrupt it raised.

Python raises KeyboardInterrupt wherever the main thread happens to be when the signal arrives. If that is
inside a weakref callback, a ``__del__`` or a garbage-collector callback (torch and numpy run some), the
exception is "ignored": printed with a traceback and dropped, and the run goes on (a sweep then finished and
exited 0). So the handler also remembers the press: ``check()`` raises it again
at the points where a run may stop (each sweep job's start, before a run writes its outputs, and at exit),
and a KeyboardInterrupt that Python would drop is dropped silently (the remembered press stands for it). The
press is remembered in the process state (``runtime.state``).

A reader that stops reading (``fusebench ... | head -1``) is the other way a command's user cuts it short: from then
on what the command prints goes nowhere (:class:`PipeSafe`), and its runs finish and are written as they would have
been, instead of a BrokenPipeError's traceback halfway through a run's outputs.
"""

from __future__ import annotations

import os
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


class PipeSafe:
    """A text stream (``sys.stdout``) that, once its reader has closed the pipe, sends the rest to /dev/null: the
    file descriptor is pointed there (``os.dup2``), so the stream's buffer, logging's handlers holding it and a
    child's inherited stdout all keep working."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_null()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_null()
            self._stream.flush()  # the buffer's bytes now go to /dev/null

    def _to_null(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self._stream.fileno())
        finally:
            os.close(null)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_stdout() -> None:
    """``sys.stdout`` as a :class:`PipeSafe` (once: a stream that has no file descriptor, a test's capture, is left
    as it is)."""
    try:
        sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    if not isinstance(sys.stdout, PipeSafe):
        sys.stdout = PipeSafe(sys.stdout)
