"""The newest frame, drawn in the terminal: truecolor half-block cells through Rich.

Each character cell shows two pixels, one above the other: `▀` with the upper pixel
as its colour and the lower one as its background. The frame is scaled (nearest
neighbour, square pixels) to fit the room the console gives it, and cells of one
colour pair in a row are drawn as one run, so a frame costs a few hundred segments.

    top pixel    ▀▀▀▀   foreground
    bottom pixel ▀▀▀▀   background

`RolloutPreview` is the `on_event` callback of `ardiff rollout --preview`: one Rich
`Live` holding the frame above the progress line, redrawn at most `fps` times a
second (a frame that arrives sooner is skipped; the next one is drawn).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.segment import Segment
from rich.style import Style

from ardiff_cli import progress

HALF_BLOCK = "▀"
RESERVED_ROWS = 2        # below the frame: the progress (or status) line and the cursor
MAX_CACHED_STYLES = 4096  # colour pairs kept between frames (a frame of few colours reuses all)


def wants_preview(requested: bool, quiet: bool, json_path: str | None) -> bool:
    """Draw frames only when asked, not quiet, stdout not the JSON, and stderr a terminal."""
    return requested and not quiet and json_path != "-" and sys.stderr.isatty()


def to_rgb(frame: Any) -> np.ndarray:
    """One frame, torch (any device) or numpy, as a numpy uint8 [H, W, 3]."""
    if hasattr(frame, "detach"):
        frame = frame.detach().cpu().numpy()
    return np.ascontiguousarray(frame, dtype=np.uint8)


def fit(height: int, width: int, cols: int, rows: int) -> tuple[int, int]:
    """Pixel size (h, w) of a frame scaled to `cols` x `rows` half-block cells, aspect kept:
    w <= cols, h <= 2 * rows, h even, both at least 2 x 1."""
    scale = min(cols / width, 2 * rows / height)
    out_w = max(1, int(width * scale))
    out_h = max(2, int(height * scale) // 2 * 2)
    return out_h, out_w


class FrameView:
    """A Rich renderable of the newest frame; `show(frame)` replaces it."""

    def __init__(self, reserved_rows: int = RESERVED_ROWS) -> None:
        self.frame: np.ndarray | None = None
        self.reserved_rows = reserved_rows
        self._styles: dict[int, Style] = {}

    def show(self, frame: Any) -> None:
        self.frame = to_rgb(frame)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.frame is None:
            return
        rows = (options.height or console.height) - self.reserved_rows
        if rows < 1 or options.max_width < 1:
            return
        pixels = _scaled(self.frame, *fit(*self.frame.shape[:2], options.max_width, rows))
        for top, bottom in zip(pixels[0::2], pixels[1::2]):
            yield from self._row(top, bottom)
            yield Segment.line()

    def _row(self, top: np.ndarray, bottom: np.ndarray):
        """One line of cells: runs of one (top, bottom) colour pair as one segment."""
        keys = (_packed(top) << 24) | _packed(bottom)
        starts = np.flatnonzero(np.diff(keys)) + 1
        bounds = np.concatenate(([0], starts, [len(keys)]))
        for start, end in zip(bounds[:-1], bounds[1:]):
            yield Segment(HALF_BLOCK * int(end - start), self._style(int(keys[start])))

    def _style(self, key: int) -> Style:
        style = self._styles.get(key)
        if style is None:
            if len(self._styles) >= MAX_CACHED_STYLES:
                self._styles.clear()
            top, bottom = key >> 24, key & 0xFFFFFF
            style = self._styles[key] = Style(color=f"#{top:06x}", bgcolor=f"#{bottom:06x}")
        return style


def _scaled(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Nearest-neighbour resize of [H, W, 3] to [height, width, 3]."""
    rows = np.arange(height) * frame.shape[0] // height
    cols = np.arange(width) * frame.shape[1] // width
    return frame[rows][:, cols]


def _packed(pixels: np.ndarray) -> np.ndarray:
    """[N, 3] uint8 -> [N] int64 0xRRGGBB."""
    rgb = pixels.astype(np.int64)
    return (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]


class Throttle:
    """`ready()` is true at most `fps` times a second (the first call always)."""

    def __init__(self, fps: float) -> None:
        self.interval_s = 1.0 / fps
        self._last = -float("inf")

    def ready(self) -> bool:
        now = time.perf_counter()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        return True


class RolloutPreview:
    """`ardiff rollout --preview`: the newest frame above the progress line, in one Live.

    A context manager whose `update(event)` is the job's `on_event` callback.
    """

    def __init__(self, fps: float, show_progress: bool = True,
                 console: Console | None = None) -> None:
        from rich.live import Live  # only when a preview is drawn: keeps `--help` fast

        self.console = console or Console(stderr=True)
        self.view = FrameView()
        self.bar = progress.RolloutProgress(enabled=show_progress, console=self.console,
                                            live=False)
        self.throttle = Throttle(fps)
        self.live = Live(console=self.console, auto_refresh=False, transient=True,
                         redirect_stdout=False, redirect_stderr=False)
        self.frames_drawn = 0

    def __enter__(self) -> RolloutPreview:
        self.bar.__enter__()
        parts = [self.view] + ([self.bar.renderable] if self.bar.renderable is not None else [])
        self.live.update(Group(*parts))
        self.live.start()
        return self

    def update(self, event) -> None:
        self.bar.update(event)
        if event.phase == "rollout" and event.block is not None:
            if not self.throttle.ready():
                return
            self.view.show(event.block.frames[-1])
            self.frames_drawn += 1
        self.live.refresh()

    def __exit__(self, *exc_info) -> None:
        self.live.stop()
        self.bar.__exit__(*exc_info)


def rollout_display(show_progress: bool, preview: bool, fps: float):
    """The `on_event` context manager of `ardiff rollout`: a preview with the progress line,
    or the progress bar alone."""
    if preview:
        return RolloutPreview(fps, show_progress)
    return progress.RolloutProgress(enabled=show_progress)
