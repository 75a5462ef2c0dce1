"""Keys from the terminal, one at a time, for `ardiff play`.

`TerminalKeys(fd)` puts the terminal in a key-at-a-time mode while it is entered (no
line buffering, no echo, and Ctrl-C arrives as a key rather than SIGINT, so it ends a
game like `q` does, with the recording kept) and restores the settings on exit.
`read(timeout_s)` waits at most `timeout_s` for input and returns the keys it got,
named as `play.keys` names them (ardiff.config.play): `up`, `down`, `left`, `right`,
`space`, `enter`, `tab`, `ctrl-c`, or the character typed. A terminal that went away
(its window closed, its ssh session dropped: end of input, or EIO) raises TerminalLost;
restoring the settings of a terminal that is gone is skipped, not an error.
"""

from __future__ import annotations

import errno
import os
import select
import termios

ARROWS = {"A": "up", "B": "down", "C": "right", "D": "left"}
CONTROL = {"\x03": "ctrl-c", " ": "space", "\r": "enter", "\n": "enter", "\t": "tab"}
ESC = "\x1b"
READ_BYTES = 1024


class TerminalLost(Exception):
    """The terminal is gone: end of input where a key was ready, or EIO."""


def parse_keys(text: str) -> list[str]:
    """Key names in typed text: `ESC [ A` (or `ESC O A`) is `up`; other escape sequences
    and control characters are dropped."""
    keys: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == ESC:
            if text[i + 1:i + 2] in ("[", "O") and text[i + 2:i + 3] in ARROWS:
                keys.append(ARROWS[text[i + 2]])
                i += 3
                continue
            i = _after_escape(text, i)
            continue
        if char in CONTROL:
            keys.append(CONTROL[char])
        elif char.isprintable():
            keys.append(char)
        i += 1
    return keys


def _after_escape(text: str, i: int) -> int:
    """Skip a whole escape sequence (ESC [ params final), or a lone ESC."""
    if text[i + 1:i + 2] != "[":
        return i + 1
    j = i + 2
    while j < len(text) and not ("@" <= text[j] <= "~"):
        j += 1
    return j + 1


def is_hung_up(fd: int) -> bool:
    """Whether `fd` is a terminal that went away (isatty() says False for it: EIO)."""
    try:
        termios.tcgetattr(fd)
    except termios.error as exc:
        return exc.args[0] == errno.EIO
    except (OSError, ValueError):
        return False
    return False


class TerminalKeys:
    """Key-at-a-time input from terminal `fd` (a context manager)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._saved: list | None = None

    def __enter__(self) -> TerminalKeys:
        try:
            saved = termios.tcgetattr(self.fd)
            mode = termios.tcgetattr(self.fd)
            mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG)  # lflags
            mode[6][termios.VMIN], mode[6][termios.VTIME] = 0, 0
            termios.tcsetattr(self.fd, termios.TCSANOW, mode)
        except (termios.error, OSError) as exc:  # hung up between the check and now
            raise TerminalLost(str(exc)) from exc
        self._saved = saved
        return self

    def __exit__(self, *exc_info: object) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        try:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
        except (termios.error, OSError):  # the terminal is gone, and its mode with it
            pass

    def read(self, timeout_s: float) -> list[str]:
        """The keys typed within `timeout_s`; raises TerminalLost when the terminal is gone."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout_s))
        if not ready:
            return []
        try:
            data = os.read(self.fd, READ_BYTES)
        except OSError as exc:
            raise TerminalLost(str(exc)) from exc
        if not data:  # ready but empty: a hangup (raw mode has no end-of-file key)
            raise TerminalLost("end of input")
        return parse_keys(data.decode("utf-8", errors="replace"))
