"""User text: how a user's value is quoted in a message, and which strings a config may hold.

    short_repr("a" * 10_000)          'aaaa...aaaa' in 200 characters
    short_repr({"k": [1] * 10**6})    {'k': [1, 1, 1, 1, 1, 1, 1, 1, ...]}

A quote is at most `MAX_SHOWN_CHARS` characters and walks no more of a structure than it
shows, so quoting a YAML alias bomb costs nothing. Config text is valid Unicode without
NUL: a lone surrogate (command-line bytes that are not UTF-8) cannot be written to JSON, a
terminal or a file name, and NUL cannot be part of a path or a C string.
"""

from __future__ import annotations

import builtins
import itertools
import math
import reprlib
from typing import Any

from ardiff.limits import MAX_KEY_CHARS, MAX_NAME_BYTES, MAX_PATH_BYTES, MAX_SHOWN_CHARS

_FILL = "..."


class _ShortRepr(reprlib.Repr):
    """reprlib with mappings in insertion order (reprlib sorts them) and strings cut in
    the middle (reprlib keeps the head of a string only)."""

    def __init__(self) -> None:
        super().__init__()
        self.fillvalue = _FILL
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 8
        self.maxstring = self.maxother = MAX_SHOWN_CHARS
        self.maxlong = 40

    def repr_str(self, x: str, level: int) -> str:
        if len(x) <= self.maxstring:
            return builtins.repr(x)
        half = (self.maxstring - len(_FILL) - 2) // 2  # 2: the quotes
        head, tail = builtins.repr(x[:half]), builtins.repr(x[-half:])
        if head[0] != tail[-1]:  # different quotes: show two literals
            return f"{head}{_FILL}{tail}"
        return f"{head[:-1]}{_FILL}{tail[1:]}"

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 14_000:  # repr of 4300 digits or more raises (sys.int_info)
            return f"<an integer of about {int(x.bit_length() * math.log10(2)) + 1} digits>"
        return shorten(builtins.repr(x), self.maxlong)

    def repr_dict(self, x: dict, level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{" + _FILL + "}"
        pieces = [f"{self.repr1(key, level - 1)}: {self.repr1(value, level - 1)}"
                  for key, value in itertools.islice(x.items(), self.maxdict)]
        if len(x) > self.maxdict:
            pieces.append(_FILL)
        return "{" + ", ".join(pieces) + "}"


_REPR = _ShortRepr()


def short_repr(value: Any) -> str:
    """`repr(value)` in at most `MAX_SHOWN_CHARS` characters (for messages)."""
    return shorten(_REPR.repr(value))


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text` itself, or its head and tail around `...` in `limit` characters."""
    if len(text) <= limit:
        return text
    head = (limit - len(_FILL)) * 2 // 3
    tail = limit - len(_FILL) - head
    return f"{text[:head]}{_FILL}{text[-tail:]}"


def text_problem(text: str) -> str | None:
    """Why `text` cannot be config text (a lone surrogate or NUL, with where), or None."""
    for index, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            return (f"is not valid Unicode (a lone surrogate {char!r} at character {index}: "
                    f"bytes that are not UTF-8?); write it in UTF-8")
        if char == "\0":
            return f"holds a NUL character at character {index}; remove it"
    return None


def path_problem(text: str) -> str | None:
    """Why `text` cannot name a file (a part longer than the file systems' NAME_MAX, or the
    whole longer than PATH_MAX), or None. Check `text_problem` first."""
    longest = max(text.replace("\\", "/").split("/"), key=lambda part: len(part.encode()))
    if len(longest.encode()) > MAX_NAME_BYTES:
        return (f"has a name of {len(longest.encode())} bytes; file systems allow "
                f"{MAX_NAME_BYTES}, so pick a shorter name")
    if len(text.encode()) > MAX_PATH_BYTES:
        return (f"is {len(text.encode())} bytes long; file systems allow {MAX_PATH_BYTES}, so "
                f"pick a shorter path")
    return None


def find_bad_text(data: Any, path: str = "") -> tuple[str, str, str] | None:
    """The first string (a key or a value) in plain data that is not config text, as
    (dotted path, the string, the problem), or None. Shared values are visited once."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(path, data)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            problem = text_problem(node)
            if problem:
                return where, node, problem
        elif isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            children = []
            for key, value in items:
                child = _child_path(where, key)
                if isinstance(key, str) and text_problem(key):
                    return child, key, text_problem(key)
                children.append((child, value))
            stack.extend(reversed(children))  # depth first, in the order of the file
    return None


def _child_path(where: str, key: Any) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{where}[{key}]"
    return f"{where}.{key_name(key)}" if where else key_name(key)


def key_name(key: Any) -> str:
    """A mapping key as a part of a dotted path: itself if it is short printable text, else
    its short repr (so a path never grows with the input, nor holds a surrogate)."""
    if isinstance(key, str) and key.isprintable() and len(key) <= MAX_KEY_CHARS:
        return key
    return short_repr(key) if not isinstance(key, str) else shorten(repr(key)[1:-1], MAX_KEY_CHARS)
