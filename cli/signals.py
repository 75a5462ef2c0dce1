"""SIGINT, SIGTERM and SIGHUP mean one thing for every command: stop, but leave the files whole.

    with StopSignals() as signals, handle_errors(debug):
        ...                              a signal raises KeyboardInterrupt(name): nothing to lose
        signals.follow(stop)             a rollout: raise only while `stop.is_interruptible`
                                         (loading, warmup); else `stop.request(name)`, and the
                                         job stops at its next safe point and finalises
        signals.hold()                   writing output: record signals, never raise

The first signal that may raise does, once: any later one only waits, so the
cleanup the first one started (closing the runner, finalising a file, writing
the stats) is never cut short. A signal that waits prints one line on stderr
(`stopping ...` for the first, `finalising...` after), and the command exits as
its work ends: 130 when a signal stopped it, its own code when the work was
already done. The handlers are installed only in the main thread and restored
on exit, except in the `ardiff` script (`end_with_the_process`): there the
process ends with the command, so a signal that comes after the work is done
(during interpreter shutdown) is ignored and the exit code stays the one the
stats report. Background jobs of a non-interactive shell ignore SIGINT; a
signal ignored when the command starts stays ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
_ends_with_the_process = False


def end_with_the_process(value: bool = True) -> None:
    """The process exits when the command returns (the `ardiff` script): a command's handlers
    then give way to SIG_IGN, not to the defaults, so a late signal cannot change the exit."""
    global _ends_with_the_process
    _ends_with_the_process = value


class StopSignals:
    """A context manager that turns the stop signals into KeyboardInterrupt or a stop request."""

    def __init__(self) -> None:
        self.received: str | None = None  # the first signal's name
        self._stop: Any = None            # a library stop object (see `follow`)
        self._held = False                # no signal may raise any more
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                previous = signal.getsignal(signum)
                if previous is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            if _ends_with_the_process:
                previous = signal.SIG_IGN
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def follow(self, stop: Any) -> None:
        """Hand signals to `stop` (request(name), is_interruptible, phase: ardiff's RolloutStop)."""
        self._stop = stop
        if self.received is not None:  # arrived before the job existed: stop before it starts
            stop.request(self.received)

    def hold(self) -> None:
        """From now on signals only wait: output is being written."""
        self._held = True

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        first = self.received is None
        if first:
            self.received = name
        if self._stop is not None:
            self._stop.request(name)
        if first and self._may_raise():
            self._held = True  # a second signal must not cut short the cleanup this one starts
            raise KeyboardInterrupt(name)
        _say(self._waiting_line(name, first))

    def _may_raise(self) -> bool:
        return not self._held and (self._stop is None or self._stop.is_interruptible)

    def _waiting_line(self, name: str, first: bool) -> str:
        if first and getattr(self._stop, "phase", None) == "rollout":
            return f"stopping ({name}): finishing the current block, then finalising..."
        return f"finalising... ({name} waits until every file is written)"


def _say(line: str) -> None:
    """One line on stderr from a signal handler: straight to the file descriptor, so it cannot
    collide with a write to sys.stderr that the signal interrupted."""
    data = f"{line}\n"
    try:
        fd = sys.stderr.fileno()
        if os.isatty(fd):  # below a progress bar's line, which its next refresh redraws
            data = f"\n{data}"
        os.write(fd, data.encode())
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's captured stream)
        try:
            sys.stderr.write(data)
            sys.stderr.flush()
        except (OSError, RuntimeError, ValueError):
            pass  # nowhere to say it; the exit code and the stats still will
