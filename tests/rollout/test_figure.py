"""The picture of a run: checked before the run (suffix, folder, matplotlib), then written as
a valid PNG, SVG or self-contained HTML. Drawing needs matplotlib (the `plot` extra): those
tests skip without it; the missing-matplotlib message does not need it."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from extras import require_extra
from PIL import Image

from ardiff.errors import ConfigError
from ardiff.rollout.figure import DPI, MIB, check_figure_path, draw_figure, write_figure
from ardiff.rollout.timeline import RunTimeline

LINE_RGB = (31, 119, 180)  # matplotlib's first colour, "C0": every series is drawn in it


def timeline(rss_mib: tuple[float, ...] = (300, 300, 300)) -> RunTimeline:
    line = RunTimeline(latencies_s=[0.01, 0.02, 0.015], pages_in_use=[1, 2, 2],
                       rss_bytes=[int(m * MIB) for m in rss_mib], frames_written=[1, 2, 3])
    line.thumbnails = [(i, np.full((8, 8, 3), 80 * i, dtype=np.uint8)) for i in range(3)]
    return line


@pytest.mark.parametrize("name, message", [
    ("run.jpg", "--report: '{p}' has no picture suffix; end it in .png, .svg, .html"),
    ("nowhere/run.png", "--report: the folder of '{p}' does not exist; create it or choose "
                        "another path"),
])
def test_a_bad_picture_path_is_refused(tmp_path, name, message):
    path = tmp_path / name
    with pytest.raises(ConfigError) as error:
        check_figure_path(path, "--report")
    assert str(error.value) == message.format(p=path)


def test_missing_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    with pytest.raises(ConfigError) as error:
        check_figure_path(tmp_path / "bench.png", "--plot")
    assert str(error.value) == ("--plot: drawing .png pictures needs matplotlib, which is not "
                                "installed; pip install 'ardiff[plot]' (or pip install "
                                "matplotlib)")


@pytest.mark.parametrize("suffix", [".png", ".svg", ".html"])
def test_the_picture_is_a_valid_file(tmp_path, suffix):
    require_extra("plot")
    path = tmp_path / f"run{suffix}"
    write_figure(timeline(), path, "a run", {"status": "ok <&>"})
    if suffix == ".png":
        with Image.open(path) as image:
            image.verify()
            assert image.size[0] >= 600 and image.size[1] >= 600
    elif suffix == ".svg":
        assert ET.parse(path).getroot().tag.endswith("svg")
    else:
        text = path.read_text()
        assert text.startswith("<!DOCTYPE html>") and "<svg" in text
        assert "ok &lt;&amp;&gt;" in text and "<?xml" not in text


def test_a_dense_run_without_pages_still_draws(tmp_path):
    require_extra("plot")
    line = timeline()
    line.pages_in_use = [None] * 3
    write_figure(line, tmp_path / "dense.png", "dense")
    with Image.open(tmp_path / "dense.png") as image:
        image.verify()


def rss_axes(figure):
    return next(axes for axes in figure.axes if axes.get_ylabel() == "RSS (MiB)")


@pytest.mark.extra("plot")
@pytest.mark.parametrize("rss_mib", [(300, 300, 300), (300.0, 300.2, 300.5), (410, 436, 520)])
def test_the_rss_panel_spans_the_data_with_a_margin(rss_mib):
    """Not from zero (the line sat on the top spine), not noise magnified: the data in the
    middle of a range at least 16 MiB wide, a margin above and below."""
    low, high = rss_axes(draw_figure(timeline(rss_mib), "rss")).get_ylim()
    assert 0 < low < min(rss_mib) and max(rss_mib) < high
    assert high - low >= 16
    assert min(rss_mib) - low >= 0.1 * (high - low) and high - max(rss_mib) >= 0.1 * (high - low)
    if max(rss_mib) - min(rss_mib) > 16:  # a real change fills most of the panel
        assert max(rss_mib) - min(rss_mib) >= 0.6 * (high - low)


@pytest.mark.extra("plot")
def test_a_steady_rss_is_drawn_mid_panel_in_mib(tmp_path):
    """The picture itself: the RSS line's pixels lie in the middle of its panel, away from
    both spines, and the tick labels read MiB with no offset ("+3e2") to add."""
    figure = draw_figure(timeline((300.0, 300.2, 300.5)), "rss")
    figure.savefig(tmp_path / "run.png", dpi=DPI)
    axes = rss_axes(figure)
    box = axes.get_window_extent()  # pixels, origin bottom left
    with Image.open(tmp_path / "run.png") as image:
        pixels = np.asarray(image.convert("RGB")).astype(int)
    top, bottom = pixels.shape[0] - int(box.y1) + 3, pixels.shape[0] - int(box.y0) - 3
    panel = pixels[top:bottom, int(box.x0) + 3:int(box.x1) - 3]
    rows = np.nonzero((np.abs(panel - LINE_RGB).sum(axis=2) < 60).any(axis=1))[0]
    assert len(rows) > 0, "no RSS line inside the panel"
    share_from_top = rows / (bottom - top)
    assert 0.25 < share_from_top.min() and share_from_top.max() < 0.75
    assert axes.yaxis.get_major_formatter().get_offset() == ""
    labels = [float(t.get_text().replace("\u2212", "-")) for t in axes.get_yticklabels()
              if t.get_text()]
    assert labels and all(280 < value < 320 for value in labels)
