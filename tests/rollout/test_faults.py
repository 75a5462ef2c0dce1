"""Fault injection: whatever breaks during a run, the exit code and the `--json` stats say
what happened, the KV pool is whole again, and every finished frame is in a playable file.

Each fault runs `ardiff rollout run.yaml --json stats.json` in-process (Typer's runner)
on tests/support/fault_pipelines.py:FaultPipeline, which makes 6 blocks of 2 frames
(frame f filled with the value f) and breaks as told. The video is FFV1 in .mkv
(lossless, read back with PyAV), so the test knows exactly which frames it holds. The
disk filling up is simulated in every format (`FullDisk`): the write of frame n fails with
ENOSPC and from then on no file may grow, except into room the writer frees (its space
reserve), so the file must be finished on a full disk.

The table "Run failures" in README.md is FAULTS (one row per distinct row text);
`test_the_readme_table_is_the_fault_list` prints it to paste when they differ. The
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
import random
import re
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import av
import jsonschema
import numpy as np
import pytest
import yaml
from PIL import Image, ImageSequence
from typer.testing import CliRunner

from ardiff.video import disk, encoders
from ardiff.rollout.report import STATS_SCHEMA
from ardiff_cli.main import app

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FAULT_PIPELINES = REPO / "tests" / "support" / "fault_pipelines.py"

from fault_pipelines import FRAMES_PER_BLOCK, STAGES, paint

FRAMES = 12                      # 6 blocks of 2
BLOCKS = FRAMES // FRAMES_PER_BLOCK
FULL_DISK_AFTER = 5              # frames the encoder writes before the disk is full
LOSSY_TOLERANCE = 3              # H.264 keeps a flat grey frame within a few levels
TABLE_HEADER = "| fault | exit | `status` in the stats | the file holds |"
TABLE_RULE = "|---|---|---|---|"
SWITCH = [{"frame": 0, "prompt": "a"},
          {"frame": 6, "prompt": "b", "on_switch": "reset"}]  # block 3 starts over


@dataclass(frozen=True)
class Fault:
    """One way a run breaks and what must come of it."""

    name: str
    row: str                       # the README row: what breaks
    exit_code: int
    status: str | None             # the stats' status; None: no stats (not a rollout)
    holds: str                     # the README row: what the file holds
    kept_frames: int               # frames the video must hold: 0..kept_frames-1
    error: str | None              # regex on the stats' error (or the error line)
    args: dict = field(default_factory=dict)      # FaultPipeline's
    rollout: dict = field(default_factory=dict)   # changes to the rollout section
    warning: str | None = None     # regex one warning must match
    command: str = "rollout"
    output: str = "out.mkv"
    json_path: str = "stats.json"
    disk_full_after: int | None = None
    signal_while_finalising: str | None = None  # sent as the encoder finishes the file
    notice: str | None = None      # regex one stderr line must match (what the user is told)


def forward_fault(seed: int) -> Fault:
    """generate_block raises at a block and a stage drawn from `seed`."""
    rng = random.Random(seed)
    block, stage = rng.randrange(BLOCKS), rng.choice(STAGES)
    return Fault(f"forward-{seed}-block{block}-{stage}", "`generate_block` raises at block k",
                 1, "failed", "every frame of blocks 0..k-1", block * FRAMES_PER_BLOCK,
                 rf"^session 'stream-0' block {block}: generate_block raised InjectedFault: "
                 rf"forward of block {block} \({stage}\)$",
                 {"fault": "forward", "at_block": block, "stage": stage})


def output_fault(kind: str, error: str) -> Fault:
    return Fault(f"output-{kind}", "a `BlockOutput` of wrong dtype or shape, or a frame size "
                 "that changes, at block k", 1, "failed", "every frame of blocks 0..k-1",
                 2 * FRAMES_PER_BLOCK, rf"^session 'stream-0' block 2: BlockOutput\.{error}",
                 {"fault": kind, "at_block": 2})


def disk_full_fault(output: str, codec: str, name: str | None = None) -> Fault:
    """The disk fills up while frame FULL_DISK_AFTER is written to `output`."""
    shown = re.escape(output.rstrip("/"))
    kind = "a PNG folder" if output.endswith("/") else f"`{Path(output).suffix}`"
    return Fault(name or f"disk-full-{codec}", f"the disk fills up after n frames ({kind})", 1,
                 "failed", "the n frames encoded before", FULL_DISK_AFTER,
                 rf"^output\.path: writing '{shown}' \({codec}\) failed after {FULL_DISK_AFTER} "
                 rf"frames \(OSError: \[Errno 28\] No space left on device\); the "
                 rf"{FULL_DISK_AFTER} frames encoded before it are kept in '{shown}'; the disk "
                 rf"holding '[^']+' is full: free some space, then rerun$",
                 output=output, disk_full_after=FULL_DISK_AFTER)


DISK_FULL_FORMATS = [("out.mkv", "ffv1"), ("out.webm", "libvpx-vp9"), ("out.gif", "gif"),
                     ("out.webp", "libwebp"), ("out.npy", "npy"), ("frames/", "png")]
EXACT_FORMATS = (".mkv", ".npy", ".gif", "/")  # lossless, or a flat frame in a palette

FAULTS = [
    *(forward_fault(seed) for seed in range(8)),
    output_fault("dtype", r"frames is torch\.float32; expected torch\.uint8"),
    output_fault("shape", r"frames has shape \(2, 16, 16, 4\); expected \[F > 0, H > 0, W > 0, "
                          r"3\]"),
    output_fault("size", r"frames are 18x18 \(HxW\); earlier blocks of this session were "
                         r"16x16"),
    Fault("reset-hook", "the reset hook raises (a prompt switch with `on_switch: reset`)", 1,
          "failed", "every frame before the switch", 6,
          r"^releasing session 'stream-0' \(reset\): InjectedFault: reset hook of 'stream-0'$",
          {"fault": "reset_hook"}, {"prompt": SWITCH}),
    Fault("close-hook", "the close hook raises (after a stream's last block)", 1, "failed",
          "every frame", FRAMES,
          r"^releasing session 'stream-0' \(closed\): InjectedFault: close hook of 'stream-0'$",
          {"fault": "close_hook"},
          warning=r"^warmup failed: .*close hook of '__ardiff_warmup__'; continuing"),
    Fault("warmup-rollout", "warmup raises (`ardiff rollout`: a warning)", 0, "ok",
          "every frame", FRAMES, None, {"fault": "warmup"},
          warning=r"^warmup failed: PipelineError: session '__ardiff_warmup__' block 0: "
                  r"generate_block raised InjectedFault: warmup block 0; continuing without "
                  r"warmup$"),
    Fault("warmup-command", "warmup raises (`ardiff warmup`)", 1, None, "(no video)", 0,
          r"^warmup failed: PipelineError: .*InjectedFault: warmup block 0$",
          {"fault": "warmup"}, command="warmup"),
    disk_full_fault("out.mp4", "libx264", name="disk-full"),
    Fault("stats-unwritable", "the `--json` file cannot be written (disk full)", 1, None,
          "every frame", FRAMES, r"^--json: cannot write '/dev/full' \(OSError: \[Errno 28\] "
          r"No space left on device\); the video is kept", json_path="/dev/full"),
    Fault("ctrl-c", "`generate_block` raises KeyboardInterrupt at block k", 130, "interrupted",
          "every frame of blocks 0..k-1", 3 * FRAMES_PER_BLOCK, r"^interrupted$",
          {"fault": "interrupt", "at_block": 3}),
    *(disk_full_fault(output, codec) for output, codec in DISK_FULL_FORMATS),
]


# Signals reach ardiff_cli.signals' handlers: the pipeline sends one to its own process (or
# the encoder thread to the main thread, while it finishes the file), as `kill` or a second
# Ctrl-C would. Real process groups: tests/cli/test_signals.py.
SIGNAL_FAULTS = [
    *(Fault(f"signal-{name}", "SIGINT, SIGTERM or SIGHUP during block k", 130, "interrupted",
            "every frame of blocks 0..k (the block in flight finishes)", 4 * FRAMES_PER_BLOCK,
            rf"^interrupted by {name}$", {"fault": "signal", "signal_name": name, "at_block": 3},
            notice=rf"^stopping \({name}\): finishing the current block, then finalising\.\.\.$")
      for name in ("SIGINT", "SIGTERM", "SIGHUP")),
    Fault("signal-twice", "a second signal while the files are finalised", 130, "interrupted",
          "every frame of blocks 0..k", 4 * FRAMES_PER_BLOCK, r"^interrupted by SIGTERM$",
          {"fault": "signal", "signal_name": "SIGTERM", "at_block": 3},
          signal_while_finalising="SIGINT",
          notice=r"^finalising\.\.\. \(SIGINT waits until every file is written\)$"),
    Fault("signal-finalising", "a signal while the files of a finished run are finalised", 0,
          "ok", "every frame", FRAMES, None, signal_while_finalising="SIGHUP",
          notice=r"^finalising\.\.\. \(SIGHUP waits until every file is written\)$"),
    Fault("signal-warmup", "SIGINT, SIGTERM or SIGHUP during warmup", 130, "interrupted",
          "(no video)", 0, r"^interrupted by SIGHUP$",
          {"fault": "signal_warmup", "signal_name": "SIGHUP"}),
    Fault("signal-load", "SIGINT, SIGTERM or SIGHUP while the pipeline loads", 130, None,
          "(no video)", 0, r"^interrupted by SIGTERM$",
          {"fault": "signal_load", "signal_name": "SIGTERM"}),
    Fault("exit", "`generate_block` calls `sys.exit(n)` at block k", 1, "failed",
          "every frame of blocks 0..k-1", 2 * FRAMES_PER_BLOCK,
          r"^session 'stream-0' block 2: generate_block called exit\(5\); a pipeline must "
          r"raise an exception, not exit the process$",
          {"fault": "exit", "at_block": 2, "exit_code": 5}),
]
FAULTS += SIGNAL_FAULTS


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
    reserve). Every byte an encoder writes goes through `disk._write`."""

    def __init__(self, folder: Path, at: int) -> None:
        self.folder, self.at, self.capacity = folder, at, None

    def used(self) -> int:
        return sum(p.lstat().st_size for p in self.folder.rglob("*") if p.is_file())

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(disk, "_write", self.write)
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
        if self.capacity is not None:
            growth = os.lseek(fd, 0, os.SEEK_CUR) + len(data) - os.fstat(fd).st_size
            if growth > self.capacity - self.used():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


