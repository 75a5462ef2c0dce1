"""Make the README's pictures with ardiff itself: docs/preview.png, report.png and serve.png.

    python docs/make_screenshots.py          (all three)
    python docs/make_screenshots.py rollout  (preview.png, report.png: matplotlib needed)
    python docs/make_screenshots.py serve    (serve.png: the serve and browser extras, chromium)

`preview.png`: the embedded default rollout runs with the live preview of `ardiff rollout
--preview` (ardiff_cli._preview) drawing into an off-screen 64 x 34 terminal. Its last
frame and progress line are rendered once more into Rich lines of cells, and each cell
is painted as a terminal paints it: a half block `▀` is its foreground colour above its
background colour, any other character is drawn in the font's glyph. `report.png`: the
same run's `--report` picture. `serve.png`: the page of `ardiff serve` in headless Chromium,
as its test drives it (tests/serve/test_page.py, which saves the screenshot where
ARDIFF_SERVE_SCREENSHOT says).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from rich.console import Console, Group

from ardiff.config.run import load_config
from ardiff.rollout.job import run_rollout
from ardiff_cli import _picture as picture
from ardiff_cli import _preview as preview

DOCS = Path(__file__).resolve().parent
PAGE_TEST = "tests/serve/test_page.py::test_the_page_starts_watches_steers_and_switches_a_session"
COLUMNS, ROWS = 64, 34           # the terminal the screenshot shows
CELL_W, CELL_H = 10, 20          # pixels of one character cell
BACKGROUND, FOREGROUND = (24, 24, 24), (220, 220, 220)


def main(parts: list[str]) -> None:
    unknown = set(parts) - {"rollout", "serve"}
    if unknown:
        raise SystemExit(f"usage: make_screenshots.py [rollout] [serve]; not {sorted(unknown)}")
    if not parts or "rollout" in parts:
        rollout_pictures()
    if not parts or "serve" in parts:
        serve_picture()


def serve_picture() -> None:
    """docs/serve.png: the page test run once more, its screenshot saved here."""
    target = DOCS / "serve.png"
    before = target.stat().st_mtime_ns if target.exists() else None
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "heavy", "-rs",
               "-p", "no:cacheprovider", PAGE_TEST]
    done = subprocess.run(command, cwd=DOCS.parent,
                          env=dict(os.environ, ARDIFF_SERVE_SCREENSHOT=str(target)))
    after = target.stat().st_mtime_ns if target.exists() else None
    if done.returncode != 0 or after is None or after == before:
        raise SystemExit(f"{target.name} not made: the page test failed or was skipped (above)")


def rollout_pictures() -> None:
    config = load_config(None, [f"output.path={DOCS / 'screenshot-run.npy'}"])
    drawing = picture.RunPicture(DOCS / "report.png", "--report")
    with open(os.devnull, "w") as sink:
        terminal = Console(file=sink, force_terminal=True, color_system="truecolor",
                           width=COLUMNS, height=ROWS)
        with preview.RolloutPreview(config.output.fps, console=terminal) as display:
            report = run_rollout(config, on_event=drawing.follow(display.update))
        (DOCS / "screenshot-run.npy").unlink()
        styled = Console(file=sink, width=COLUMNS, height=ROWS, color_system="truecolor")
        lines = styled.render_lines(Group(display.view, display.line), pad=False)
    paint(lines).save(DOCS / "preview.png")
    error = drawing.write(report)
    if error:
        raise SystemExit(error)


def paint(lines) -> Image.Image:
    """Rich lines of segments -> the terminal's pixels."""
    image = Image.new("RGB", (COLUMNS * CELL_W, len(lines) * CELL_H), BACKGROUND)
    draw, font = ImageDraw.Draw(image), ImageFont.load_default(size=CELL_H - 4)
    for row, line in enumerate(lines):
        column = 0
        for segment in line:
            for char in segment.text:
                x, y = column * CELL_W, row * CELL_H
                if char == preview.HALF_BLOCK:
                    top = segment.style.color.get_truecolor()
                    bottom = segment.style.bgcolor.get_truecolor()
                    draw.rectangle((x, y, x + CELL_W - 1, y + CELL_H // 2 - 1), fill=tuple(top))
                    draw.rectangle((x, y + CELL_H // 2, x + CELL_W - 1, y + CELL_H - 1),
                                   fill=tuple(bottom))
                elif not char.isspace():
                    draw.text((x, y + 2), char, fill=FOREGROUND, font=font)
                column += 1
    return image


if __name__ == "__main__":
    main(sys.argv[1:])
