"""How the `ardiff` script's process ends, whatever threads a pipeline left running.

    leave(code)      the command is over: exit with `code` (sys.exit), unless a thread it
                     started (not a daemon: a pipeline's) is still running after a short
                     wait; then `end_now(code)`, with one warning line
    end_now(code)    exit now without waiting for any thread (a stuck pipeline's included):
                     Python's and C's buffered output flushed, the exit callbacks run (for
                     EXIT_CALLBACKS_S at most), then os._exit

Either runs only once every file is final and the stats are written: an ordinary exit
would wait for every thread that is not a daemon, forever if one never ends.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import NoReturn

STRAY_THREADS_S = 1.0   # how long a finished command waits for a pipeline's threads to end
EXIT_CALLBACKS_S = 2.0  # how long the exit callbacks (atexit) may take in end_now
_threads_at_start: set[int | None] = set()


def note_threads_at_start() -> None:
    """The threads alive when the script starts are not the command's (in-process tests)."""
    global _threads_at_start
    _threads_at_start = {thread.ident for thread in threading.enumerate()}


def leave(code: int) -> NoReturn:
    """Exit with `code` once the command has written everything (see the module docstring)."""
    strays = _stray_threads()
    deadline = time.monotonic() + STRAY_THREADS_S
    for thread in strays:
        thread.join(max(0.0, deadline - time.monotonic()))
    strays = [thread for thread in strays if thread.is_alive()]
    if not strays:
        sys.exit(code)
    names = ", ".join(repr(thread.name) for thread in strays)
    print(f"warning: {len(strays)} thread(s) the pipeline started are still running ({names}); "
          f"ending without waiting for them", file=sys.stderr)
    end_now(code)


def end_now(code: int) -> NoReturn:
    """Exit with `code` now, from any thread, waiting for none: flush Python's streams, run the
    exit callbacks (bounded: one may wait for a stuck thread), flush C's stdio, os._exit."""
    _flush_streams()
    callbacks = threading.Thread(target=atexit._run_exitfuncs, name="ardiff-exit", daemon=True)
    callbacks.start()
    callbacks.join(EXIT_CALLBACKS_S)
    _flush_streams()
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # what a C library printf'd into a buffered stdout
    except (AttributeError, OSError):  # no C library to ask (not POSIX)
        pass
    os._exit(code)


def _stray_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate()
            if not thread.daemon and thread is not threading.current_thread()
            and thread.ident not in _threads_at_start]


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe, a closed stream
            pass
