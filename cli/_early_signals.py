"""The stop signals from the `ardiff` script's first line until a command handles them.

    hold_stop_signals()      first thing the script does (ardiff_cli.main, before its other imports)
    name = take_held()       main() starts: a signal that came while importing, or None; any
                             later one raises KeyboardInterrupt(its name) until the command's
                             StopSignals (ardiff_cli._signals) takes over
    raised()                 the name of the signal raised that way (None: none was)
    settle()                 main() ends: a signal still held here is ignored

    script starts ... imports ... main() ... typer ... command: StopSignals ... exit
    |<- held (recorded) ->|<- KeyboardInterrupt ->|<- the command's handling ->|

Without it SIGTERM and SIGHUP would end the process by the signal (no message, no exit 130)
while Python imports, and SIGINT would print a traceback. A signal ignored at start
(`nohup`) stays ignored. Only in the `ardiff` script (argv[0]), never in a process that
imports the CLI (tests). Standard library only: it runs before anything else is imported.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

_NAMES = ("SIGINT", "SIGTERM", "SIGHUP")
_held: str | None = None     # the first stop signal that came before main() started
_raised: str | None = None   # the signal raised as KeyboardInterrupt before a command handled it
_main_started = False


def is_the_script() -> bool:
    """Whether this process runs the `ardiff` console script (its argv[0])."""
    name = os.path.basename(sys.argv[0] if sys.argv else "")
    for suffix in ("-script.pyw", "-script.py", ".exe"):
        name = name.removesuffix(suffix)
    return name == "ardiff"


def hold_stop_signals() -> None:
    """Record the stop signals from now on (see the module docstring); only in the script."""
    if not is_the_script():
        return
    for name in _NAMES:
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _early)


def take_held() -> str | None:
    """main() starts: the signal that came while the script imported (None: none did)."""
    global _main_started
    _main_started = True
    return _held


def raised() -> str | None:
    """The stop signal that interrupted main() before a command's handlers took over."""
    return _raised


def settle() -> None:
    """The command is over: a stop signal still held here is ignored from now on."""
    for name in _NAMES:
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) == _early:
            signal.signal(signum, signal.SIG_IGN)


def _early(signum: int, frame: FrameType | None) -> None:
    global _held, _raised
    name = signal.Signals(signum).name
    if not _main_started:
        _held = _held or name
        return
    if _raised is None:  # once: a second one waits for the first one's unwinding
        _raised = name
        raise KeyboardInterrupt(name)
