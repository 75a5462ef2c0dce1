"""What the bouncing world model's commands (`train`, `evaluate`, `training.games`) share as
tools people run: argument types that refuse bad values, a parser whose errors are one line,
the run that turns a typed error into its one-line message and exit code, and paths as a
run's record keeps them (never absolute: a record travels with its weights).

    bad argument   `--worlds 0`, `--lr nan`, a missing `--init`  -> one line, exit 2
    typed error    `ardiff.ArdiffError` raised by the work       -> one line, its exit code
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import ardiff
from ardiff.errors import EXIT_INTERRUPTED, EXIT_USAGE


class Parser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose usage errors are one line (`PROG: error: ...`), exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argument type: a whole number >= 1."""
    value = _number(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def natural_int(text: str) -> int:
    """An argument type: a whole number >= 0."""
    value = _number(text, int, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def positive_float(text: str) -> float:
    """An argument type: a finite number > 0 (a learning rate)."""
    value = _number(text, float, "a number")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value


def fraction(text: str) -> float:
    """An argument type: a number in [0, 1] (a probability, a noise level)."""
    value = _number(text, float, "a number")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number in [0, 1]")
    return value


def weights_file(text: str) -> Path:
    """An argument type: a path to an existing file (what is in it, `load_weights` checks)."""
    path = Path(text)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not found"
        raise argparse.ArgumentTypeError(f"{text!r} is {what}; give a .safetensors file made "
                                         f"by `python -m ardiff.pipelines.bouncing.train`")
    return path


def _number(text: str, kind: Callable[[str], int | float], what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def refuse_overwrite(option: str, written: Path | None, read: list[Path | None]) -> None:
    """Raise `ardiff.ConfigError` when `written` (an output) is one of the files the command
    reads: writing it would destroy its input."""
    if written is None:
        return
    for path in read:
        if path is not None and Path(path).resolve() == Path(written).resolve():
            raise ardiff.ConfigError(f"{option}: {str(written)!r} is a file this command reads "
                                     f"({path}); write the output to another file")


def portable(value: object) -> object:
    """A run-record value as a record keeps it: a path never absolute (a relative one as
    given, an absolute one by its name), other values as they are (JSON-ready)."""
    if isinstance(value, Path):
        return value.name if value.is_absolute() else str(value)
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    return str(value)


def run(work: Callable[[], None]) -> None:
    """Run a command's work; a typed ardiff error leaves as its one-line message on stderr
    and its exit code (2 for usage), Ctrl-C as `interrupted` and 130, never a traceback."""
    try:
        work()
    except ardiff.ArdiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
