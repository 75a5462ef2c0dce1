"""Run the installed `ardiff` in a pseudo-terminal and type into it, as a user would.

    result = run_in_pty(["play", "-o", "game.npy"], [Wait("frame "), Keys(b"a", 0.3), ...])
    result.exit_code, result.output          # everything the terminal showed

stdin, stdout and stderr are the pty's slave end, sized ROWS x COLS, so the program
sees a terminal; the test reads what it draws from the master end. `Hangup()` closes the
master end as a closed terminal window or a dropped ssh session does: the program's reads
then see end of input and its writes EIO; with `controlling=True` the pty is also its
controlling terminal, so the kernel sends it SIGHUP too. `Signal(signum)` sends a signal.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

ROWS, COLS = 40, 100


@dataclass(frozen=True)
class Wait:
    """Read until the output contains `text` (a test that never sees it fails)."""

    text: str


@dataclass(frozen=True)
class Keys:
    """Type `data`, then let `pause_s` pass (reading the output meanwhile)."""

    data: bytes
    pause_s: float = 0.0


@dataclass(frozen=True)
class Hangup:
    """Close the terminal (the master end), then wait for the program to end."""


@dataclass(frozen=True)
class Signal:
    """Send `signum` to the program, then let `pause_s` pass (reading the output)."""

    signum: int
    pause_s: float = 0.0


@dataclass
class PtyResult:
    exit_code: int
    output: str


def ardiff_script() -> str:
    beside = Path(sys.executable).parent / "ardiff"
    return str(beside) if beside.exists() else "ardiff"


def run_in_pty(args: list[str], steps: list, cwd: Path, timeout_s: float = 60.0,
               controlling: bool = False, env: dict[str, str] | None = None) -> PtyResult:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor",
           "COLUMNS": str(COLS), "LINES": str(ROWS), "OMP_NUM_THREADS": "1", **(env or {})}
    process = subprocess.Popen([ardiff_script(), *args], stdin=slave, stdout=slave,
                               stderr=slave, cwd=cwd, env=env, start_new_session=True,
                               preexec_fn=_take_the_terminal if controlling else None)
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        for step in steps:
            if isinstance(step, Wait):
                _read_until(master, output, step.text, deadline)
            elif isinstance(step, Hangup):
                os.close(master)
                master = -1
                break
            elif isinstance(step, Signal):
                process.send_signal(step.signum)
                _read_for(master, output, step.pause_s)
            else:
                os.write(master, step.data)
                _read_for(master, output, step.pause_s)
        while process.poll() is None and time.monotonic() < deadline:
            if master >= 0:
                _read_for(master, output, 0.1)
            else:
                time.sleep(0.05)
        if master >= 0:
            _read_for(master, output, 0.1)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if master >= 0:
            os.close(master)
    return PtyResult(process.returncode, output.decode("utf-8", errors="replace"))


def _take_the_terminal() -> None:
    """In the child, after setsid: stdin (the pty) becomes the controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _read_for(master: int, output: bytearray, seconds: float) -> None:
    end = time.monotonic() + seconds
    while True:
        _read_some(master, output, max(0.0, min(0.05, end - time.monotonic())))
        if time.monotonic() >= end:
            return


def _read_until(master: int, output: bytearray, text: str, deadline: float) -> None:
    while text.encode() not in output:
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {text!r}; the terminal showed:\n"
                                 f"{output.decode('utf-8', errors='replace')[-2000:]}")
        _read_some(master, output, 0.05)


def _read_some(master: int, output: bytearray, timeout_s: float) -> None:
    ready, _, _ = select.select([master], [], [], timeout_s)
    if ready:
        try:
            output += os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            time.sleep(timeout_s)
