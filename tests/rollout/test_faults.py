"""Fault injection: whatever breaks during a run, the exit code and the `--json` stats say
what happened, the KV pool is whole again, and every finished frame is in a playable file.

Each fault runs `ardiff rollout run.yaml --json stats.json` in-process (Typer's runner)
on tests/support/fault_pipelines.py:FaultPipeline, which makes 6 blocks of 2 frames
(frame f filled with the value f) and breaks as told. The video is FFV1 in .mkv
(lossless, read back with PyAV), so the test knows exactly which frames it holds. The
disk filling up is simulated in every format (`FullDisk`): the write of frame n fails with
ENOSPC and from then on no file may grow, except into room the writer frees (its space
reserve), so the file must be finished on a full disk.

The table "Run failures" in docs/errors.md is FAULTS (tests/support/fault_cases.py; one row
per distinct row text); `test_the_errors_page_table_is_the_fault_list` prints it to paste
when they differ. The
same refusals through the installed command are in tests/cli/test_rollout.py
(failure at block k, Ctrl-C) and tests/cli/test_signals.py (SIGTERM to a process group, a
second signal while the file is finished); the runner's side of each fault in
tests/engine/test_runner.py. Signals here are real ones, sent to this process while the
CLI's handlers are installed (SIGNAL_FAULTS).
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import av
import jsonschema
import numpy as np
import pytest
import yaml
from PIL import Image, ImageSequence
from typer.testing import CliRunner

from ardiff.rollout.report import STATS_SCHEMA
from ardiff.video import disk, encoders
from ardiff_cli.main import app

REPO = Path(__file__).resolve().parents[2]
ERRORS_PAGE = REPO / "docs" / "errors.md"
FAULT_PIPELINES = REPO / "tests" / "support" / "fault_pipelines.py"

from fault_cases import (
    EXACT_FORMATS,
    FAULTS,
    FRAMES,
    LOSSY_TOLERANCE,
    TABLE_HEADER,
    TABLE_RULE,
    Fault,
)
from fault_pipelines import FRAMES_PER_BLOCK, paint


# -- running a fault -----------------------------------------------------------------------------
@dataclass
class Run:
    """What one faulty run left behind."""

    exit_code: int
    stderr: str
    crashed: bool                  # an exception escaped the command
    stats: dict | None
    frames: np.ndarray | None      # the video, uint8 [N, H, W, 3]; None: no file
    partials: list[str]            # unfinished work files left beside it

    @property
    def tracebacks(self) -> int:
        return self.stderr.count("Traceback") + self.crashed

    @property
    def error_line(self) -> str:
        lines = self.stderr.splitlines()
        return lines[-1].removeprefix("error: ") if lines else ""


def write_config(folder: Path, fault: Fault) -> Path:
    data = {"pipeline": {"entry": f"{FAULT_PIPELINES}:FaultPipeline", "args": fault.args},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": FRAMES, "prompt": "a", **fault.rollout},
            "output": {"path": fault.output, "fps": 8}}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class FullDisk:
    """The disk fills up as an encoder starts frame `at`: that write fails with ENOSPC and,
    from then on, no file under `folder` may grow past what is freed (the writer's space
    reserve). Every byte an encoder writes goes through `disk._write`. `reserve_fits` False:
    the disk is nearly full from the start, so no space reserve can be allocated either
    (`disk._allocate`)."""

    def __init__(self, folder: Path, at: int, reserve_fits: bool = True) -> None:
        self.folder, self.at, self.capacity = folder, at, None
        self.reserve_fits = reserve_fits

    def used(self) -> int:
        return sum(p.lstat().st_size for p in self.folder.rglob("*") if p.is_file())

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(disk, "_write", self.write)
        if not self.reserve_fits:
            monkeypatch.setattr(disk, "_allocate", self.no_room)
        for cls in (encoders.PyAVEncoder, encoders.GifEncoder, encoders.PngDirEncoder,
                    encoders.NpyEncoder):
            monkeypatch.setattr(cls, "_encode_frame", self.encode_frame(cls._encode_frame))

    def encode_frame(self, original):
        def encode_frame(encoder, frame):
            if encoder.frames >= self.at:
                self.capacity = self.used() if self.capacity is None else self.capacity
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            original(encoder, frame)
        return encode_frame

    def write(self, fd: int, data) -> int:
        """Write what fits (a short count, as the kernel's write), ENOSPC when nothing does."""
        fits = len(data)
        if self.capacity is not None:
            end = os.fstat(fd).st_size + self.capacity - self.used()  # the file may grow to
            fits = min(fits, end - os.lseek(fd, 0, os.SEEK_CUR))
            if fits <= 0 and len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, memoryview(data)[:fits])

    @staticmethod
    def no_room(fd: int, offset: int, nbytes: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def run_fault(fault: Fault, folder: Path) -> Run:
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(folder, fault)
    args = [fault.command, str(config)]
    if fault.command == "rollout":
        args += ["--json", fault.json_path, "--quiet"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(folder)
        if fault.disk_full_after is not None:
            FullDisk(folder, fault.disk_full_after, not fault.no_reserve).install(monkeypatch)
        if fault.signal_while_finalising:
            signal_while_finalising(fault.signal_while_finalising, monkeypatch)
        result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    stats_file = folder / "stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else None
    video = folder / fault.output
    return Run(result.exit_code, result.stderr, crashed, stats,
               decode(video) if video.exists() else None,
               sorted(p.name for p in folder.rglob(".*partial*")))


def signal_while_finalising(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the encoder thread starts finishing the file, it sends `name` to the main thread,
    which is then waiting in VideoWriter.close for the file to be done."""
    close, main = encoders.Encoder.close, threading.main_thread().ident

    def close_after_a_signal(encoder):
        signal.pthread_kill(main, signal.Signals[name])
        close(encoder)

    monkeypatch.setattr(encoders.Encoder, "close", close_after_a_signal)


def decode(path: Path) -> np.ndarray:
    """The frames of a video in any output format, uint8 [N, H, W, 3]."""
    if path.is_dir():
        frames = [np.asarray(Image.open(p)) for p in sorted(path.glob("frame_*.png"))]
    elif path.suffix == ".npy":
        return np.load(path)
    elif path.suffix in (".gif", ".webp"):  # FFmpeg does not decode animated WebP
        with Image.open(path) as image:
            frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(image)]
    else:
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack(frames) if frames else np.zeros((0, 1, 1, 3), np.uint8)


def frame_values(frames: np.ndarray) -> list[float]:
    return [float(frame.mean()) for frame in frames]


def lost_frames(fault: Fault, run: Run) -> int:
    """Finished frames missing from the video (or holding the wrong picture)."""
    frames = run.frames if run.frames is not None else np.zeros((0, 1, 1, 3), np.uint8)
    tolerance = 0 if fault.output.endswith(EXACT_FORMATS) else LOSSY_TOLERANCE
    right = [abs(value - paint(i)) <= tolerance
             for i, value in enumerate(frame_values(frames[:fault.kept_frames]))]
    return fault.kept_frames - sum(right)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    """Every fault, run once, each in its own folder."""
    root = tmp_path_factory.mktemp("faults")
    return {fault.name: run_fault(fault, root / fault.name) for fault in FAULTS
            if can_run(fault)}


def can_run(fault: Fault) -> bool:
    return fault.json_path != "/dev/full" or os.path.exists("/dev/full")


# -- the tests ---------------------------------------------------------------------------------
def test_fault_names_are_unique():
    assert len({fault.name for fault in FAULTS}) == len(FAULTS)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: fault.name)
def test_the_exit_code_and_the_stats_say_what_happened(fault, runs):
    if not can_run(fault):
        pytest.skip("no /dev/full here")
    run = runs[fault.name]
    assert run.tracebacks == 0, run.stderr
    assert run.exit_code == fault.exit_code, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == (fault.exit_code != 0), run.stderr
    if fault.notice:
        assert any(re.search(fault.notice, line) for line in run.stderr.splitlines()), run.stderr
    if fault.error:
        assert re.search(fault.error, run.error_line), run.error_line
    if fault.status is None:
        return
    stats = run.stats
    jsonschema.validate(stats, STATS_SCHEMA)
    assert (stats["status"], stats["exit_code"]) == (fault.status, fault.exit_code)
    if fault.error:
        assert re.search(fault.error, stats["error"]), stats["error"]
        assert f"error: {' '.join(stats['error'].split())}" in run.stderr
    else:
        assert stats["error"] is None
    if fault.warning:
        assert any(re.search(fault.warning, w) for w in stats["warnings"]), stats["warnings"]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: fault.name)
def test_the_video_holds_exactly_the_finished_frames(fault, runs):
    if not can_run(fault):
        pytest.skip("no /dev/full here")
    run = runs[fault.name]
    if run.stats is not None:  # what the files hold, in every format, whatever broke
        assert run.stats["frames"]["written"] == fault.kept_frames
    if fault.kept_frames == 0:
        assert run.frames is None
        return
    assert run.frames.shape == (fault.kept_frames, 16, 16, 3)
    assert lost_frames(fault, run) == 0, frame_values(run.frames)
    if run.stats is not None:
        assert [o["frames"] for o in run.stats["outputs"]] == [fault.kept_frames]


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.status is not None],
                         ids=lambda fault: fault.name)
def test_every_kv_page_is_back_in_the_pool(fault, runs):
    stats = runs[fault.name].stats
    assert stats["kv"]["pages_in_use"] == 0 < stats["kv"]["pages_peak"]
    assert stats["sessions"]["resident"] == 0


def test_no_fault_shows_a_traceback_or_loses_a_frame(runs):
    done = [(fault, runs[fault.name]) for fault in FAULTS if fault.name in runs]
    assert len(done) >= len(FAULTS) - 1  # all but /dev/full where there is none
    assert sum(run.tracebacks for _fault, run in done) == 0
    assert sum(lost_frames(fault, run) for fault, run in done) == 0
    assert [run.partials for _fault, run in done if run.partials] == []


def test_the_stats_of_a_failed_run_say_which_block_failed(runs):
    for fault in FAULTS:
        if fault.name.startswith("forward-"):
            stats = runs[fault.name].stats
            block = fault.args["at_block"]
            assert stats["timing"]["blocks"] == block  # the failed block has no latency
            assert stats["frames"]["written"] == block * FRAMES_PER_BLOCK
            assert stats["sessions"]["failed"] == 1


def test_the_errors_page_table_is_the_fault_list():
    rows = []
    for fault in FAULTS:
        status = "-" if fault.status is None else f"`{fault.status}`"
        row = f"| {fault.row} | {fault.exit_code} | {status} | {fault.holds} |"
        if row not in rows:
            rows.append(row)
    lines = ERRORS_PAGE.read_text(encoding="utf-8").splitlines()
    table = "\n".join([TABLE_HEADER, TABLE_RULE, *rows])
    assert TABLE_HEADER in lines, f"docs/errors.md has no fault table; it is:\n{table}"
    start = lines.index(TABLE_HEADER)
    found = [line for line in lines[start:start + len(rows) + 3] if line.startswith("|")]
    assert found == [TABLE_HEADER, TABLE_RULE, *rows], f"docs/errors.md's table differs:\n{table}"
