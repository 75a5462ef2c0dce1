"""SIGINT, SIGTERM and SIGHUP mean one thing for every command: stop, but leave the files whole.

    with StopSignals() as signals, handle_errors(debug):
        ...                        a signal raises KeyboardInterrupt(name): nothing to lose
        signals.follow(stop)       a rollout: raise only while `stop.is_interruptible`
                                   (loading, warmup), else `stop.request(name)`
        signals.hold()             writing output: record signals, never raise

At most one signal raises; later ones only wait, with one line on stderr, so the cleanup
the first one started is never cut short. "First" means first to arrive, read off
`signal.set_wakeup_fd` (`ArrivalOrder`), because CPython runs the handlers of signals
pending together in signal-number order. Handlers live in the main thread; a signal
ignored at start stays ignored; under the `ardiff` script (`end_with_the_process`) they
give way to SIG_IGN, so a signal during interpreter shutdown cannot change the exit code.
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
        self._order = ArrivalOrder()
        self._swapped: tuple[str, str] | None = None  # (first come, first handled) if unlike

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                previous = signal.getsignal(signum)
                if previous is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
            self._order.open()  # after: a byte in it is a signal these handlers will see
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            if _ends_with_the_process:
                previous = signal.SIG_IGN
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
        self._order.close()

    def follow(self, stop: Any) -> None:
        """Hand signals to `stop` (request(name), is_interruptible, phase: ardiff's RolloutStop)."""
        self._stop = stop
        if self.received is not None:  # arrived before the job existed: stop before it starts
            stop.request(self.received)

    def hold(self) -> None:
        """From now on signals only wait: output is being written."""
        self._held = True

    def _handle(self, signum: int, frame: object) -> None:
        name = self._arrived(signal.Signals(signum).name)
        first = self.received is None
        if first:
            self.received = name
        if self._stop is not None:
            self._stop.request(name)
        if first and self._may_raise():
            self._held = True  # a second signal must not cut short the cleanup this one starts
            raise KeyboardInterrupt(name)
        _say(self._waiting_line(name, first))

    def _arrived(self, name: str) -> str:
        """The signal this handler call stands for: for the first call, the signal that came
        first (its own call may come later: that call then stands for this one's signal)."""
        if self.received is None:
            first = self._order.first() or name
            if first != name:
                self._swapped = (first, name)
            return first
        if self._swapped is not None and name == self._swapped[0]:
            name, self._swapped = self._swapped[1], None
        return name

    def _may_raise(self) -> bool:
        return not self._held and (self._stop is None or self._stop.is_interruptible)

    def _waiting_line(self, name: str, first: bool) -> str:
        if first and getattr(self._stop, "phase", None) == "rollout":
            return f"stopping ({name}): finishing the current block, then finalising..."
        return f"finalising... ({name} waits until every file is written)"


class ArrivalOrder:
    """The stop signals in the order they came, from a wakeup pipe CPython writes each
    signal's number to in its C handler (before any Python handler runs). Opened in the
    main thread only, and only if no one else (an asyncio loop) has a wakeup fd set."""

    def __init__(self) -> None:
        self._fds: tuple[int, int] | None = None

    def open(self) -> None:
        fds = os.pipe()
        for fd in fds:
            os.set_blocking(fd, False)
        previous = signal.set_wakeup_fd(fds[1], warn_on_full_buffer=False)
        if previous != -1:  # someone else's: leave it, and fall back to the handlers' order
            signal.set_wakeup_fd(previous)
            _close_all(fds)
            return
        self._fds = fds

    def first(self) -> str | None:
        """The first stop signal among those that came since `open` (None: unknown)."""
        if self._fds is None:
            return None
        try:
            data = os.read(self._fds[0], 256)
        except OSError:  # empty (BlockingIOError): its byte is not written yet
            return None
        numbers = [signum for signum in data if signum in STOP_SIGNALS]
        return signal.Signals(numbers[0]).name if numbers else None

    def close(self) -> None:
        if self._fds is None:
            return
        current = signal.set_wakeup_fd(-1)
        if current not in (-1, self._fds[1]):  # replaced meanwhile: theirs stays
            signal.set_wakeup_fd(current)
        _close_all(self._fds)
        self._fds = None


def _close_all(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)


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
