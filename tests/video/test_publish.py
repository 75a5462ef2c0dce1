"""Work files and publishing (ardiff/video/disk.py, leftovers.py, writer.py): a target is the
old file or a whole new one, never a mix; work files are the writer's own and never outlive
it, or (a killed run's) the next writer of the target.

Concurrency is tested with two writers on one target in two threads (fast) and, marked
slow, in two processes. A PNG folder's guarantee is weaker than a file's and tested as
documented: once every run has ended it holds exactly one run's frames. What a killed run
leaves (its work file, its 16 MiB reserve, a PNG folder's hidden work folder) is removed by
the next writer of the same target, only when no live process owns it: left here under a
dead pid's name, and (heavy) by a real `ardiff rollout` killed with SIGKILL mid-encode.
"""

from __future__ import annotations

import _thread
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from ardiff.errors import EncoderError
from ardiff.video import disk, encoders, leftovers
from ardiff.video.writer import ENCODE_BATCH_BLOCKS, VideoWriter
from ardiff_cli.main import app

H, W = 8, 8
REPO = Path(__file__).resolve().parents[2]
FAULT_PIPELINES = REPO / "tests" / "support" / "fault_pipelines.py"
ARDIFF = str(Path(sys.executable).parent / "ardiff")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
WAIT_S = 60  # how long a test waits for a process before it fails


def flat(value: int, count: int) -> np.ndarray:
    return np.full((count, H, W, 3), value, np.uint8)


def work_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if ".partial" in p.name or p.name.endswith(".reserve"))


