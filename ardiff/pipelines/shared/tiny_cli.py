"""The argument checks of the `make_tiny` commands (causal-Wan's, Matrix-Game's).

Each bad argument is one line on stderr and exit 2 (no traceback): `--num-layers` below 1,
a negative `--seed`, no `--out`, an `--out` that is a file or lies under one, an `--out`
folder holding files the command did not make (it never writes over what it did not
write), a missing extra. Commands, not library API: these print and exit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from pathlib import Path
from typing import NoReturn

USAGE_EXIT = 2


def fail(command: str, message: str) -> NoReturn:
    print(f"{command}: error: {message}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)


def check_counts(command: str, num_layers: int | None, seed: int) -> None:
    if num_layers is not None and num_layers < 1:
        fail(command, f"--num-layers {num_layers}: give a number of layers >= 1")
    if seed < 0:
        fail(command, f"--seed {seed}: give a seed >= 0")


def check_out(command: str, out: Path | None, written: Collection[str]) -> Path:
    """`out`, checked: given, not a file, not under a file, and (if it exists) holding
    nothing but entries this command writes (`written`: top-level names)."""
    if out is None:
        fail(command, "--out is required: the folder to write")
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == out else f"lies under the file {str(parent)!r}"
            fail(command, f"--out {str(out)!r} {where}; give a folder path")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in written)
        if foreign:
            fail(command, f"--out {str(out)!r} holds {foreign[0]!r} (and {len(foreign) - 1} "
                          f"more) that it did not write; give an empty or new folder")
    return out


def require_extra(command: str, extra: str, *modules: str) -> None:
    """One line naming the extra when one of `modules` cannot be imported (the wording of
    `ardiff.extras.missing_extra_message`, which every command's missing extra uses)."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            fail(command, f"needs the {extra!r} extra ({module} is not installed): pip install "
                          f"'ardiff[{extra}]'")
