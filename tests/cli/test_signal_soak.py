"""Soak: 20 rollouts killed at random moments with random signals leave playable files and
valid stats that agree with them.

Each rollout is a real process in its own session running the `ardiff` script's main(),
signalled with `os.killpg`: SIGINT, SIGTERM or SIGHUP at a random moment after its first
block (during a block, while a file is finished, or after the run ended), and in some runs a
second signal a few milliseconds later. A seeded RNG draws the signals, the moments and the
formats (.mp4 read back with PyAV, .mkv with PyAV, .npy with numpy), so a failing case can
be run again; which phase a moment lands in depends on the machine's timing.

The processes are forked from one *zygote*: this file run as a script, which has imported
torch, PyAV and ardiff once (a fresh interpreter spends ~1.3 s importing them, most of this
soak 20 times over; a forked rollout starts in ~0.1 s). It runs no torch op before forking,
so forking it is safe. tests/cli/test_signals.py signals the installed command itself.

    zygote stdin:  {"cwd": ..., "args": [...], "stderr": PATH}  ->  stdout: the child's pid
                   {"wait": pid}                                ->  stdout: its exit code
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import av
import jsonschema
import numpy as np
import pytest
import yaml

from ardiff.rollout.report import STATS_SCHEMA

REPO = Path(__file__).resolve().parents[2]
FAULT_PIPELINES = REPO / "tests" / "support" / "fault_pipelines.py"
SEED = 17
RUNS = 20
FRAMES = 16                 # 8 blocks of 2
BLOCK_SLEEP_S = 0.015       # a block's time: the run lasts ~FRAMES / 2 * BLOCK_SLEEP_S
FRAME_SIZE = 32
FORMATS = ("out.mp4", "out.mkv", "out.npy")
SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
SECOND_SIGNAL_SHARE = 0.5
LOSSY_TOLERANCE = 3         # H.264 keeps a flat grey frame within a few levels
WAIT_S = 30


@dataclass(frozen=True)
class Kill:
    """One soak run: where it writes, and which signals reach it when."""

    output: str
    first: str
    delay_s: float          # after the first block is made
    second: str | None
    second_delay_s: float   # after the first signal


def draw_kills(rng: random.Random) -> list[Kill]:
    run_s = FRAMES // 2 * BLOCK_SLEEP_S
    return [Kill(rng.choice(FORMATS), rng.choice(SIGNALS), rng.uniform(0, 1.3 * run_s),
                 rng.choice(SIGNALS) if rng.random() < SECOND_SIGNAL_SHARE else None,
                 rng.uniform(0, 0.01))
            for _ in range(RUNS)]


# -- the zygote (this file as a script) ---------------------------------------------------------
def serve() -> None:
    import torch  # noqa: F401 - what every rollout imports, once

    import ardiff.rollout.job  # noqa: F401
    import ardiff.video.writer  # noqa: F401
    import ardiff_cli.main  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        if "wait" in request:
            _pid, status = os.waitpid(request["wait"], 0)
            print(os.waitstatus_to_exitcode(status), flush=True)
        else:
            print(fork_rollout(**request), flush=True)


def fork_rollout(cwd: str, args: list[str], stderr: str) -> int:
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()  # its own process group, which the test signals
        os.chdir(cwd)
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, os.devnull, os.O_WRONLY),
                                (2, stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = ["ardiff", *args]
        from ardiff_cli.main import main

        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a traceback is a failure the test reports
        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


class Zygote:
    """The test's side of the zygote."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)

    def ask(self, request: dict, timeout_s: float = WAIT_S) -> int:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        assert ready, f"the zygote did not answer {request} in {timeout_s} s"
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=WAIT_S)


# -- the soak ---------------------------------------------------------------------------------
def write_config(folder: Path, output: str) -> Path:
    args = {"block_sleep_s": BLOCK_SLEEP_S, "frame_size": FRAME_SIZE,
            "marker": str(folder / "blocks")}
    data = {"pipeline": {"entry": f"{FAULT_PIPELINES}:FaultPipeline", "args": args},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": FRAMES, "prompt": "a"},
            "output": {"path": output, "fps": 8}}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def kill_one(zygote: Zygote, folder: Path, kill: Kill) -> int:
    """Run one rollout and signal it as `kill` says; returns its exit code."""
    folder.mkdir()
    config = write_config(folder, kill.output)
    pid = zygote.ask({"cwd": str(folder), "stderr": str(folder / "stderr.txt"),
                      "args": ["rollout", str(config), "--json", "stats.json", "--quiet"]})
    try:
        wait_for_first_block(folder / "blocks", folder / "stderr.txt")
        time.sleep(kill.delay_s)  # a random moment: the blocks marker above is the sync point
        signal_group(pid, kill.first)
        if kill.second:
            time.sleep(kill.second_delay_s)
            signal_group(pid, kill.second)
    except BaseException:
        signal_group(pid, "SIGKILL")
        raise
    return zygote.ask({"wait": pid})


def wait_for_first_block(marker: Path, stderr: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not marker.exists():
        assert time.monotonic() < deadline, f"no block in {WAIT_S} s: {stderr.read_text()}"
        time.sleep(0.002)


def signal_group(pid: int, name: str) -> None:
    try:
        os.killpg(pid, signal.Signals[name])
    except ProcessLookupError:
        pass  # only once its zombie is reaped; it is not: the test waits for it after


def check_run(folder: Path, kill: Kill, exit_code: int) -> str:
    """What one killed run left must be whole and agree with its stats; returns its status."""
    stderr = (folder / "stderr.txt").read_text()
    assert "Traceback" not in stderr, stderr
    stats = json.loads((folder / "stats.json").read_text())
    jsonschema.validate(stats, STATS_SCHEMA)
    assert (stats["status"], stats["exit_code"]) in (("ok", 0), ("interrupted", 130)), stats
    assert exit_code == stats["exit_code"], stderr
    if stats["status"] == "interrupted":
        assert stats["error"] == f"interrupted by {kill.first}"
    written = stats["frames"]["written"]
    video = folder / kill.output
    assert video.exists() == (written > 0)
    if written:
        if video.suffix == ".npy":
            frames = np.load(video)
        else:
            with av.open(str(video)) as container:
                frames = np.stack([f.to_ndarray(format="rgb24")
                                   for f in container.decode(video=0)])
        assert len(frames) == written == stats["outputs"][0]["frames"]
        tolerance = LOSSY_TOLERANCE if video.suffix == ".mp4" else 0
        assert [float(f.mean()) for f in frames] == pytest.approx(
            [i % 256 for i in range(written)], abs=tolerance)
    assert not list(folder.glob(".*partial*"))
    assert stats["kv"]["pages_in_use"] == 0
    return stats["status"]


@pytest.mark.slow
@pytest.mark.heavy  # a soak: 20 real processes, killed at random moments
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the zygote forks")
def test_random_kills_leave_playable_files_and_stats_that_agree(tmp_path):
    kills = draw_kills(random.Random(SEED))
    zygote = Zygote()
    try:
        exits = [kill_one(zygote, tmp_path / f"run{i:02d}", kill)
                 for i, kill in enumerate(kills)]
    finally:
        zygote.close()

    statuses = [check_run(tmp_path / f"run{i:02d}", kill, code)
                for i, (kill, code) in enumerate(zip(kills, exits))]
    assert statuses.count("interrupted") >= RUNS // 4, statuses  # most land mid-run


if __name__ == "__main__":
    serve()
