"""SIGINT, SIGTERM and SIGHUP mean one thing for every command: stop, but leave the files whole.

    with StopSignals() as signals, handle_errors(debug):
        ...                        a signal raises KeyboardInterrupt(name): nothing to lose
        signals.follow(stop)       a rollout: raise only while `stop.is_interruptible`
                                   (loading, warmup), else `stop.request(name)`
        signals.when_stuck(display, finish)   a rollout: what the watchdog does
        signals.hold()             writing output: record signals, never raise

    a rollout:  1st signal: finish the block in flight, finalise, report
                2nd, in the pipeline's code (the 1st once every file is final): abandon it
                ... still there ABANDON_AFTER_S later: the watchdog takes the files over

A signal's cleanup is not cut short by the next one, except the pipeline's code
(`stop.gate`), which KeyboardInterrupt(first signal) abandons; where that code cannot be
interrupted (a blocking C call, a loop that swallows it), the watchdog thread (the `ardiff`
script only) finalises the files, has `finish` write the stats and ends the process
(ardiff_cli._exit). "First" is first to arrive, read off `signal.set_wakeup_fd`
(`ArrivalOrder`; the C handler writes it even while the main thread is stuck): CPython runs
pending handlers in signal-number order. A signal ignored at start stays ignored; under the
`ardiff` script the handlers give way to SIG_IGN, so a late signal cannot change the exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, ContextManager

from ardiff.rollout.interrupts import in_ardiffs_own_code

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
ABANDON_AFTER_S = 3.0   # after the signal that abandons it, how long pipeline code may still run
WATCH_EVERY_S = 0.05    # how often the watchdog looks
RETRY_ABANDON_S = 0.01  # an abandon that found the main thread in ardiff's code: again after
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
        self._raised = False              # the first signal raised: the others wait
        self._held = False                # output is written: no signal may raise any more
        self._stuck: tuple[ContextManager[Any], Callable[[Any], object]] | None = None
        self._previous: dict[int, Any] = {}
        self._order = ArrivalOrder()
        self._swapped: tuple[str, str] | None = None  # (first come, first handled) if unlike
        self._watchdog: Watchdog | None = None
        self._retry_pending = False  # an abandon that would have cut through ardiff's code

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                previous = signal.getsignal(signum)
                if previous is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
            self._order.open()  # after: a byte in it is a signal these handlers will see
            if _ends_with_the_process and self._order.is_open:
                self._watchdog = Watchdog(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
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

    def when_stuck(self, display: ContextManager[Any], finish: Callable[[Any], object]) -> None:
        """What the watchdog does once it took over the files of a rollout stuck in the
        pipeline: close `display` (a progress bar), then `finish(report)`, which writes the
        stats and says the error (its `typer.Exit` carries the exit code). Without it (a
        command that follows a stop but does not say), the watchdog does nothing."""
        self._stuck = (display, finish)

    def hold(self) -> None:
        """From now on signals only wait: output is being written."""
        self._held = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = self._arrived(signal.Signals(signum).name)
        first = self.received is None
        if first:
            self.received = name
        if self._stop is not None:
            self._stop.request(name)
        if first and self._may_raise():
            self._raised = True  # a second signal must not cut short the cleanup this starts
            raise KeyboardInterrupt(name)
        self._retry_pending = False  # this call may be the retry
        if (not first or self._is_closing()) and self._may_abort():
            if in_ardiffs_own_code(frame):  # its pages, sessions or files: not there
                self._abandon_later(signum)
                return
            _say(self._abort_line(name))
            raise KeyboardInterrupt(self.received)  # reported as the first signal's stop
        _say(self._waiting_line(name, first))

    def _abandon_later(self, signum: int) -> None:
        """Send `signum` to the main thread again soon: its handler then finds the pipeline's
        code (the block resumed in it), or nothing left to abandon."""
        if self._retry_pending:
            return
        self._retry_pending = True
        main = threading.main_thread().ident
        assert main is not None, "the main thread runs"

        def resend() -> None:
            if signal.getsignal(signum) == self._handle:  # not once the command is over
                signal.pthread_kill(main, signum)

        timer = threading.Timer(RETRY_ABANDON_S, resend)
        timer.daemon = True
        timer.start()

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
        return (not self._held and not self._raised
                and (self._stop is None or self._stop.is_interruptible))

    def _is_closing(self) -> bool:
        """Every file is final (the pipeline closes its sessions): one signal may abandon
        the pipeline's code, as nothing of the output is left to lose."""
        return getattr(self._stop, "phase", None) == "closing"

    def _may_abort(self) -> bool:
        """Whether the main thread runs the pipeline's code for a job that can lose it."""
        gate = getattr(self._stop, "gate", None)
        return (not self._held and gate is not None and gate.pipeline_since is not None
                and not gate.taken_over)

    def _waiting_line(self, name: str, first: bool) -> str:
        phase = getattr(self._stop, "phase", None)
        if phase == "closing":
            return f"stopping ({name}): every file is written; the pipeline closes its sessions"
        files_open = getattr(getattr(self._stop, "gate", None), "open_files", 1)  # 1: unknown
        if first and phase == "rollout":
            then = ", then finalising..." if files_open else "..."
            return f"stopping ({name}): finishing the current block{then}"
        if phase == "rollout" and getattr(self._stop, "ranks", 0):  # a parallel job's parent
            return f"stopping now ({name}): every rank abandons its block in flight; finalising..."
        if self._held or phase in ("finalising", "done") or (phase == "rollout" and files_open):
            return f"finalising... ({name} waits until every file is written)"
        return f"stopping... ({name} waits for the cleanup the first signal started)"

    def _abort_line(self, name: str, why: str = "") -> str:
        """What a second signal (or the watchdog) abandons, and whether files are finalised."""
        phase = self._stop.phase
        what = {"warmup": "the warmup", "closing": "the pipeline's session cleanup"}.get(
            phase, "the block in flight")
        then = ("finalising..." if self._stop.gate.open_files
                else "every file is written" if phase == "closing" else "nothing to finalise")
        return f"stopping now ({name}): {what} is abandoned{why}; {then}"

    # -- the watchdog's side ---------------------------------------------------------------
    def _is_stuck(self, arrivals: list[tuple[str, float]]) -> bool:
        """Whether the main thread has run code the watchdog may abandon for ABANDON_AFTER_S
        since the second stop signal came (the first, once every file is final) (watchdog
        thread)."""
        needed = 1 if self._is_closing() else 2
        if len(arrivals) < needed or self._held:
            return False
        since = self._abandonable_since()
        return (since is not None
                and time.monotonic() - max(arrivals[needed - 1][1], since) >= ABANDON_AFTER_S)

    def _abandonable_since(self) -> float | None:
        """Since when the main thread runs code the watchdog may abandon (0.0: whatever it
        runs, nothing is on disk yet); None: nothing it may abandon now."""
        stop = self._stop
        if stop is None:  # a command without a rollout
            return 0.0
        if self._stuck is None:  # it did not say what to do (see `when_stuck`)
            return None
        gate = getattr(stop, "gate", None)
        if gate is None:  # no rollout yet: while loading, nothing is on disk
            return 0.0 if stop.phase == "loading" else None  # else ardiff.launch's processes
        since: float | None = gate.pipeline_since
        return since

    def _end_stuck(self, arrivals: list[tuple[str, float]]) -> bool:
        """End the process stuck in the pipeline (watchdog thread): the files taken over and
        finalised, the stats written, exit. False: the main thread is not stuck any more."""
        from ardiff_cli._exit import end_now

        first, last = self.received or arrivals[0][0], arrivals[-1][0]
        gate = getattr(self._stop, "gate", None)
        if gate is None:
            _say(f"stopping now ({last}): nothing is written yet")
            _say(f"error: interrupted by {first}")
            end_now(130)  # ardiff.errors.EXIT_INTERRUPTED, not imported at start-up
        self._stop.request(first)  # its handler may never have run (a blocking C call)
        line = self._abort_line(last, f" (it has not returned for {ABANDON_AFTER_S:g} s)")
        report = gate.take_over(timeout_s=WATCH_EVERY_S)
        if report is None:
            return False
        _say(line)
        code = report.exit_code
        assert self._stuck is not None, "_abandonable_since checked it"
        display, finish = self._stuck
        try:
            with contextlib.suppress(Exception):  # a progress bar that cannot stop cleanly
                display.__exit__(None, None, None)
            finish(report)
        except Exception as exc:  # typer.Exit: the exit code; anything else: the report's
            code = getattr(exc, "exit_code", code)
        finally:
            end_now(code)


