"""Fault injection: whatever breaks during a run, the exit code and the `--json` stats say
what happened, the KV pool is whole again, and every finished frame is in a playable file.

Each fault runs `ardiff rollout run.yaml --json stats.json` in-process (Typer's runner)
on tests/support/fault_pipelines.py:FaultPipeline, which makes 6 blocks of 2 frames
(frame f filled with the value f) and breaks as told. The video is FFV1 in .mkv
(lossless, read back with PyAV), so the test knows exactly which frames it holds; the
disk-full case writes H.264 .mp4, the format most runs use. The disk filling up is
simulated: the encoder's frame write raises OSError(ENOSPC) after some frames.

The table "Run failures" in README.md is FAULTS (one row per distinct row text);
`test_the_readme_table_is_the_fault_list` prints it to paste when they differ. The
same refusals through the installed command are in tests/cli/test_rollout.py
(failure at block k, Ctrl-C); the runner's side of each fault in tests/engine/test_runner.py.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import av
import jsonschema
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from ardiff.video import encoders
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
    Fault("disk-full", "the encoder fails (disk full) after n frames", 1, "failed",
          "the n frames encoded before", FULL_DISK_AFTER,
          rf"^output\.path: encoding 'out\.mp4' \(libx264\) failed after {FULL_DISK_AFTER} "
          rf"frames \(OSError: \[Errno 28\] No space left on device\); the {FULL_DISK_AFTER} "
          rf"frames encoded before it are kept in 'out\.mp4'; check free disk space",
          output="out.mp4", disk_full_after=FULL_DISK_AFTER),
    Fault("stats-unwritable", "the `--json` file cannot be written (disk full)", 1, None,
          "every frame", FRAMES, r"^--json: cannot write '/dev/full' \(OSError: \[Errno 28\] "
          r"No space left on device\); the video is kept", json_path="/dev/full"),
    Fault("ctrl-c", "Ctrl-C (SIGINT) during block k", 130, "interrupted",
          "every frame of blocks 0..k-1", 3 * FRAMES_PER_BLOCK, r"^interrupted$",
          {"fault": "interrupt", "at_block": 3}),
]


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


def fill_disk_after(frames: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder's write raises ENOSPC once `frames` frames are in the file."""
    write_frame = encoders.PyAVEncoder._encode_frame

    def encode_frame(self, frame):
        if self.frames >= frames:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_frame(self, frame)

    monkeypatch.setattr(encoders.PyAVEncoder, "_encode_frame", encode_frame)


def run_fault(fault: Fault, folder: Path) -> Run:
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(folder, fault)
    args = [fault.command, str(config)]
    if fault.command == "rollout":
        args += ["--json", fault.json_path, "--quiet"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(folder)
        if fault.disk_full_after is not None:
            fill_disk_after(fault.disk_full_after, monkeypatch)
        result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    stats_file = folder / "stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else None
    video = folder / fault.output
    return Run(result.exit_code, result.stderr, crashed, stats,
               decode(video) if video.exists() else None,
               sorted(p.name for p in folder.glob(".*partial*")))


def decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack(frames) if frames else np.zeros((0, 1, 1, 3), np.uint8)


def frame_values(frames: np.ndarray) -> list[float]:
    return [float(frame.mean()) for frame in frames]


def lost_frames(fault: Fault, run: Run) -> int:
    """Finished frames missing from the video (or holding the wrong picture)."""
    frames = run.frames if run.frames is not None else np.zeros((0, 1, 1, 3), np.uint8)
    tolerance = 0 if fault.output.endswith(".mkv") else LOSSY_TOLERANCE
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
