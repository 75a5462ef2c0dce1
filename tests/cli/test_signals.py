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
import re
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


@pytest.mark.heavy  # seconds of end-to-end waiting: keeps pytest -q under 90 s
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


# -- a stuck pipeline (#25) ----------------------------------------------------------------------
# A block that never returns: a second signal abandons it (a Python handler can raise there),
# else the watchdog takes the files over ABANDON_AFTER_S later. The in-process cases (a sleep,
# a loop, a close hook) are rows of tests/rollout/test_faults.py; here the real script.
ABANDONED = "stopping now (SIGINT): the block in flight is abandoned; finalising..."
TAKEN_OVER = ("stopping now (SIGINT): the block in flight is abandoned (it has not returned "
              "for 3 s); finalising...")


def start_rollout(folder: Path, config: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """The `ardiff` script on `config` in its own session; its stderr goes to a file."""
    stderr = folder / "stderr.txt"
    with open(stderr, "w") as stderr_file:
        proc = subprocess.Popen([ARDIFF, "rollout", str(config), "--quiet", *args], cwd=folder,
                                env=ENV, stdout=subprocess.DEVNULL, stderr=stderr_file,
                                start_new_session=True)
    return proc, stderr


def stop_twice_while_stuck(tmp_path: Path, wait_for_first: bool = True, once: bool = False,
                           **args) -> tuple:
    """A rollout whose block 2 (or close hook) hangs as `args` say: SIGTERM, then SIGINT
    (once the first is acknowledged, if `wait_for_first`; not at all if `once`); returns
    (exit code, stderr lines)."""
    marker = tmp_path / "blocks"
    config = write_config(tmp_path, args.pop("frames", 400), marker=str(marker),
                          hang_s=WAIT_S, **args)
    proc, stderr = start_rollout(tmp_path, config, "--json", "stats.json")
    try:
        wait_for(Path(f"{marker}.hang").exists, proc, "the hang")
        os.kill(proc.pid, signal.SIGTERM)
        if wait_for_first:
            wait_for(lambda: "stopping (SIGTERM)" in stderr.read_text(), proc, "the first stop")
        if not once:
            os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=WAIT_S)  # the hang itself gives up after WAIT_S: exit 1
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stderr.read_text().splitlines()


def assert_finished_blocks_kept(folder: Path, frames: int, status: str = "interrupted") -> dict:
    stats = json.loads((folder / "stats.json").read_text())
    jsonschema.validate(stats, STATS_SCHEMA)
    assert stats["status"] == status
    video = decode(folder / "out.mp4")
    assert len(video) == stats["outputs"][0]["frames"] == stats["frames"]["written"] == frames
    assert [float(f.mean()) for f in video] == pytest.approx(list(range(frames)),
                                                             abs=LOSSY_TOLERANCE)
    assert not list(folder.glob(".*partial*"))
    return stats


@pytest.mark.heavy  # seconds of end-to-end waiting: keeps pytest -q under 90 s
@pytest.mark.slow
def test_a_block_stuck_in_a_blocking_call_is_taken_over_after_the_second_signal(tmp_path):
    code, lines = stop_twice_while_stuck(tmp_path, wait_for_first=False, fault="hang",
                                         hang="c_call", at_block=2)

    assert code == 130, lines
    # the first line only if SIGTERM came before the C call began: its handler ran then. When
    # both signals are pending as the C call returns, Python runs the handlers in signal-number
    # order (SIGINT first), so the stop names the signal handled first and the takeover the other.
    # The takeover says how long the block had not returned when the block was already past
    # the stop's wait, and nothing when the second signal came first.
    first, second = ("SIGTERM", "SIGINT") if lines[-1].endswith("SIGTERM") else ("SIGINT",
                                                                                 "SIGTERM")
    takeover = (rf"stopping now \({second}\): the block in flight is abandoned"
                rf"( \(it has not returned for 3 s\))?; finalising\.\.\.")
    assert re.fullmatch(takeover, lines[-2]), lines
    assert lines[-1] == f"error: interrupted by {first}" and len(lines) <= 3, lines
    stats = assert_finished_blocks_kept(tmp_path, 2 * FRAMES_PER_BLOCK)
    assert stats["error"] == f"interrupted by {first}"
    assert stats["kv"]["pages_in_use"] > 0  # what the stuck block holds, said as it is


