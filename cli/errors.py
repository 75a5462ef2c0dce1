"""The one error handler: expected errors print one line and exit with their code."""

from __future__ import annotations

import contextlib
import sys
import traceback
from typing import Iterator

import typer

from ardiff.errors import EXIT_INTERRUPTED, ArdiffError


@contextlib.contextmanager
def handle_errors(debug: bool) -> Iterator[None]:
    """Turn ardiff errors into `error: ...` on stderr and their exit code (DESIGN §7)."""
    try:
        yield
    except ArdiffError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _one_line(message: str) -> str:
    return " ".join(message.split())
