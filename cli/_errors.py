"""The one error handler: expected errors print one line and exit with their code."""

from __future__ import annotations

import contextlib
import sys
import traceback
from typing import Iterator

import typer

from ardiff.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, ArdiffError
from ardiff.extras import missing_extra_message


@contextlib.contextmanager
def handle_errors(debug: bool) -> Iterator[None]:
    """Turn ardiff errors into `error: ...` on stderr and their exit code (docs/errors.md).

    KeyboardInterrupt (Ctrl-C, or a signal through `ardiff_cli._signals`) is `error:
    interrupted [by SIGNAL]`, exit 130. SystemExit while loading or running a pipeline
    comes from its code (ardiff never exits): a failure, exit 1, not the pipeline's code.
    Commands write their output outside this block, where SystemExit keeps its meaning
    (Rich ends with exit 1 when stdout is a closed pipe).
    """
    try:
        yield
    except ArdiffError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except ModuleNotFoundError as exc:  # an optional extra not installed: one line, exit 2
        message = missing_extra_message(exc, "this command")
        if message is None:
            raise
        if debug:
            traceback.print_exc()
        print(f"error: {message}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt as exc:
        by = f" by {exc}" if str(exc) else ""
        print(f"error: interrupted{by}", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except SystemExit as exc:
        if debug:
            traceback.print_exc()
        print(f"error: pipeline: exit({exc.code!r}) was called while loading or running the "
              f"pipeline (ardiff never calls it); a pipeline must raise an exception, not exit "
              f"the process", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED) from None


def _one_line(message: str) -> str:
    return " ".join(message.split())
