"""FIFOs for the tests of outputs written through (tests/rollout/test_paths.py,
tests/cli/test_written_through.py): a reader in a thread, and a late reader that turns a
command waiting for good on a FIFO (as ardiff once did) into a failed test, not a hang."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Iterator

LATE_READER_S = 10.0


def read_fifo(path: Path, into: list) -> threading.Thread:
    """A thread that reads `path` to its end and appends the bytes to `into`."""
    def read() -> None:
        with open(path, "rb") as fifo:
            into.append(fifo.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


@contextlib.contextmanager
def late_reader(path: Path) -> Iterator[None]:
    """Within: should nothing give up on the FIFO `path`, a reader opens it LATE_READER_S in."""
    timer = threading.Timer(LATE_READER_S, lambda: open(path, "rb").read())
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
