"""The newest frame, drawn in the terminal: truecolor half-block cells through Rich.

    top pixel    ▀▀▀▀   foreground
    bottom pixel ▀▀▀▀   background

Each cell shows two pixels: `▀` in the upper pixel's colour on the lower pixel's. The frame
is scaled (nearest neighbour, square pixels) to the console's room, and a row's cells of
one colour pair are drawn as one run. `RolloutPreview` is the `on_event` of `ardiff rollout
--preview`: one Rich `Live`, the frame above the progress line, redrawn at most `fps`
times a second and in at most DRAW_BUDGET of the time (a frame that comes sooner is skipped).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.segment import ControlType, Segment
from rich.style import Style

from ardiff_cli import _progress as progress

HALF_BLOCK = "▀"
# Rich writes a segment that carries control codes as its text, unparsed and unstyled, and
# counts it as zero cells; the codes themselves are never emitted. A truecolor line of
# half blocks goes through that way, already escaped (RAW_TEXT marks it).
RAW_TEXT = ((ControlType.BELL,),)
RESERVED_ROWS = 2        # below the frame: the progress (or status) line and the cursor
DRAW_BUDGET = 0.02       # the rollout preview draws in at most 2% of the time (target: <= 5%)
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
        self._styles: dict[int, Style] = {}     # colour pair -> its Style
        self._escapes: dict[int, str] = {}      # colour pair -> its truecolor escape

    def show(self, frame: Any) -> None:
        self.frame = to_rgb(frame)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.frame is None:
            return
        rows = (options.height or console.height) - self.reserved_rows
        if rows < 1 or options.max_width < 1:
            return
        pixels = _scaled(self.frame, *fit(*self.frame.shape[:2], options.max_width, rows))
        raw = console.is_terminal and console.color_system == "truecolor" and not console.record
        for runs in cell_runs(pixels):
            if raw:  # the escapes written as they are: far less work for Rich than styles
                yield Segment(self._ansi(runs), None, RAW_TEXT)
            else:   # styled segments: recorded, exported, downsampled like any Rich text
                yield from (Segment(HALF_BLOCK * n, self._style(key)) for key, n in runs)
            yield Segment.line()

    def _style(self, key: int) -> Style:
        style = self._styles.get(key)
        if style is None:
            if len(self._styles) >= MAX_CACHED_STYLES:
                self._styles.clear()
            top, bottom = key >> 24, key & 0xFFFFFF
            style = self._styles[key] = Style(color=f"#{top:06x}", bgcolor=f"#{bottom:06x}")
        return style

    def _ansi(self, runs: list[tuple[int, int]]) -> str:
        """A line's runs as truecolor escapes (foreground the top pixel, background the
        bottom one), then a reset."""
        escapes = self._escapes
        if len(escapes) >= MAX_CACHED_STYLES:
            escapes.clear()
        parts = []
        for key, cells in runs:
            escape = escapes.get(key)
            if escape is None:
                top, bottom = key >> 24, key & 0xFFFFFF
                escape = escapes[key] = (f"\x1b[38;2;{top >> 16};{(top >> 8) & 255};"
                                         f"{top & 255};48;2;{bottom >> 16};"
                                         f"{(bottom >> 8) & 255};{bottom & 255}m")
            parts.append(escape + HALF_BLOCK * cells)
        return "".join(parts) + "\x1b[0m"


def cell_runs(pixels: np.ndarray) -> list[list[tuple[int, int]]]:
    """Pixels [2R, C, 3] -> R lines of cells, each a list of runs (colour pair
    0xRRGGBB_RRGGBB (top, bottom), cells) of one pair; computed for all lines at once."""
    keys = (_packed(pixels[0::2]) << 24) | _packed(pixels[1::2])     # [R, C]
    lines, width = keys.shape
    starts = np.ones((lines, width), dtype=bool)
    starts[:, 1:] = keys[:, 1:] != keys[:, :-1]
    line_of, column = np.nonzero(starts)                               # every line starts a run
    flat = line_of * width + column
    lengths = np.append(flat[1:], lines * width) - flat
    run_keys, lengths = keys[line_of, column].tolist(), lengths.tolist()
    bounds = np.searchsorted(line_of, np.arange(lines + 1)).tolist()
    return [list(zip(run_keys[a:b], lengths[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]


def _scaled(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Nearest-neighbour resize of [H, W, 3] to [height, width, 3]."""
    rows = np.arange(height) * frame.shape[0] // height
    cols = np.arange(width) * frame.shape[1] // width
    return frame[rows][:, cols]


