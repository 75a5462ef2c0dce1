"""Keys typed in a terminal, named as `play.keys` names them."""

from __future__ import annotations

import pytest

from ardiff_cli._keys import parse_keys


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
