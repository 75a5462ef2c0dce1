"""Outputs written through (docs/errors.md#where-outputs-go): the picture of `--report` /
`--plot` and play's action log reach a FIFO or a device whole, and a FIFO that nobody reads
is a one-line reason after the run, not a wait for good. ardiff.video.disk does the
writing; what a video does is tested through the command in tests/rollout/test_paths.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import pytest
import yaml
from extras import require_extra
from fifos import late_reader, read_fifo

from ardiff.video import disk
from ardiff_cli import _picture as picture
from ardiff_cli import _play_session as play_session


@pytest.fixture
def quick_fifo(tmp_path, monkeypatch):
    """`quick_fifo(name)`: a FIFO under tmp_path that gives up on its reader in 0.2 s."""
    monkeypatch.setattr(disk, "STREAM_WAIT_S", 0.2)

    def make(name: str) -> Path:
        os.mkfifo(tmp_path / name)
        return tmp_path / name

    return make


def fake_report() -> SimpleNamespace:
    return SimpleNamespace(to_dict=lambda: {
        "status": "ok", "run": {"pipeline": "p", "device": "cpu", "dtype": "float32"},
        "frames": {"written": 4, "requested": 4, "output_fps": 8.0},
        "timing": {"frames_per_s": None, "real_time_factor": None, "blocks": 2,
                   "block_latency_s": {"p50": None, "p95": None}},
        "kv": {}, "memory": {"peak_rss_bytes": 2**20}})


def draws_text(monkeypatch) -> None:
    """write_figure writes a line of text: what is tested is where it goes, not the drawing."""
    monkeypatch.setattr("ardiff.rollout.figure.write_figure",
                        lambda timeline, path, title, summary: Path(path).write_text(title))


@pytest.mark.extra("plot")
def test_a_picture_for_a_fifo_nobody_reads_gives_up_and_says_so(quick_fifo, monkeypatch):
    draws_text(monkeypatch)
    fifo = quick_fifo("run.svg")
    drawing = picture.RunPicture(fifo, "--report")
    with late_reader(fifo):
        message = drawing.write(fake_report())
    assert message == (f"--report: {str(fifo)!r} is a FIFO and no reader opened it within "
                       f"0.2 s; the picture was not written; start its reader first")


@pytest.mark.extra("plot")
def test_a_picture_for_a_fifo_or_a_device_is_written_into_it(quick_fifo, monkeypatch, tmp_path):
    draws_text(monkeypatch)
    fifo, got = quick_fifo("run.svg"), []
    reader = read_fifo(fifo, got)
    assert picture.RunPicture(fifo, "--plot").write(fake_report()) is None
    reader.join(timeout=10)
    assert got == [b"p \xc2\xb7 4 frames"]
    if os.path.exists("/dev/full"):
        (tmp_path / "full.svg").symlink_to("/dev/full")
        message = picture.RunPicture(tmp_path / "full.svg", "--plot").write(fake_report())
        assert message == (f"--plot: cannot write {str(tmp_path / 'full.svg')!r} (OSError: No "
                           f"space left on device); choose a writable path")


def log_session(path: Path) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(rollout=SimpleNamespace(seed=5)),
                           log_path=path, blocks=SimpleNamespace(log=[("left",), ("none",)]))


def test_an_action_log_for_a_fifo_nobody_reads_gives_up_and_says_so(quick_fifo):
    fifo = quick_fifo("game.actions.yaml")
    with late_reader(fifo):
        message = play_session._write_log(log_session(fifo), SimpleNamespace(frames_written=4),
                                          [])
    assert message == (f"--actions-out: {str(fifo)!r} is a FIFO and no reader opened it within "
                       f"0.2 s; the action log was not written; start its reader first")


def test_an_action_log_for_a_fifo_reaches_its_reader(quick_fifo, capsys):
    fifo, got = quick_fifo("game.actions.yaml"), []
    reader = read_fifo(fifo, got)
    assert play_session._write_log(log_session(fifo), SimpleNamespace(frames_written=4),
                                   []) is None
    reader.join(timeout=10)
    assert yaml.safe_load(got[0]) == {"actions": ["left", "none"]}
    assert capsys.readouterr().err.startswith(f"actions: {fifo} (2 blocks); replay: ardiff "
                                              f"rollout --seed 5 --frames 4 --actions ")


@pytest.mark.extra("plot")
def test_a_picture_the_disk_cannot_hold_keeps_the_old_file_and_leaves_nothing(tmp_path,
                                                                               monkeypatch):
    (tmp_path / "run.png").write_bytes(b"the last run's picture")

    def fills_the_disk(timeline, path, title, summary):
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ardiff.rollout.figure.write_figure", fills_the_disk)
    message = picture.RunPicture(tmp_path / "run.png", "--report").write(fake_report())

    assert message == (f"--report: cannot write {str(tmp_path / 'run.png')!r} (OSError: No "
                       f"space left on device); choose a writable path")
    assert (tmp_path / "run.png").read_bytes() == b"the last run's picture"
    assert os.listdir(tmp_path) == ["run.png"]  # no half picture, no work file


@pytest.mark.extra("plot")
def test_a_picture_through_a_symlink_replaces_the_target_whole(tmp_path, monkeypatch):
    draws_text(monkeypatch)
    (tmp_path / "real.svg").write_text("old")
    (tmp_path / "run.svg").symlink_to("real.svg")
    assert picture.RunPicture(tmp_path / "run.svg", "--report").write(fake_report()) is None
    assert (tmp_path / "run.svg").is_symlink()
    assert (tmp_path / "real.svg").read_text() == "p \xb7 4 frames"
    assert sorted(os.listdir(tmp_path)) == ["real.svg", "run.svg"]


def test_an_action_log_the_disk_cannot_hold_keeps_the_old_file_and_names_the_users_path(
        tmp_path, monkeypatch):
    log = tmp_path / "game.actions.yaml"
    log.write_text("actions: [up]\n")

    def fills_the_disk(self, data, *args, **kwargs):
        Path.write_bytes(self, data.encode()[:5])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", fills_the_disk)
    message = play_session._write_log(log_session(log), SimpleNamespace(frames_written=4), [])

    assert message == (f"--actions-out: cannot write {str(log)!r} (OSError: No space left on "
                       f"device); choose a writable path")
    assert log.read_text() == "actions: [up]\n"
    assert os.listdir(tmp_path) == ["game.actions.yaml"]


def test_a_picture_through_a_symlink_to_a_file_of_another_suffix_keeps_its_format(tmp_path):
    require_extra("plot")
    (tmp_path / "picture").write_text("old")
    (tmp_path / "run.svg").symlink_to("picture")
    assert picture.RunPicture(tmp_path / "run.svg", "--report").write(fake_report()) is None
    assert (tmp_path / "picture").read_text().lstrip().startswith("<?xml")
    assert sorted(os.listdir(tmp_path)) == ["picture", "run.svg"]


# -- #25, round three: an output that is a symlink to /dev/stdout ----------------------------
# /dev/stdout leads to /proc/self/fd/1, a link the kernel follows to the pipe or terminal but
# realpath cannot (it names 'pipe:[N]'): such an output is written into as a direct FIFO or
# device is, and one that leads to neither (a socket) is refused before any work.

@contextlib.contextmanager
def pipe_link(link: Path) -> Iterator[list]:
    """`link`: a symlink to /proc/self/fd/W, W the write end of a pipe this test reads (as
    /dev/stdout is, with stdout a pipe). Yields what came through, whole once it ends."""
    read_end, write_end = os.pipe()
    link.symlink_to(f"/proc/self/fd/{write_end}")
    got: list = []

    def drain() -> None:
        chunks = []
        while chunk := os.read(read_end, 1 << 16):
            chunks.append(chunk)
        got.append(b"".join(chunks))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield got
    finally:
        os.close(write_end)  # the command closed its own: the reader sees the end
        reader.join(timeout=10)
        os.close(read_end)


def test_a_video_through_a_symlink_to_stdout_reaches_it(ardiff_main, tmp_path):
    with pipe_link(tmp_path / "out.npy") as got:
        result = ardiff_main("rollout", "--frames", "3", "-o", tmp_path / "out.npy", "--json",
                             tmp_path / "stats.json", "-q")
    assert result.exit_code == 0, result.output
    frames = np.load(io.BytesIO(got[0]))
    assert frames.shape[0] == json.loads((tmp_path / "stats.json").read_text())["frames"][
        "written"] > 0
    assert sorted(os.listdir(tmp_path)) == ["out.npy", "stats.json"]


def test_the_stats_through_a_symlink_to_stdout_reach_it(ardiff_main, tmp_path):
    with pipe_link(tmp_path / "stats.json") as got:
        result = ardiff_main("rollout", "--frames", "3", "-o", tmp_path / "out.npy", "--json",
                             tmp_path / "stats.json", "-q")
    assert result.exit_code == 0, result.output
    assert json.loads(got[0])["status"] == "ok"


@pytest.mark.parametrize("flag", ["-o", "--json",
                                  pytest.param("--report", marks=pytest.mark.extra("plot"))])
def test_an_output_that_leads_to_a_socket_is_refused_before_any_work(ardiff_main, tmp_path,
                                                                     flag):
    name = {"-o": "out.npy", "--json": "stats.json", "--report": "run.svg"}[flag]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        (tmp_path / name).symlink_to(f"/proc/self/fd/{theirs.fileno()}")
        args = {"-o": tmp_path / "out.npy", **{flag: tmp_path / name}}
        result = ardiff_main("rollout", "--frames", "3", *[x for pair in args.items()
                                                            for x in pair], "-q")
    field = "output.path" if flag == "-o" else flag
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"error: {field}: {str(tmp_path / name)!r} leads to a socket; ardiff writes into "
        f"files, FIFOs and devices; pick another path")
    assert os.listdir(tmp_path) == [name]


def test_an_output_that_leads_to_stdout_is_refused_with_json_dash(ardiff_main, tmp_path):
    """`--json -` gives stdout to the stats alone (the rest goes to stderr, fd 1 included), so
    a video through a link to /dev/stdout would have gone to stderr."""
    (tmp_path / "out.npy").symlink_to("/dev/stdout")
    result = ardiff_main("rollout", "--frames", "3", "-o", tmp_path / "out.npy", "--json", "-")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"error: output.path: {str(tmp_path / 'out.npy')!r} leads to stdout, which --json - "
        f"gives to the stats alone; write it to a file, or the stats with --json PATH")
    assert result.stdout == ""
