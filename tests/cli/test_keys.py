"""Keys typed in a terminal, named as `play.keys` names them; a terminal that goes away
(its pty's master end closed, as a closed window or a dropped ssh session leaves it)."""

from __future__ import annotations

import os
import sys

import pytest

from ardiff_cli._keys import TerminalKeys, TerminalLost, is_hung_up, parse_keys
from ardiff_cli._play_display import LOST_REASON, TerminalOutput, terminal_state


@pytest.mark.parametrize("typed, keys", [
    ("\x1b[A\x1b[B\x1b[C\x1b[D", ["up", "down", "right", "left"]),
    ("\x1bOA", ["up"]),                                  # application cursor mode
    ("wasd q", ["w", "a", "s", "d", "space", "q"]),
    ("\x03\r\t", ["ctrl-c", "enter", "tab"]),
    ("\x1b[1;5Cx", ["x"]),                               # ctrl-right: skipped whole
    ("\x1b", []), ("\x01", []),                          # lone ESC, other control keys
])
def test_parse_keys(typed, keys):
    assert parse_keys(typed) == keys


def test_a_terminal_that_went_away_is_lost_and_its_mode_left_alone():
    master, slave = os.openpty()
    try:
        with TerminalKeys(slave) as keys:
            os.write(master, b"a")
            assert keys.read(1.0) == ["a"]
            os.close(master)                   # the window closed: end of input, EIO
            assert is_hung_up(slave)
            with pytest.raises(TerminalLost):
                keys.read(1.0)
        with pytest.raises(TerminalLost):       # gone before the game: refused at once
            TerminalKeys(slave).__enter__()
    finally:
        os.close(slave)
    read_end, write_end = os.pipe()
    assert not is_hung_up(read_end)            # not a terminal at all
    os.close(read_end)
    os.close(write_end)


class Stop:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def request(self, reason: str) -> None:
        self.reasons.append(reason)


def test_terminal_output_outlives_its_terminal(monkeypatch):
    master, slave = os.openpty()
    stderr = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", stderr)
    stop = Stop()
    with TerminalOutput() as output:
        output.follow(stop)
        print("shown", file=sys.stderr)
        assert os.read(master, 100) == b"shown\r\n"
        os.close(master)
        print("written to a terminal that is gone", file=sys.stderr)  # EIO: no error
        assert output.lost and stop.reasons == [LOST_REASON]
        assert terminal_state(stderr) is None      # /dev/null now: the last flush succeeds
        print("after", file=sys.stderr)
    assert sys.stderr is stderr
    stderr.close()
