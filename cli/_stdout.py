"""What ardiff writes to stdout, and nothing else: `--json -` gets stdout to itself.

    with json_stdout(json_path == "-") as json_out:    # a command's whole run
        ...                                           # print() and os.write(1, ...) -> stderr
        print(json.dumps(data), file=json_out)        # -> the real stdout

    fd 1 (stdout) ──dup──> saved ──> json_out      the JSON alone
    fd 1 <──dup2── fd 2 (stderr)                    a pipeline's print, a library's C write

While active, descriptor 1 is a copy of descriptor 2 and `sys.stdout` is `sys.stderr`, so
whatever a pipeline, a library or a rank process started meanwhile prints (Python or C,
buffered in C's stdio included: flushed at the end) lands on stderr; the JSON goes to a
copy of the original stdout. Write errors on stdout carry STDOUT_MARK, so `main` tells a
closed pipe or a full disk behind stdout from any other OSError.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from typing import Any, Iterator

STDOUT_MARK = "ardiff_stdout"  # set on an OSError raised by writing stdout
STDOUT_FD, STDERR_FD = 1, 2


class MarkedStdout:
    """A stream as it is, except that its write errors carry STDOUT_MARK."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text):
        return self._marked(self._stream.write, text)

    def writelines(self, lines):
        return self._marked(self._stream.writelines, lines)

    def flush(self):
        return self._marked(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    @staticmethod
    def _marked(call, *args):
        try:
            return call(*args)
        except OSError as exc:
            setattr(exc, STDOUT_MARK, True)
            raise


class _DescriptorWriter:
    """Text written straight to a descriptor: no buffer left to flush (or fail) at exit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, text: str) -> int:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(self.fd, data):]
        return len(text)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self.fd


@contextlib.contextmanager
def json_stdout(active: bool) -> Iterator[Any]:
    """Yields the stream the JSON goes to; while `active`, everything else written to stdout
    (Python's sys.stdout, descriptor 1) goes to stderr. Inactive: yields sys.stdout."""
    if not active:
        yield sys.stdout
        return
    original = sys.stdout
    _flush(original)
    saved = _redirect_descriptor()
    sys.stdout = sys.stderr
    try:
        if saved is not None and _descriptor(original) == STDOUT_FD:
            yield MarkedStdout(_DescriptorWriter(saved))
        else:  # no descriptor behind sys.stdout (a test's captured stream): write to it
            yield original
    finally:
        _flush(sys.stdout)
        _flush_c_stdio()  # what a library printf'd, before descriptor 1 is stdout again
        sys.stdout = original
        if saved is not None:
            os.dup2(saved, STDOUT_FD)
            os.close(saved)


def _redirect_descriptor() -> int | None:
    """Point descriptor 1 at stderr (or /dev/null when there is none); the saved original,
    or None when descriptor 1 is not open."""
    try:
        saved = os.dup(STDOUT_FD)
    except OSError:
        return None
    try:
        os.dup2(STDERR_FD, STDOUT_FD)
    except OSError:  # stderr closed: what would go there is lost, not added to the JSON
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, STDOUT_FD)
        os.close(devnull)
    return saved


def _descriptor(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _flush(stream: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


def _flush_c_stdio() -> None:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(None).fflush(None)
