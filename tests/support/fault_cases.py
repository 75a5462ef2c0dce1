"""The faults of tests/rollout/test_faults.py: what breaks, the exit code and `status` it must
give, and what the file must hold (the "Run failures" table of docs/errors.md is this list)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from fault_pipelines import FRAMES_PER_BLOCK, STAGES

FRAMES = 12                      # 6 blocks of 2
BLOCKS = FRAMES // FRAMES_PER_BLOCK
FULL_DISK_AFTER = 5              # frames the encoder writes before the disk is full
NEARLY_FULL_KEPT = 3             # ... of which a fragmented mp4 has on disk (x264 holds one)
LOSSY_TOLERANCE = 3              # H.264 keeps a flat grey frame within a few levels
HANG_S = 30                      # a hang that nothing stops ends (and fails its test) after
TABLE_HEADER = "| fault | exit | `status` in the stats | the file holds |"
TABLE_RULE = "|---|---|---|---|"
SWITCH = [{"frame": 0, "prompt": "a"},
          {"frame": 6, "prompt": "b", "on_switch": "reset"}]  # block 3 starts over


@dataclass(frozen=True)
class Fault:
    """One way a run breaks and what must come of it."""

    name: str
    row: str                       # the docs/errors.md row: what breaks
    exit_code: int
    status: str | None             # the stats' status; None: no stats (not a rollout)
    holds: str                     # the docs/errors.md row: what the file holds
    kept_frames: int               # frames the video must hold: 0..kept_frames-1
    error: str | None              # regex on the stats' error (or the error line)
    args: dict = field(default_factory=dict)      # FaultPipeline's
    rollout: dict = field(default_factory=dict)   # changes to the rollout section
    warning: str | None = None     # regex one warning must match
    command: str = "rollout"
    output: str = "out.mkv"
    json_path: str = "stats.json"
    disk_full_after: int | None = None
    no_reserve: bool = False       # the disk cannot spare the writer's space reserve either
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
    # -- #25: a nearly full disk (no room for the space reserve); frames.written is the files'
    Fault("disk-nearly-full-mp4", "the disk is nearly full when an `.mp4` opens (no room for "
          "the 16 MiB reserve), then fills up after n frames", 1, "failed",
          "the frames that reached the disk, in a fragmented mp4", NEARLY_FULL_KEPT,
          rf"^output\.path: writing 'out\.mp4' \(libx264\) failed after {FULL_DISK_AFTER} "
          rf"frames \(OSError: \[Errno 28\] No space left on device\); only the first "
          rf"{NEARLY_FULL_KEPT} of them could be kept in 'out\.mp4' \(the file could not be "
          rf"finished\); the disk holding '[^']+' is full: free some space, then rerun$",
          output="out.mp4", disk_full_after=FULL_DISK_AFTER, no_reserve=True),
]


# Signals reach ardiff_cli._signals' handlers: the pipeline sends one to its own process (or
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
    # -- #25: stuck pipelines (a second signal abandons the block) and KV blocks never exited.
    # HANG_S bounds each hang: if nothing stops it, the run fails instead of hanging the suite.
    *(Fault(f"hang-{how}", "a second signal while `generate_block` hangs at block k (a sleep, "
            "a Python loop)", 130, "interrupted", "every frame of blocks 0..k-1",
            3 * FRAMES_PER_BLOCK, r"^interrupted by SIGTERM$",
            {"fault": "hang", "hang": how, "at_block": 3, "hang_s": HANG_S,
             "send_signals": ["SIGTERM", "SIGINT"]},
            notice=r"^stopping now \(SIGINT\): the block in flight is abandoned; "
                   r"finalising\.\.\.$")
      for how in ("sleep", "busy")),
    Fault("close-hang", "a signal while the close hook hangs (every frame written)", 0,
          "ok", "every frame", FRAMES, None,
          {"fault": "close_hang", "hang_s": HANG_S, "send_signals": ["SIGTERM"]},
          warning=r"^interrupted by SIGTERM after every frame was written: the pipeline's "
                  r"session cleanup was cut short$",
          notice=r"^stopping now \(SIGTERM\): the pipeline's session cleanup is abandoned; "
                 r"every file is written$"),
    Fault("open-block", "a KV block `generate_block` enters and never exits, at block k", 1,
          "failed", "every frame of blocks 0..k-1", 2 * FRAMES_PER_BLOCK,
          r"^session 'stream-0' block 2: generate_block returned with a commit block of branch "
          r"'main' still open \(entered, never exited\); nothing of it was committed and its KV "
          r"pages are back in the pool; enter KV blocks with `with state.block\(\.\.\.\)`$",
          {"fault": "open_block", "at_block": 2}),
]
FAULTS += SIGNAL_FAULTS


# -- #25: one rank of a parallel job breaks (tests/launch/test_rank_faults.py runs these through
# the installed command; the table under "Parallel jobs" in docs/errors.md is this list).
RANK_TABLE_HEADER = ("| fault of one rank, or of the parent | exit | `status` in the stats "
                     "| the files hold |")


@dataclass(frozen=True)
class RankFault:
    """One way a parallel job (`--workers 2`, `--cfg-parallel 2`) breaks, and what must come of
    it: `exit_code` None and `status` None for a parent that is killed (no exit of its own, no
    stats); `error` is a regex on the stats' error and the one `error:` line."""

    name: str
    row: str
    exit_code: int | None
    status: str | None
    holds: str
    error: str | None


