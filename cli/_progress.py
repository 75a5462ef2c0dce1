"""The rollout progress bar (Rich): frames, fps, ETA; off when stderr is not a terminal."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def wants_progress(disabled: bool) -> bool:
    return not disabled and sys.stderr.isatty()


class RolloutProgress:
    """A context manager whose `update(event)` is the job's `on_event` callback."""

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled, self.console = enabled, console  # None: stderr
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> RolloutProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("frames · {task.fields[fps]} fps"), TimeElapsedColumn(),
                TimeRemainingColumn(), console=self.console or Console(stderr=True),
                transient=True)
            self._progress.__enter__()
        return self

    def update(self, event) -> None:
        if self._progress is None:
            return
        if self._task is None:
            self._task = self._progress.add_task("warming up", total=event.frames_total, fps="-")
        speed = self._progress.tasks[0].speed
        description = "warming up" if event.phase == "warmup" else "rolling out"
        self._progress.update(self._task, completed=event.frames_written,
                              description=description, fps=f"{speed:.1f}" if speed else "-")

    def __exit__(self, *exc_info) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc_info)
