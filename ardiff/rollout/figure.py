"""A picture of a run: per-block latency, KV pages in use and RSS, and a contact sheet.

    check_figure_path(path, "--report")          before the run: format and matplotlib
    write_figure(timeline, path, title, summary)  after it: .png, .svg or .html

    +-----------------------------------------------+
    | latency per block (ms)                        |
    | KV pages in use                               |
    | RSS (MiB)                                     |
    | [frame 0] [frame 13] [frame 27] ... [frame N] |
    +-----------------------------------------------+

matplotlib (an optional extra, `ardiff[plot]`) is used through `Figure` only: no pyplot,
no GUI backend, safe in threads and on servers. The .html inlines the SVG and a summary.
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

import numpy as np

from ardiff.errors import ConfigError, OutputPathError
from ardiff.rollout.timeline import RunTimeline

FIGURE_SUFFIXES = (".png", ".svg", ".html")
INSTALL_HINT = "pip install 'ardiff[plot]' (or pip install matplotlib)"
MIB = 1024 * 1024
FIGURE_INCHES = (9.0, 9.0)
DPI = 100
# RSS is hundreds of MiB that move by a few: its panel spans the data, but at least this
# much (MiB, or this share of the peak), so a steady RSS reads as a steady line mid-panel
# rather than as noise magnified; RSS_MARGIN of that span is left above and below.
RSS_MIN_SPAN_MIB = 16.0
RSS_MIN_SPAN_SHARE = 0.05
RSS_MARGIN = 0.15


def check_figure_path(path: str | Path, flag: str) -> Path:
    """The figure's path, checked before any work: a known suffix, matplotlib importable.
    Raises ConfigError (exit 2) naming `flag`, the value and the fix."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise ConfigError(f"{flag}: {str(path)!r} has no picture suffix; end it in "
                          f"{', '.join(FIGURE_SUFFIXES)}")
    if not path.parent.is_dir():
        raise ConfigError(f"{flag}: the folder of {str(path)!r} does not exist; create it "
                          f"or choose another path")
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError as exc:
        raise ConfigError(f"{flag}: drawing {path.suffix} pictures needs matplotlib, which is "
                          f"not installed; {INSTALL_HINT}") from exc
    return path


def write_figure(timeline: RunTimeline, path: str | Path, title: str,
                 summary: dict[str, str] | None = None) -> None:
    """Draw `timeline` to `path` (.png, .svg or .html with `summary` as a table).
    Raises OutputPathError when the file cannot be written."""
    path = Path(path).expanduser()
    figure = draw_figure(timeline, title)
    try:
        if path.suffix.lower() == ".html":
            path.write_text(_html(figure, title, summary or {}), encoding="utf-8")
        else:
            figure.savefig(path, dpi=DPI)
    except OSError as exc:
        raise OutputPathError(f"cannot write the picture {str(path)!r} ({type(exc).__name__}: "
                              f"{exc.strerror or exc}); choose a writable path") from exc


def draw_figure(timeline: RunTimeline, title: str) -> Any:
    """The run's figure (a matplotlib Figure): three series over the blocks, then frames."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, layout="constrained")
    figure.suptitle(title)
    grid = figure.add_gridspec(4, 1, height_ratios=(1, 1, 1, 1.3))
    blocks = np.arange(timeline.blocks)
    latency = figure.add_subplot(grid[0])
    _series(latency, blocks, np.array(timeline.latencies_s) * 1000, "latency per block (ms)")
    pages = figure.add_subplot(grid[1], sharex=latency)
    in_use = [np.nan if p is None else p for p in timeline.pages_in_use]
    _series(pages, blocks, np.array(in_use, dtype=float), "KV pages in use")
    rss = figure.add_subplot(grid[2], sharex=latency)
    rss_mib = np.array(timeline.rss_bytes, dtype=float) / MIB
    _series(rss, blocks, rss_mib, "RSS (MiB)", rss_limits_mib(rss_mib))
    rss.ticklabel_format(axis="y", style="plain", useOffset=False)  # MiB as read, no "+4e2"
    rss.set_xlabel("AR block")
    _contact_sheet(figure.add_subplot(grid[3]), timeline.thumbnails)
    return figure


def rss_limits_mib(rss_mib: np.ndarray) -> tuple[float, float] | None:
    """The RSS panel's y range in MiB: the data's, widened to at least RSS_MIN_SPAN_MIB (or
    RSS_MIN_SPAN_SHARE of the peak) around its middle, plus RSS_MARGIN of it each side, never
    below 0. None when nothing was measured."""
    measured = rss_mib[~np.isnan(rss_mib)]
    if len(measured) == 0:
        return None
    low, high = float(measured.min()), float(measured.max())
    span = max(high - low, RSS_MIN_SPAN_MIB, RSS_MIN_SPAN_SHARE * high)
    middle = (low + high) / 2
    bottom = max(0.0, middle - span * (0.5 + RSS_MARGIN))
    return bottom, bottom + span * (1 + 2 * RSS_MARGIN)


def _series(axes: Any, x: np.ndarray, y: np.ndarray, label: str,
            limits: tuple[float, float] | None = None) -> None:
    """One series; its y axis from zero unless `limits` are given."""
    axes.plot(x, y, linewidth=1.2, marker="." if len(x) <= 64 else None)
    axes.set_ylabel(label)
    if limits is None:
        axes.set_ylim(bottom=0)  # from zero: a flat line reads as flat, not as noise magnified
    else:
        axes.set_ylim(*limits)
    axes.grid(True, alpha=0.3)
    if len(y) == 0 or np.isnan(y).all():
        axes.text(0.5, 0.5, "not measured (dense cache)" if len(y) else "no blocks",
                  transform=axes.transAxes, ha="center", va="center")


def _contact_sheet(axes: Any, thumbnails: list[tuple[int, np.ndarray]]) -> None:
    """The kept frames side by side, each titled with its index."""
    axes.set_axis_off()
    if not thumbnails:
        axes.text(0.5, 0.5, "no frames", ha="center", va="center")
        return
    height = max(frame.shape[0] for _, frame in thumbnails)
    gap = max(1, height // 32)
    tiles, starts, x = [], [], 0
    for _, frame in thumbnails:
        tile = np.zeros((height, frame.shape[1] + gap, 3), dtype=np.uint8)
        tile[:frame.shape[0], :frame.shape[1]] = frame
        tiles.append(tile)
        starts.append(x + frame.shape[1] / 2)
        x += tile.shape[1]
    axes.imshow(np.concatenate(tiles, axis=1), interpolation="nearest")
    for (index, _), center in zip(thumbnails, starts):
        axes.text(center, -2, f"frame {index}", ha="center", va="bottom", fontsize=8)


def _html(figure: Any, title: str, summary: dict[str, str]) -> str:
    svg = io.StringIO()
    figure.savefig(svg, format="svg")
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in summary.items())
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title></head><body style='font-family:sans-serif'>\n<h1>{html.escape(title)}"
            f"</h1>\n<table>{rows}</table>\n{_strip_xml_header(svg.getvalue())}\n</body></html>\n")


def _strip_xml_header(svg: str) -> str:
    """Inline SVG in HTML: from the <svg> element on (no XML declaration, no DOCTYPE)."""
    return svg[svg.find("<svg"):]
