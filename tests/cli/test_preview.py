"""`ardiff rollout --preview` and `--report`: frames drawn as half-block cells without
changing a frame; no terminal (or --quiet, --json -) means no preview and no error."""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
from extras import require_extra
from PIL import Image
from rich.console import Console

from ardiff_cli import _preview as preview

RED, BLUE, GREEN = (255, 0, 0), (0, 0, 255), (0, 128, 0)


def frame_2x4() -> np.ndarray:
    """Rows: red red blue blue / green green green green."""
    pixels = np.zeros((2, 4, 3), dtype=np.uint8)
    pixels[0, :2], pixels[0, 2:], pixels[1] = RED, BLUE, GREEN
    return pixels


def terminal(buffer: io.StringIO, width: int = 40, height: int = 20, **kwargs) -> Console:
    return Console(file=buffer, force_terminal=True, color_system="truecolor", width=width,
                   height=height, **kwargs)


@pytest.mark.parametrize("size, room, expected", [
    ((256, 256), (100, 38), (76, 76)),    # rows bound: 38 lines are 76 pixels
    ((480, 832), (80, 40), (46, 80)),     # columns bound, height even
    ((4, 4), (100, 30), (60, 60)),        # small frames are scaled up
    ((1000, 10), (80, 1), (2, 1)),        # never below one cell
])
def test_fit_keeps_the_aspect_in_the_room_given(size, room, expected):
    assert preview.fit(*size, *room) == expected


def test_a_line_of_cells_is_runs_of_one_colour_pair():
    pixels = frame_2x4()
    runs = preview.cell_runs(pixels)
    assert runs == [[(0xFF0000_008000, 2), (0x0000FF_008000, 2)]]


def test_a_frame_is_drawn_as_truecolor_half_blocks():
    buffer = io.StringIO()
    view = preview.FrameView(reserved_rows=0)
    view.show(frame_2x4())
    terminal(buffer, width=4, height=1).print(view)
    text = buffer.getvalue()
    assert text.count(preview.HALF_BLOCK) == 4
    assert "\x1b[38;2;255;0;0;48;2;0;128;0m▀▀" in text
    assert "\x1b[38;2;0;0;255;48;2;0;128;0m▀▀" in text


def test_a_recording_console_gets_styled_cells():
    """Recorded (for an SVG export) or not truecolor, the cells are styled segments."""
    console = terminal(io.StringIO(), width=4, height=1, record=True)
    view = preview.FrameView(reserved_rows=0)
    view.show(frame_2x4())
    console.print(view)
    svg = console.export_svg()
    assert "#ff0000" in svg and "#008000" in svg and "#0000ff" in svg


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_draws_at_most_fps_times_a_second(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(preview.time, "perf_counter", clock)
    throttle = preview.Throttle(fps=10.0)
    assert throttle.ready()
    clock.now += 0.09
    assert not throttle.ready()
    clock.now += 0.02
    assert throttle.ready()


def test_a_slow_draw_spaces_the_next_by_its_cost_over_the_budget(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(preview.time, "perf_counter", clock)
    throttle = preview.Throttle(fps=10.0, budget=0.02)
    assert throttle.ready()
    clock.now += 0.004           # a 4 ms draw: the next one waits 0.2 s from its start
    throttle.drawn()
    clock.now += 0.15
    assert not throttle.ready()
    clock.now += 0.05
    assert throttle.ready()


@pytest.mark.parametrize("requested, quiet, json_path, tty, expected", [
    (True, False, None, True, True), (True, False, "stats.json", True, True),
    (False, False, None, True, False), (True, True, None, True, False),
    (True, False, "-", True, False), (True, False, None, False, False),
])
def test_the_preview_needs_a_terminal_and_no_stdout_json(monkeypatch, requested, quiet,
                                                        json_path, tty, expected):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    assert preview.wants_preview(requested, quiet, json_path) is expected


def rollout(ardiff_main, tmp_path, name: str, *args: str):
    return ardiff_main("rollout", "-o", tmp_path / name, "--frames", "12", *args)


def test_preview_on_and_off_give_identical_frames(ardiff_main, tmp_path, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(preview, "wants_preview", lambda *args: True)   # as on a terminal
    monkeypatch.setattr("ardiff_cli._progress.wants_progress", lambda disabled: not disabled)
    monkeypatch.setattr(preview, "Console", lambda **kwargs: terminal(screen, 60, 30))
    shown = rollout(ardiff_main, tmp_path, "shown.npy", "--preview")
    assert shown.exit_code == 0, shown.output
    drawn = screen.getvalue()
    assert drawn.count(preview.HALF_BLOCK) >= 30 * 28 and "\x1b[38;2;" in drawn
    assert re.search(r"rolling out +\d+ / 12 frames", drawn)
    monkeypatch.undo()
    plain = rollout(ardiff_main, tmp_path, "plain.npy")
    assert plain.exit_code == 0, plain.output
    assert np.array_equal(np.load(tmp_path / "shown.npy"), np.load(tmp_path / "plain.npy"))


def test_without_a_terminal_preview_is_silently_off(ardiff_main, tmp_path):
    result = rollout(ardiff_main, tmp_path, "out.npy", "--preview")
    assert result.exit_code == 0, result.output
    assert preview.HALF_BLOCK not in result.output and "error" not in result.stderr
    assert np.load(tmp_path / "out.npy").shape[0] == 12


@pytest.mark.parametrize("suffix", [".png", ".html"])
def test_report_draws_the_run(ardiff_main, tmp_path, suffix):
    require_extra("plot")
    path = tmp_path / f"run{suffix}"
    result = rollout(ardiff_main, tmp_path, "out.npy", "--report", path, "-q")
    assert result.exit_code == 0, result.output
    if suffix == ".png":
        with Image.open(path) as image:
            image.verify()
    else:
        text = path.read_text()
        assert "<svg" in text and "frames</th><td>12 of 12 at 16 fps" in text


def test_a_bad_report_path_is_refused_before_the_run(ardiff_main, tmp_path):
    result = rollout(ardiff_main, tmp_path, "out.npy", "--report", tmp_path / "run.jpg")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: --report: '{tmp_path / 'run.jpg'}' has no "
                                     f"picture suffix; end it in .png, .svg, .html")
    assert not (tmp_path / "out.npy").exists()