@pytest.mark.heavy
@pytest.mark.parametrize("hang, by_watchdog", [("sleep", False), ("busy", False),
                                               ("swallow", True)])
def test_a_second_signal_abandons_a_block_that_hangs(tmp_path, hang, by_watchdog):
    code, lines = stop_twice_while_stuck(tmp_path, fault="hang", hang=hang, at_block=2)

    assert code == 130, lines
    assert lines == ["stopping (SIGTERM): finishing the current block, then finalising...",
                     ABANDONED, *([TAKEN_OVER] if by_watchdog else []),
                     "error: interrupted by SIGTERM"]
    stats = assert_finished_blocks_kept(tmp_path, 2 * FRAMES_PER_BLOCK)
    assert (stats["kv"]["pages_in_use"] == 0) is not by_watchdog


@pytest.mark.heavy
def test_a_close_hook_stuck_in_a_blocking_call_cannot_keep_a_finished_run_alive(tmp_path):
    code, lines = stop_twice_while_stuck(tmp_path, wait_for_first=False, once=True, frames=8,
                                         fault="close_hang", hang="c_call")

    assert code == 0, lines
    assert lines[-2:] == [
        "stopping now (SIGTERM): the pipeline's session cleanup is abandoned (it has not "
        "returned for 3 s); every file is written",
        "warning: interrupted by SIGTERM after every frame was written: the pipeline's session "
        "cleanup was cut short"]
    assert_finished_blocks_kept(tmp_path, 8, status="ok")


@pytest.mark.heavy
def test_a_thread_the_pipeline_never_ends_does_not_keep_the_process_alive(tmp_path):
    config = write_config(tmp_path, 4, fault="thread")
    proc, stderr = start_rollout(tmp_path, config, "--json", "stats.json")
    try:
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()

    assert proc.returncode == 0, stderr.read_text()
    assert stderr.read_text().splitlines() == [
        "warning: 1 thread(s) the pipeline started are still running ('never-ends'); ending "
        "without waiting for them"]
    assert_finished_blocks_kept(tmp_path, 4, status="ok")


@pytest.mark.heavy
def test_a_json_fifo_without_a_reader_does_not_block_a_stop(tmp_path):
    marker = tmp_path / "blocks"
    config = write_config(tmp_path, 400, block_sleep_s=0.05, marker=str(marker))
    os.mkfifo(tmp_path / "stats.fifo")
    proc, stderr = start_rollout(tmp_path, config, "--json", "stats.fifo")
    try:
        wait_for(lambda: blocks_made(marker) >= 2, proc, "second block")
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()

    assert proc.returncode == 130
    assert stderr.read_text().splitlines()[-2:] == [
        "warning: --json: 'stats.fifo' is a FIFO and no reader opened it within 5 s; the stats "
        "were not written; the video is kept; start its reader first",
        "error: interrupted by SIGTERM"]


# -- in this process: the --json FIFO, the second signal's lines -------------------------------
def test_a_json_fifo_is_written_to_its_reader_and_given_up_without_one(tmp_path, monkeypatch):
    from ardiff_cli import _options

    monkeypatch.setattr(_options, "FIFO_WAIT_S", 0.2)
    monkeypatch.chdir(tmp_path)  # the video (a relative output.path) lands here, not in the repo
    config = write_config(tmp_path, 4, output="out.npy")
    fifo = tmp_path / "stats.fifo"
    os.mkfifo(fifo)
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_text()))
    reader.start()
    with_reader = CliRunner().invoke(app, ["rollout", str(config), "--json", str(fifo), "-q"])
    reader.join(WAIT_S)
    without = CliRunner().invoke(app, ["rollout", str(config), "--json", str(fifo), "-q"])

    assert with_reader.exit_code == 0, with_reader.output
    assert json.loads(read[0])["frames"]["written"] == 4
    assert without.exit_code == 1
    assert without.stderr.splitlines() == [
        f"error: --json: '{fifo}' is a FIFO and no reader opened it within 0.2 s; the stats "
        f"were not written; the video is kept; start its reader first"]