def run_fault(fault: Fault, folder: Path) -> Run:
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(folder, fault)
    args = [fault.command, str(config)]
    if fault.command == "rollout":
        args += ["--json", fault.json_path, "--quiet"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(folder)
        if fault.disk_full_after is not None:
            FullDisk(folder, fault.disk_full_after).install(monkeypatch)
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
    if fault.kept_frames == 0:
        assert run.frames is None
        return
    assert run.frames.shape == (fault.kept_frames, 16, 16, 3)
    assert lost_frames(fault, run) == 0, frame_values(run.frames)
    if run.stats is not None:
        assert [o["frames"] for o in run.stats["outputs"]] == [fault.kept_frames]
        assert run.stats["frames"]["written"] >= fault.kept_frames


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


def test_the_readme_table_is_the_fault_list():
    rows = []
    for fault in FAULTS:
        status = "-" if fault.status is None else f"`{fault.status}`"
        row = f"| {fault.row} | {fault.exit_code} | {status} | {fault.holds} |"
        if row not in rows:
            rows.append(row)
    lines = README.read_text(encoding="utf-8").splitlines()
    table = "\n".join([TABLE_HEADER, TABLE_RULE, *rows])
    assert TABLE_HEADER in lines, f"README.md has no fault table; it is:\n{table}"
    start = lines.index(TABLE_HEADER)
    found = [line for line in lines[start:start + len(rows) + 3] if line.startswith("|")]
    assert found == [TABLE_HEADER, TABLE_RULE, *rows], f"README.md's table differs:\n{table}"
