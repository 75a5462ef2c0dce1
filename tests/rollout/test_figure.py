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
from ardiff.rollout.figure import check_figure_path, write_figure
from ardiff.rollout.timeline import RunTimeline


def timeline() -> RunTimeline:
    line = RunTimeline(latencies_s=[0.01, 0.02, 0.015], pages_in_use=[1, 2, 2],
                       rss_bytes=[300 << 20] * 3, frames_written=[1, 2, 3])
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