def test_a_second_signal_raises_only_in_the_pipelines_code(capsys):
    from ardiff.rollout.gate import FileGate

    stop = RolloutStop()
    stop.phase, stop.gate = "rollout", FileGate(lambda: None)
    stop.gate.open_files = 1
    with StopSignals() as signals:
        signals.follow(stop)
        signal.raise_signal(signal.SIGTERM)  # the first: a request
        signal.raise_signal(signal.SIGHUP)   # writing a block: it waits
        with pytest.raises(KeyboardInterrupt, match="^SIGTERM$"), stop.gate.pipeline():
            signal.raise_signal(signal.SIGINT)  # in the pipeline's code: abandon the block
        stop.phase, stop.gate.open_files = "closing", 0
        with pytest.raises(KeyboardInterrupt, match="^SIGTERM$"), stop.gate.pipeline():
            signal.raise_signal(signal.SIGHUP)  # a close hook
        signal.raise_signal(signal.SIGINT)
    assert capsys.readouterr().err.splitlines() == [
        "stopping (SIGTERM): finishing the current block, then finalising...",
        "finalising... (SIGHUP waits until every file is written)",
        ABANDONED,
        "stopping now (SIGHUP): the pipeline's session cleanup is abandoned; every file is "
        "written",
        "stopping (SIGINT): every file is written; the pipeline closes its sessions"]
    assert stop.reason == "SIGTERM"


def test_once_every_file_is_final_the_first_signal_abandons_the_pipelines_code(capsys):
    from ardiff.rollout.gate import FileGate

    stop = RolloutStop()
    stop.phase, stop.gate = "closing", FileGate(lambda: None)
    with StopSignals() as signals:
        signals.follow(stop)
        with pytest.raises(KeyboardInterrupt, match="^SIGHUP$"), stop.gate.pipeline():
            signal.raise_signal(signal.SIGHUP)  # a close hook that would not return
    assert capsys.readouterr().err.splitlines() == [
        "stopping now (SIGHUP): the pipeline's session cleanup is abandoned; every file is "
        "written"]


def test_an_abandon_lands_in_the_pipelines_code_never_in_ardiffs_bookkeeping():
    from ardiff.kv.state import _spans  # pure ardiff code, standing in for its KV bookkeeping
    from ardiff.rollout.gate import FileGate

    stop = RolloutStop()
    stop.phase, stop.gate = "rollout", FileGate(lambda: None)
    main = threading.main_thread().ident
    go = threading.Event()

    def second_signal() -> None:  # started before the gate: its start-up is not in the window
        go.wait()
        time.sleep(0.05)
        signal.pthread_kill(main, signal.SIGINT)

    with StopSignals() as signals:
        signals.follow(stop)
        signal.raise_signal(signal.SIGTERM)
        threading.Thread(target=second_signal, daemon=True).start()
        with pytest.raises(KeyboardInterrupt, match="^SIGTERM$") as abandoned:
            with stop.gate.pipeline():  # a "pipeline" that spends its time in ardiff's code
                go.set()
                deadline = time.monotonic() + WAIT_S
                while time.monotonic() < deadline:
                    _spans(list(range(500)))
    where = [Path(entry.path).name for entry in abandoned.traceback]
    assert where[-2:] == ["test_signals.py", "_signals.py"]  # the handler raised here, not in
    assert "state.py" not in where                           # ardiff's _spans