def is_locked(path: Path) -> bool:
    """Whether a process holds `path`'s flock (as a live writer holds its work)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def values(path: Path) -> list[int]:
    """The flat value of each frame of an .npy, .mkv or PNG-folder video."""
    if path.is_dir():
        frames = [np.asarray(Image.open(p)) for p in sorted(path.glob("frame_*.png"))]
    elif path.suffix == ".npy":
        frames = list(np.load(path))
    else:
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return [int(frame[0, 0, 0]) for frame in frames]


# -- work files ---------------------------------------------------------------------------------
def test_each_writer_encodes_into_its_own_hidden_work_file(tmp_path):
    first, second = VideoWriter(tmp_path / "out.npy", 8), VideoWriter(tmp_path / "out.npy", 8)
    for _ in range(ENCODE_BATCH_BLOCKS):  # the encoders start on a whole batch
        first.write(flat(1, 2))
        second.write(flat(2, 2))
    deadline = time.monotonic() + 5  # each encoder thread makes its work file, then locks it
    while time.monotonic() < deadline and not (
            len(work_files(tmp_path)) == 2
            and all(is_locked(tmp_path / name) for name in work_files(tmp_path))):
        time.sleep(0.01)

    names = work_files(tmp_path)
    assert len(names) == 2 and all(name.startswith(f".out.npy.{os.getpid()}-") and
                                   name.endswith(".partial.npy") for name in names)
    assert all(is_locked(tmp_path / name) for name in names)  # a live run's, to any process
    assert not (tmp_path / "out.npy").exists()  # nothing is published before close
    first.close(), second.close()
    assert work_files(tmp_path) == []


@pytest.mark.parametrize("ending", ["close", "exception", "ctrl-c", "encoder failure"])
@pytest.mark.parametrize("output", ["out.mp4", "out.npy", "frames/"])
def test_no_work_file_outlives_the_writer(tmp_path, monkeypatch, ending, output):
    if ending == "encoder failure":
        for cls in (encoders.PyAVEncoder, encoders.NpyEncoder, encoders.PngDirEncoder):
            monkeypatch.setattr(cls, "_encode_frame", lambda self, frame: 1 / 0)
    raised = {"close": None, "exception": RuntimeError, "ctrl-c": KeyboardInterrupt,
              "encoder failure": EncoderError}[ending]
    try:
        with VideoWriter(tmp_path / output, 8) as writer:
            writer.write(flat(7, 3))
            if ending == "exception":
                raise RuntimeError("the pipeline broke")
            if ending == "ctrl-c":
                raise KeyboardInterrupt
    except BaseException as exc:  # noqa: BLE001
        assert raised is not None and isinstance(exc, raised)
    assert work_files(tmp_path) == []
    assert writer.info.frames == (0 if ending == "encoder failure" else 3)


@pytest.mark.slow
def test_an_unclosed_writer_leaves_no_work_file_when_the_process_exits(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np
        from ardiff.video.writer import VideoWriter
        writer = VideoWriter({str(tmp_path / 'out.mp4')!r}, 8)
        writer.write(np.zeros((4, 8, 8, 3), np.uint8))
        # the script ends without close()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert work_files(tmp_path) == [] and not (tmp_path / "out.mp4").exists()


# -- a run that wrote no frame ------------------------------------------------------------
def test_a_run_without_frames_leaves_an_old_png_folder_untouched(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "frame_000000.png").write_bytes(b"old")
    with VideoWriter(f"{folder}/", 8):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["frame_000000.png"]
    assert VideoWriter(tmp_path / "new", 8).close().frames == 0
    assert not (tmp_path / "new").exists()  # not even made


def test_a_png_folder_whose_first_frame_fails_is_not_left_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(encoders.PngDirEncoder, "_encode_frame", lambda self, frame: 1 / 0)
    writer = VideoWriter(tmp_path / "frames", 8)
    writer.write(flat(1, 1))
    with pytest.raises(EncoderError, match="failed after 0 frames .*ZeroDivisionError"):
        writer.close()
    assert list(tmp_path.iterdir()) == []


def test_publishing_a_png_folder_replaces_its_frames_and_keeps_other_files(tmp_path):
    folder = tmp_path / "frames"
    with VideoWriter(folder, 8) as writer:
        writer.write(flat(10, 5))
    (folder / "notes.txt").write_text("mine")
    with VideoWriter(folder, 8) as writer:
        writer.write(flat(20, 2))
    assert values(folder) == [20, 20]
    assert sorted(p.name for p in folder.iterdir()) == [
        "frame_000000.png", "frame_000001.png", "notes.txt"]


# -- two runs, one target ------------------------------------------------------------------
@pytest.mark.parametrize("output", ["out.npy", "out.mkv", "frames"])
def test_two_writers_on_one_target_leave_one_whole_video(tmp_path, output):
    """Writers A (5 frames of 50) and B (3 of 90) interleave writes and close at once."""
    target = tmp_path / output
    for _ in range(3):
        writers = {50: VideoWriter(target, 8), 90: VideoWriter(target, 8)}
        for step in range(5):
            for value, writer in writers.items():
                if step < (5 if value == 50 else 3):
                    writer.write(flat(value, 1))
        start = threading.Barrier(2)

        def close(writer):
            start.wait()
            writer.close()

        threads = [threading.Thread(target=close, args=(w,)) for w in writers.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert values(target) in ([50] * 5, [90] * 3)
        assert work_files(tmp_path) == []


@pytest.mark.slow
def test_two_processes_writing_one_target_leave_one_whole_file(tmp_path):
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from ardiff.video.writer import VideoWriter
        value, target = int(sys.argv[1]), sys.argv[2]
        for _ in range(20):
            with VideoWriter(target, 8) as writer:
                for _ in range(value // 10):
                    writer.write(np.full((1, 8, 8, 3), value, np.uint8))
    """)
    target = tmp_path / "out.mkv"
    runs = [subprocess.Popen([sys.executable, "-c", script, str(value), str(target)])
            for value in (30, 60)]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    assert values(target) in ([30] * 3, [60] * 6)
    assert work_files(tmp_path) == []


# -- Ctrl-C while the file is finished -------------------------------------------------------
def test_ctrl_c_while_close_waits_for_the_encoder_still_publishes_every_frame(tmp_path,
                                                                               monkeypatch):
    original = encoders.NpyEncoder._encode_frame

    def slow(self, frame):
        time.sleep(0.01)
        if self.frames == 3:  # by now the main thread waits in close()
            _thread.interrupt_main()  # Ctrl-C
        original(self, frame)

    monkeypatch.setattr(encoders.NpyEncoder, "_encode_frame", slow)
    writer = VideoWriter(tmp_path / "out.npy", 8)
    writer.write(flat(3, 10))

    with pytest.raises(KeyboardInterrupt):
        writer.close()

    assert writer.info.frames == 10 == len(np.load(tmp_path / "out.npy"))
    assert work_files(tmp_path) == []


