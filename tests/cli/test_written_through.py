"""Outputs written through (docs/errors.md#where-outputs-go): the picture of `--report` /
`--plot` and play's action log reach a FIFO or a device whole, and a FIFO that nobody reads
is a one-line reason after the run, not a wait for good. ardiff.video.disk does the
writing; what a video does is tested through the command in tests/rollout/test_paths.py."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
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


def test_a_picture_for_a_fifo_nobody_reads_gives_up_and_says_so(quick_fifo, monkeypatch):
    draws_text(monkeypatch)
    fifo = quick_fifo("run.svg")
    drawing = picture.RunPicture(fifo, "--report")
    with late_reader(fifo):
        message = drawing.write(fake_report())
    assert message == (f"--report: {str(fifo)!r} is a FIFO and no reader opened it within "
                       f"0.2 s; the picture was not written; start its reader first")


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
    pytest.importorskip("matplotlib")
    (tmp_path / "picture").write_text("old")
    (tmp_path / "run.svg").symlink_to("picture")
    assert picture.RunPicture(tmp_path / "run.svg", "--report").write(fake_report()) is None
    assert (tmp_path / "picture").read_text().lstrip().startswith("<?xml")
    assert sorted(os.listdir(tmp_path)) == ["picture", "run.svg"]