class Watchdog:
    """A daemon thread that reads the signals as they come (`ArrivalOrder`) and ends a
    command whose main thread is stuck (`StopSignals._is_stuck`, `_end_stuck`)."""

    def __init__(self, signals: StopSignals) -> None:
        self._signals, self._quit = signals, threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ardiff-stop-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._quit.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        signals = self._signals
        while not self._quit.wait(WATCH_EVERY_S):
            arrivals = signals._order.arrivals()
            if signals._is_stuck(arrivals) and signals._end_stuck(arrivals):
                return


class ArrivalOrder:
    """The stop signals in the order they came, from a wakeup pipe CPython writes each
    signal's number to in its C handler (before any Python handler runs, and even while the
    main thread is stuck in C code). Opened in the main thread only, and only if no one else
    (an asyncio loop) has a wakeup fd set. Read by the handlers and the watchdog's thread."""

    def __init__(self) -> None:
        self._fds: tuple[int, int] | None = None
        self._arrivals: list[tuple[str, float]] = []  # (name, time.monotonic() when read)
        self._lock = threading.RLock()  # reentrant: a handler may run inside another

    @property
    def is_open(self) -> bool:
        return self._fds is not None

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
        arrivals = self.arrivals()
        return arrivals[0][0] if arrivals else None

    def arrivals(self) -> list[tuple[str, float]]:
        """Every stop signal that came since `open`, in order, with when it was read."""
        with self._lock:
            while self._fds is not None:
                try:
                    data = os.read(self._fds[0], 256)
                except OSError:  # empty (BlockingIOError): nothing more is written yet
                    break
                if not data:
                    break
                now = time.monotonic()
                self._arrivals += [(signal.Signals(signum).name, now) for signum in data
                                   if signum in STOP_SIGNALS]
            return list(self._arrivals)

    def close(self) -> None:
        with self._lock:
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
