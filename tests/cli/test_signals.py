"""SIGINT, SIGTERM and SIGHUP (ardiff_cli._signals): every command stops the same way, and a
rollout stopped by any of them, at any moment, leaves playable files and its stats.

Two tests (marked slow) signal a real process group from Python: a fresh process, started in
its own session, is signalled with `os.killpg` once the pipeline's marker file says it has
made blocks (tests/support/fault_pipelines.py: `block_sleep_s`, `marker`), never after a bare
sleep. The rest run in this process: the pipeline sends the signal to its own process
(`fault="signal"`), or a test calls the handlers directly. The same faults, as rows of the
table in docs/errors.md#run-failures: tests/rollout/test_faults.py; 20 random kills:
test_signal_soak.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import av
import jsonschema
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from ardiff.rollout.report import STATS_SCHEMA
from ardiff.rollout.stop import RolloutStop
from ardiff_cli._signals import StopSignals
from ardiff_cli.main import app

REPO = Path(__file__).resolve().parents[2]
FAULT_PIPELINES = REPO / "tests" / "support" / "fault_pipelines.py"
ARDIFF = str(Path(sys.executable).parent / "ardiff")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
FRAMES_PER_BLOCK = 2  # FaultPipeline's
LOSSY_TOLERANCE = 3   # H.264 keeps a flat grey frame within a few levels
WAIT_S = 60           # how long a test waits for a process before it fails

# A fresh interpreter running the `ardiff` script's main(), whose encoder, when it starts
# finishing the file, touches MARKER and waits for RELEASE: a test signals it right then.
HELD_FINALISATION = textwrap.dedent("""
    import os, sys, time
    from ardiff.video import encoders
    from ardiff_cli.main import main

    marker, release = sys.argv.pop(1), sys.argv.pop(1)
    close = encoders.Encoder.close

    def close_once_released(encoder):
        open(marker, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
        close(encoder)

    encoders.Encoder.close = close_once_released
    sys.argv[0] = "ardiff"
    main()
""")


def write_config(folder: Path, frames: int, output: str = "out.mp4", **args) -> Path:
    data = {"pipeline": {"entry": f"{FAULT_PIPELINES}:FaultPipeline", "args": args},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": frames, "prompt": "a"},
            "output": {"path": output, "fps": 8}}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert proc.poll() is None, f"the process ended before {what}: {proc.returncode}"
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S} s"
        time.sleep(0.01)


def blocks_made(marker: Path) -> int:
    return int(marker.read_text() or 0) if marker.exists() else 0


def assert_whole_video_and_stats(folder: Path, first_signal: str) -> dict:
    """The video plays, holds whole blocks of the right frames, as many as the stats say."""
    stats = json.loads((folder / "stats.json").read_text())
    jsonschema.validate(stats, STATS_SCHEMA)
    assert (stats["status"], stats["exit_code"], stats["error"]) == (
        "interrupted", 130, f"interrupted by {first_signal}")
    frames = decode(folder / "out.mp4")
    assert len(frames) == stats["outputs"][0]["frames"] == stats["frames"]["written"] > 0
    assert len(frames) % FRAMES_PER_BLOCK == 0  # the block in flight was finished
    assert [float(f.mean()) for f in frames] == pytest.approx(
        [i % 256 for i in range(len(frames))], abs=LOSSY_TOLERANCE)
    assert not list(folder.glob(".*partial*"))
    assert stats["kv"]["pages_in_use"] == 0
    return stats


# -- real process groups -------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_to_the_process_group_finishes_the_mp4_and_the_stats(tmp_path):
    marker = tmp_path / "blocks"
    config = write_config(tmp_path, 400, block_sleep_s=0.05, marker=str(marker))
    proc = subprocess.Popen([ARDIFF, "rollout", str(config), "--json", "stats.json"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        wait_for(lambda: blocks_made(marker) >= 2, proc, "second block")
        os.killpg(proc.pid, signal.SIGTERM)  # what `timeout`, `docker stop` and CI send
        _stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()

    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert "stopping (SIGTERM): finishing the current block, then finalising..." in lines
    assert lines[-1] == "error: interrupted by SIGTERM" and "Traceback" not in stderr
    stats = assert_whole_video_and_stats(tmp_path, "SIGTERM")
    assert stats["frames"]["written"] < 400


@pytest.mark.slow
def test_a_second_signal_while_the_file_is_finished_waits_for_it(tmp_path):
    marker, finalising, release = tmp_path / "blocks", tmp_path / "finalising", tmp_path / "go"
    config = write_config(tmp_path, 400, block_sleep_s=0.05, marker=str(marker))
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", HELD_FINALISATION, str(finalising), str(release), "rollout",
             str(config), "--json", "stats.json", "--quiet"], cwd=tmp_path, env=ENV,
            stdout=subprocess.DEVNULL, stderr=stderr_file, start_new_session=True)
    try:
        wait_for(lambda: blocks_made(marker) >= 2, proc, "second block")
        os.killpg(proc.pid, signal.SIGHUP)
        wait_for(finalising.exists, proc, "finalisation")
        os.killpg(proc.pid, signal.SIGINT)  # a second Ctrl-C while the mp4 is being finished
        wait_for(lambda: "finalising..." in stderr_path.read_text(), proc, "finalising line")
        release.touch()
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()

    stderr = stderr_path.read_text()
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == [
        "stopping (SIGHUP): finishing the current block, then finalising...",
        "finalising... (SIGINT waits until every file is written)",
        "error: interrupted by SIGHUP"]
    assert_whole_video_and_stats(tmp_path, "SIGHUP")


# -- in this process: the other commands -----------------------------------------------------
def test_warmup_stops_at_once_on_a_signal(tmp_path):
    config = write_config(tmp_path, 4, fault="signal_warmup", signal_name="SIGHUP")

    result = CliRunner().invoke(app, ["warmup", str(config), "--json"])

    assert result.exit_code == 130, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == ["error: interrupted by SIGHUP"]


def test_bench_stops_at_once_on_a_signal_and_writes_no_numbers(tmp_path, monkeypatch):
    def measure_until_a_signal(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("the signal did not stop the benchmark")

    monkeypatch.setattr("ardiff.bench.run_bench", measure_until_a_signal)
    config = write_config(tmp_path, 4)

    result = CliRunner().invoke(app, ["bench", str(config), "--json", str(tmp_path / "b.json")])

    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines() == ["error: interrupted by SIGTERM"]
    assert not (tmp_path / "b.json").exists()


def test_a_signal_while_the_pipeline_loads_exits_130_and_writes_nothing(tmp_path, monkeypatch):
    config = write_config(tmp_path, 4, output="out.npy", fault="signal_load",
                          signal_name="SIGINT")
    monkeypatch.chdir(tmp_path)

    result = CliRunner().invoke(app, ["rollout", str(config), "--json", "stats.json"])

    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines() == ["error: interrupted by SIGINT"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


# -- the handlers themselves -------------------------------------------------------------------
def test_the_first_signal_raises_once_and_the_handlers_are_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    with pytest.raises(KeyboardInterrupt, match="^SIGTERM$"):
        with StopSignals() as signals:
            try:
                signal.raise_signal(signal.SIGTERM)
            finally:  # the cleanup the first signal started is not cut short
                signal.raise_signal(signal.SIGINT)
    assert signals.received == "SIGTERM"

    assert {s: signal.getsignal(s) for s in before} == before



def came_together(*names: str) -> None:
    """Signal this process in this order, each one's C handler run before the main thread
    runs any Python handler (as when a `kill` lands while it is in C code): the signals go
    to a helper thread, and the main thread runs their Python handlers after joining it."""
    def send() -> None:
        for name in names:
            signal.pthread_kill(threading.get_ident(), signal.Signals[name])

    helper = threading.Thread(target=send)
    helper.start()
    helper.join()


@pytest.mark.parametrize("first, second", [("SIGTERM", "SIGHUP"), ("SIGTERM", "SIGINT"),
                                           ("SIGINT", "SIGHUP"), ("SIGHUP", "SIGTERM")])
def test_the_first_signal_to_come_is_the_reason_when_two_are_handled_together(first, second,
                                                                             capsys):
    # CPython runs pending handlers lowest number first (SIGHUP 1, SIGINT 2, SIGTERM 15)
    stop = RolloutStop()
    stop.phase = "rollout"
    with StopSignals() as signals:
        signals.follow(stop)
        came_together(first, second)
    assert (signals.received, stop.reason) == (first, first)
    assert capsys.readouterr().err == (
        f"stopping ({first}): finishing the current block, then finalising...\n"
        f"finalising... ({second} waits until every file is written)\n")


def test_the_first_signal_to_come_raises_when_two_are_handled_together():
    with pytest.raises(KeyboardInterrupt, match="^SIGTERM$"):
        with StopSignals() as signals:
            came_together("SIGTERM", "SIGHUP")
    assert signals.received == "SIGTERM"

def test_held_signals_only_wait_and_ignored_ones_stay_ignored(capsys):
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with StopSignals() as signals:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signals.hold()
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGHUP)  # ignored: no handler runs
        assert signals.received == "SIGTERM"
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert capsys.readouterr().err == "finalising... (SIGTERM waits until every file is written)\n"


def test_in_the_script_a_signal_after_the_command_is_ignored_so_the_exit_code_stands():
    from ardiff_cli import _signals as module

    before = {s: signal.getsignal(s) for s in module.STOP_SIGNALS}
    module.end_with_the_process()
    try:
        with StopSignals():
            pass
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in module.STOP_SIGNALS)
        signal.raise_signal(signal.SIGHUP)  # would end the process with -1 under SIG_DFL
    finally:
        module.end_with_the_process(False)
        for signum, handler in before.items():
            signal.signal(signum, handler)