def _packed(pixels: np.ndarray) -> np.ndarray:
    """[..., 3] uint8 -> [...] int64 0xRRGGBB."""
    rgb = pixels.astype(np.int64)
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


class Throttle:
    """When to draw: at most `fps` times a second, and, given `budget`, no sooner than the
    last draw's cost over `budget` after it started (a 1 ms draw with a budget of 0.03
    waits at least 33 ms), so drawing never takes more than that share of the time,
    however slow a draw gets on a busy machine. Call `ready()` before a draw and
    `drawn()` after it."""

    def __init__(self, fps: float, budget: float | None = None) -> None:
        self.interval_s, self.budget = 1.0 / fps, budget
        self._start = -float("inf")
        self._cost_s = 0.0

    def ready(self) -> bool:
        now = time.perf_counter()
        wait = self.interval_s
        if self.budget:
            wait = max(wait, self._cost_s / self.budget)
        if now - self._start < wait:
            return False
        self._start = now
        return True

    def drawn(self) -> None:
        self._cost_s = time.perf_counter() - self._start


class ProgressLine:
    """One line under the frame: `rolling out  35 / 96 frames · 61.2 frames/s · 0:00:01`.
    Plain text, so drawing it costs next to nothing beside the frame."""

    def __init__(self) -> None:
        from rich.text import Text

        self.text = Text("loading")
        self._start: float | None = None

    def update(self, event) -> None:
        if event.phase == "warmup":
            self.text.plain = "warming up"
            return
        now = time.perf_counter()
        if self._start is None:
            self._start = now
        elapsed = now - self._start
        speed = f"{event.frames_written / elapsed:.1f}" if elapsed > 0 else "-"
        self.text.plain = (f"rolling out  {event.frames_written} / {event.frames_total} "
                           f"frames · {speed} frames/s · {elapsed:.1f} s")

    def __rich__(self):
        return self.text


class RolloutPreview:
    """`ardiff rollout --preview`: the newest frame above a progress line, in one Live.

    A context manager whose `update(event)` is the job's `on_event` callback; it draws
    synchronously (no refresh thread), at most `fps` times a second.
    """

    def __init__(self, fps: float, show_progress: bool = True,
                 console: Console | None = None) -> None:
        from rich.live import Live  # only when a preview is drawn: keeps `--help` fast

        self.console = console or Console(stderr=True)
        self.view, self.line = FrameView(), ProgressLine()
        parts = [self.view, self.line] if show_progress else [self.view]
        self.throttle = Throttle(fps, DRAW_BUDGET)
        self.live = Live(Group(*parts), console=self.console, auto_refresh=False,
                         transient=True, redirect_stdout=False, redirect_stderr=False)
        self.frames_drawn = 0

    def __enter__(self) -> RolloutPreview:
        self.live.start()
        return self

    def update(self, event) -> None:
        if event.phase == "rollout" and event.block is not None:
            if not self.throttle.ready():
                return
            self.view.show(event.block.frames[-1])
            self.frames_drawn += 1
        self.line.update(event)
        self.live.refresh()
        self.throttle.drawn()

    def __exit__(self, *exc_info) -> None:
        self.live.stop()


def rollout_display(show_progress: bool, preview: bool, fps: float):
    """The `on_event` context manager of `ardiff rollout`: a preview with the progress line,
    or the progress bar alone."""
    if preview:
        return RolloutPreview(fps, show_progress)
    return progress.RolloutProgress(enabled=show_progress)