RANK_FAULTS = [
    RankFault("dp-sigterm", "SIGTERM to one data-parallel rank during its rollout", 130,
              "interrupted", "every frame of the blocks each rank finished",
              r"^rank 1: interrupted by SIGTERM \(stopped too: rank 0\)$"),
    RankFault("cfg-sigterm", "SIGTERM to one rank of a CFG group during its rollout", 130,
              "interrupted", "every frame of the blocks each rank finished",
              r"^rank 1: interrupted by SIGTERM \(stopped too: rank 0\)$"),
    RankFault("dp-sigkill", "SIGKILL to one rank (the OOM killer) during its rollout", 1,
              "failed", "every frame the other ranks finished (the killed rank's file in "
              "progress is lost)",
              r"^rank 1: its process was killed by SIGKILL before it reported \(stopped too: "
              r"rank 0\)$"),
    RankFault("missing-weights", "every rank fails to load its weights", 2, "failed",
              "(no video)", r"^(ranks 0, 1|rank [01]): pipeline\.args\.weights: cannot read "
                            r"'[^']*missing\.safetensors' "),  # both, or one and the stop
    RankFault("env-peer-missing", "a torchrun peer never arrives (`launcher: env`)", 1,
              "failed", "(no video)",
              r"^rank 0: could not meet the other ranks at env:// within "
              r"runtime\.parallel\.timeout_s \(3 s\): "),
    RankFault("env-port-in-use", "the rendezvous port is in use (`launcher: env`: "
              "MASTER_PORT)", 1, "failed", "(no video)",
              r"^rank 0: could not meet the other ranks at env://: the port is in use "),
    RankFault("spawn-port-in-use", "the rendezvous port is taken before rank 0 binds it "
              "(`launcher: spawn`)", 1, "failed", "(no video)",
              r"^rank 0: could not meet the other ranks at tcp://127\.0\.0\.1:\d+: the port is "
              r"in use .*\(stopped too: rank 1\)$"),
    RankFault("parent-killed-loading", "SIGKILL to `ardiff rollout` while a rank loads", None,
              None, "(no video)", None),
    RankFault("parent-killed", "SIGKILL to `ardiff rollout` during the rollout", None, None,
              "every frame of the blocks each rank finished", None),
    RankFault("hung-rank-twice", "two SIGTERMs to `ardiff rollout` while a rank's block hangs",
              130, "interrupted", "every frame of the blocks each rank finished",
              r"^interrupted by SIGTERM$"),
    # -- #25, round three: a rank stuck while it loads is failed within timeout_s.
    RankFault("load-hang", "a rank hangs while it loads its pipeline (`timeout_s: 3`)", 1,
              "failed", "(no video)",
              r"^rank 1: no progress for 3 s while it loaded its pipeline "
              r"\(runtime\.parallel\.timeout_s\); it was stopped \(stopped too: rank 0\)$"),
]
