"""Who may touch a rollout's files: the job's thread, or, once it is stuck in the pipeline's
code, another thread that takes them over (a watchdog) to finalise them.

    gate = FileGate(finish)
    with gate.files(): writer.write(...)   the job's thread, around every touch of the files
    for event in gate.steps(blocks): ...   each step (its `next`) runs pipeline code
    with gate.pipeline(): runner.close()   (the close hooks) likewise
    gate.close()                           the job is done: nobody takes the files any more

    report = gate.take_over(timeout_s)     another thread, while the job's thread runs
                                           pipeline code: `finish()` finalises the files
                                           with every finished block (None: not now)

A takeover keeps the files for good: if the pipeline ever returns, the job's thread waits in
`files()` until the process ends. `pipeline_since` says since when the job's thread runs
pipeline code (None: it does not); the caller decides when that has lasted too long.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.rollout.report import RolloutReport

Step = TypeVar("Step")


class FileGate:
    """A lock the job's thread holds only while it touches the files, and a takeover that
    holds it for good. `open_files` is kept by the job (files open, to be finalised);
    `taken_over` is True once another thread took the files."""

    def __init__(self, finish: Callable[[], RolloutReport]) -> None:
        self._finish = finish
        self._files = threading.Lock()
        self._done = False
        self.pipeline_since: float | None = None  # time.monotonic() the pipeline code began
        self.open_files = 0
        self.taken_over = False

    @contextmanager
    def files(self) -> Iterator[None]:
        """The job's thread touches the files (short: a block's frames, a file's end)."""
        with self._files:
            yield

    def steps(self, steps: Iterable[Step]) -> Iterator[Step]:
        """`steps`' items, each made (its `next`) as pipeline code."""
        iterator = iter(steps)
        while True:
            with self.pipeline():
                try:
                    step = next(iterator)
                except StopIteration:
                    return
            yield step

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """Run pipeline code (a block, a hook) that may never return."""
        self.pipeline_since = time.monotonic()
        try:
            yield
        finally:
            self.pipeline_since = None

    def close(self) -> None:
        """The job is over (by its own thread): a takeover from now on finds nothing."""
        with self._files:
            self._done = True

    def take_over(self, timeout_s: float) -> RolloutReport | None:
        """From another thread: if the job's thread runs pipeline code, take the files and
        return `finish()`'s report; else (it is writing, or done) None, within `timeout_s`."""
        if not self._files.acquire(timeout=timeout_s):
            return None
        if self._done or self.pipeline_since is None:
            self._files.release()
            return None
        self.taken_over = True
        return self._finish()  # the files stay taken: the job's thread must not touch them