# -- what a killed run leaves behind -----------------------------------------------------------
def dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def leave_work(target: Path, pid: int, tag: str) -> list[Path]:
    """What a run with `pid` leaves at `target` when it is killed mid-encode: its work file
    and space reserve, or a PNG folder's work folder holding a frame and half of the next."""
    if target.suffix:
        work = target.with_name(f".{target.name}.{pid}-{tag}.partial{target.suffix}")
        work.write_bytes(b"half a video")
        reserve = work.with_name(f"{work.name}.reserve")
        with open(reserve, "wb") as file:
            file.truncate(disk.RESERVE_BYTES)  # sparse: the size, not the blocks
        return [work, reserve]
    work = target / f".partial-{pid}-{tag}"
    work.mkdir(parents=True)
    (work / "frame_000000.png").write_bytes(b"a frame")
    (work / ".frame_000001.png.partial").write_bytes(b"half a frame")
    return [work]


@contextlib.contextmanager
def held_by_a_live_run(path: Path):
    """`path` locked as a live writer holds its work (one in another pid namespace, say)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@pytest.mark.parametrize("output", ["out.mkv", "out.npy", "frames"])
def test_the_next_writer_removes_only_the_work_of_runs_that_are_gone(tmp_path, output):
    target = tmp_path / output
    dead = leave_work(target, dead_pid(), "0000dead")
    live = leave_work(target, os.getppid(), "0000a11e")
    locked = leave_work(target, dead_pid(), "10cced00")
    other = leave_work(tmp_path / f"other-{output}", dead_pid(), "0000dead")

    with held_by_a_live_run(locked[0]):
        with VideoWriter(target, 8) as writer:
            writer.write(flat(5, 3))

    assert values(target) == [5, 5, 5]
    assert [path for path in dead if path.exists()] == []
    assert all(path.exists() for path in live + locked + other)  # not ours to remove


def test_a_killed_process_not_yet_reaped_is_not_running():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert leftovers.is_running(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while leftovers.is_running(proc.pid):  # a zombie until its parent (this test) waits
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert proc.poll() is not None
    finally:
        proc.kill()
        proc.wait()
    assert not leftovers.is_running(proc.pid)


def write_rollout_config(folder: Path, frames: int, output: str, **args) -> Path:
    data = {"pipeline": {"entry": f"{FAULT_PIPELINES}:FaultPipeline", "args": args},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": frames, "prompt": "a"}, "output": {"path": output, "fps": 8}}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rerun(folder: Path, output: str, monkeypatch) -> None:
    """`ardiff rollout` of 12 frames to `output`: it ends whole, and nothing is left beside it."""
    write_rollout_config(folder, 12, output)
    monkeypatch.chdir(folder)
    result = CliRunner().invoke(app, ["rollout", "run.yaml", "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert values(folder / output) == list(range(12))
    assert work_files(folder) == []
    if not Path(output).suffix:  # a PNG folder keeps no hidden folder either
        assert sorted(p.name for p in (folder / output).iterdir()) == [
            f"frame_{index:06d}.png" for index in range(12)]


@pytest.mark.parametrize("output", ["out.mkv", "frames"])
def test_a_rollout_removes_what_a_dead_run_left_at_its_output(tmp_path, monkeypatch, output):
    leave_work(tmp_path / output, dead_pid(), "0000dead")
    rerun(tmp_path, output, monkeypatch)


@pytest.mark.heavy
@pytest.mark.parametrize("output", ["out.mkv", "frames"])
def test_a_rollout_killed_mid_encode_leaves_nothing_once_the_next_one_ends(tmp_path,
                                                                          monkeypatch, output):
    config = write_rollout_config(tmp_path, 4000, output, block_sleep_s=0.01)
    proc = subprocess.Popen([ARDIFF, "rollout", str(config), "--quiet"], cwd=tmp_path, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    pattern = (f".{output}.{proc.pid}-*.partial.mkv*" if output.endswith(".mkv")
               else f"{output}/.partial-{proc.pid}-*/frame_*.png")
    deadline = time.monotonic() + WAIT_S
    try:
        while len(list(tmp_path.glob(pattern))) < 2:  # encoding: a work file and its reserve,
            assert proc.poll() is None, proc.stderr.read()  # or two frames
            assert time.monotonic() < deadline, "the run did not start encoding"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert any(str(proc.pid) in name for name in work_files(tmp_path))  # left behind

    rerun(tmp_path, output, monkeypatch)
