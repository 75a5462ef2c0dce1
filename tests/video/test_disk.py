"""A full disk, and other write failures, in every output format (ardiff/video/disk.py).

`FullDisk` stands in for a disk with `room` bytes left: every byte an encoder writes
goes through `disk._write`, and a write that would grow the files under the folder
past the room writes what fits and then fails with ENOSPC, as the kernel's would.
Writes are real (tmp_path), so the space reserve is a real preallocated file the fake
disk counts, and freeing it makes room; a nearly full disk (`reserve_fits=False`)
refuses the reserve too (`disk._allocate`). Each test asserts that the writer's
`info.frames`, its error message, and a decoder reading the target agree, and that no
work file is left. The real thing, a full tmpfs, is `test_a_real_full_disk_*` (slow;
needs root to mount one).
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from PIL import Image, ImageSequence
from typer.testing import CliRunner

from ardiff.errors import EncoderError
from ardiff.video import disk, encoders
from ardiff.video.writer import VideoWriter
from ardiff_cli.main import app

FORMATS = ["out.mp4", "out.mkv", "out.webm", "out.gif", "out.webp", "out.npy", "frames/"]
EXACT = ("out.mkv", "out.npy", "frames/")  # lossless: the kept frames are the first frames, exactly
NOISE_FRAMES = 96                    # 32x32 noise: every format writes bytes mid-run
ROOM_BYTES = 8000                    # left on the fake disk besides the reserve
FPS = 4                              # mkv/webm clusters close every 5 s: 20 frames
FAULT_PIPELINES = Path(__file__).parents[1] / "support" / "fault_pipelines.py"
KEPT = re.compile(r"the (\d+) frames encoded before it are kept|only the first (\d+) of them")


class FullDisk:
    """`room` bytes left for the files under `folder` once the first write comes, besides
    the space reserve; `reserve_fits` False: the disk cannot spare a reserve either."""

    def __init__(self, folder: Path, room: int, reserve_fits: bool = True) -> None:
        self.folder, self.room, self.capacity = folder, room, None
        self.reserve_fits = reserve_fits

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FullDisk:
        monkeypatch.setattr(disk, "_write", self.write)
        if not self.reserve_fits:
            monkeypatch.setattr(disk, "_allocate", no_room)
        return self

    def used(self) -> int:
        return sum(p.lstat().st_size for p in self.folder.rglob("*") if p.is_file())

    def write(self, fd: int, data) -> int:
        """Write what fits (a short count, as the kernel's write), ENOSPC when nothing does."""
        if self.capacity is None:
            self.capacity = self.used() + self.room
        end = os.fstat(fd).st_size + self.capacity - self.used()  # the file may grow to here
        fits = end - os.lseek(fd, 0, os.SEEK_CUR)
        if fits <= 0 and len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, memoryview(data)[:max(fits, 0)])


def no_room(fd: int, offset: int, nbytes: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def noise(count: int, side: int = 32) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (count, side, side, 3), dtype=np.uint8)


def read_frames(path: Path) -> np.ndarray:
    """The frames of a video in any output format, uint8 [N, H, W, 3]."""
    if path.is_dir():
        frames = [np.asarray(Image.open(p)) for p in sorted(path.glob("frame_*.png"))]
    elif path.suffix == ".npy":
        return np.load(path)
    elif path.suffix in (".gif", ".webp"):
        with Image.open(path) as image:
            frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(image)]
    else:
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack(frames) if frames else np.zeros((0, 1, 1, 3), np.uint8)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if ".partial" in p.name or
                  p.name.endswith(".reserve"))


def write_until_full(target: Path, frames: np.ndarray) -> tuple[VideoWriter, str]:
    """Write `frames` in blocks of 4 until the writer fails; returns it and its message."""
    writer = VideoWriter(target, FPS)
    with pytest.raises(EncoderError) as caught:
        for start in range(0, len(frames), 4):
            writer.write(frames[start:start + 4])
        writer.close()
    with pytest.raises(EncoderError) as again:  # closing again says the same
        writer.close()
    assert str(again.value) == str(caught.value)
    return writer, str(caught.value)


def kept_in(message: str) -> int:
    found = KEPT.search(message)
    return int(found.group(1) or found.group(2)) if found else 0


@pytest.mark.parametrize("output", FORMATS)
def test_a_full_disk_mid_run_keeps_every_encoded_frame(tmp_path, monkeypatch, output):
    FullDisk(tmp_path, ROOM_BYTES).install(monkeypatch)
    frames = noise(NOISE_FRAMES)

    writer, message = write_until_full(tmp_path / output, frames)

    kept = writer.info.frames
    assert 0 < kept < NOISE_FRAMES
    assert message.startswith(f"output.path: writing '{tmp_path / output.rstrip('/')}' ")
    assert (f"failed after {kept} frames (OSError: [Errno 28] No space left on device); the "
            f"{kept} frames encoded before it are kept in") in message
    assert message.endswith(f"the disk holding '{tmp_path}' is full: free some space, then "
                            f"rerun")
    decoded = read_frames(tmp_path / output)
    assert len(decoded) == kept
    if output in EXACT:
        np.testing.assert_array_equal(decoded, frames[:kept])
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("output", FORMATS)
def test_on_a_nearly_full_disk_the_message_and_info_say_what_the_target_holds(tmp_path,
                                                                              monkeypatch,
                                                                              output):
    FullDisk(tmp_path, ROOM_BYTES, reserve_fits=False).install(monkeypatch)  # no reserve
    target = tmp_path / output
    if not output.endswith("/"):
        target.write_bytes(b"the old video")

    writer, message = write_until_full(target, noise(NOISE_FRAMES))

    kept = writer.info.frames
    assert kept == kept_in(message)
    if output in ("out.mp4", "out.npy", "out.gif", "frames/"):  # each keeps what fits
        assert kept > 0 and re.search("frames encoded before it are kept|only the first",
                                      message)
    if kept:
        assert len(read_frames(target)) == kept
    else:  # the first cluster (mkv, webm) or the whole file (webp) did not fit
        assert (f"no frame could be kept and '{target}' was not changed: the file could not "
                f"be finished, and the part of it on disk holds no whole frame;") in message
        assert target.read_bytes() == b"the old video"
    assert leftovers(tmp_path) == []


def test_an_mp4_on_a_nearly_full_disk_keeps_the_frames_that_fit(tmp_path, monkeypatch):
    FullDisk(tmp_path, ROOM_BYTES, reserve_fits=False).install(monkeypatch)
    target = tmp_path / "out.mp4"

    writer, message = write_until_full(target, noise(NOISE_FRAMES))

    # ~870 bytes a frame: of the 8000 bytes, at most a frame and the header go unused
    assert 6 <= writer.info.frames == kept_in(message) == len(read_frames(target))
    assert target.stat().st_size > ROOM_BYTES - 2000


def test_an_mp4_on_a_full_disk_says_it_kept_nothing_and_why(tmp_path, monkeypatch):
    FullDisk(tmp_path, 0, reserve_fits=False).install(monkeypatch)

    writer, message = write_until_full(tmp_path / "out.mp4", noise(8))

    assert writer.info.frames == 0 and not (tmp_path / "out.mp4").exists()
    assert re.search(r"failed after \d+ frames \(OSError: \[Errno 28\] No space left on "
                     r"device\); no frame could be kept and '.*out\.mp4' was not changed: the "
                     r"file could not be finished, and the part of it on disk holds no whole "
                     r"frame; the disk holding '.*' is full: free some space, then rerun$",
                     message), message
    assert leftovers(tmp_path) == []


def test_a_disk_full_from_the_start_leaves_an_old_png_folder_alone(tmp_path, monkeypatch):
    FullDisk(tmp_path, 0).install(monkeypatch)
    (tmp_path / "frames").mkdir()
    (tmp_path / "frames" / "frame_000000.png").write_bytes(b"old")

    writer, message = write_until_full(tmp_path / "frames", noise(4))

    assert writer.info.frames == 0
    assert "failed after 0 frames" in message and "no frame was written" in message
    assert [p.name for p in (tmp_path / "frames").iterdir()] == ["frame_000000.png"]


# -- what the message says about other failures ----------------------------------------------
@pytest.mark.parametrize("error, says", [
    (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
     r"\(OSError: \[Errno 122\] Disk quota exceeded\); .*; your disk quota for '.*' is used up"),
    (OSError(errno.EFBIG, os.strerror(errno.EFBIG)),
     r"\(OSError: \[Errno 27\] File too large\); .*; the file grew past what its file system "
     r"\(or `ulimit -f`\) allows"),
    (PermissionError(errno.EACCES, os.strerror(errno.EACCES)),
     r"\(PermissionError: \[Errno 13\] Permission denied\); .*; '.*' cannot be written: fix "
     r"its permissions"),
    (OSError(errno.EROFS, os.strerror(errno.EROFS)),
     r"\[Errno 30\] Read-only file system\); .* cannot be written"),
    (OSError(errno.EIO, os.strerror(errno.EIO)),
     r"\(OSError: \[Errno 5\] Input/output error\); the 2 frames encoded before it are kept in "
     r"'.*out\.npy'; check the disk holding '.*', then rerun$"),
    (ValueError("codec state broke"),
     r"\(ValueError: codec state broke\); .*; this is the encoder failing, not the disk; rerun "
     r"with --debug for the traceback$"),
])
def test_an_encoder_error_names_what_failed_and_only_the_fix_that_fits(tmp_path, monkeypatch,
                                                                        error, says):
    original = encoders.NpyEncoder._encode_frame

    def encode_frame(self, frame):
        if self.frames == 2:
            raise error
        original(self, frame)

    monkeypatch.setattr(encoders.NpyEncoder, "_encode_frame", encode_frame)
    writer = VideoWriter(tmp_path / "out.npy", FPS)
    writer.write(noise(4))
    with pytest.raises(EncoderError, match=says) as caught:
        writer.close()
    assert " is full" not in str(caught.value) and "\n" not in str(caught.value)
    assert len(np.load(tmp_path / "out.npy")) == 2


# -- through the command line ----------------------------------------------------------------
def rollout(folder: Path, output: str, room: int, monkeypatch, reserve: bool = True):
    data = {"pipeline": {"entry": f"{FAULT_PIPELINES}:FaultPipeline", "args": {}},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": 12, "prompt": "a"}, "output": {"path": output, "fps": 8}}
    (folder / "run.yaml").write_text(yaml.safe_dump(data))
    FullDisk(folder, room, reserve_fits=reserve).install(monkeypatch)
    monkeypatch.chdir(folder)
    result = CliRunner().invoke(app, ["rollout", "run.yaml", "--json", "stats.json", "--quiet"])
    return result, json.loads((folder / "stats.json").read_text())


def test_the_stats_and_the_error_agree_with_the_file_when_only_some_frames_fit(tmp_path,
                                                                                monkeypatch):
    room = len(encoders.npy_header(0, 16, 16)) + 3 * 16 * 16 * 3 + 100  # 3 frames and a bit
    result, stats = rollout(tmp_path, "out.npy", room, monkeypatch)

    assert result.exit_code == 1
    assert stats["status"] == "failed" and stats["outputs"][0]["frames"] == 3
    assert stats["frames"]["written"] == 3  # what the file holds, not what reached the writer
    assert "the 3 frames encoded before it are kept in 'out.npy'" in stats["error"]
    assert result.stderr.strip() == f"error: {stats['error']}"
    assert len(np.load(tmp_path / "out.npy")) == 3


def test_an_mp4_with_no_room_at_all_says_it_kept_nothing_and_why(tmp_path, monkeypatch):
    (tmp_path / "out.mp4").write_bytes(b"yesterday's video")
    result, stats = rollout(tmp_path, "out.mp4", 0, monkeypatch, reserve=False)

    assert result.exit_code == 1
    assert stats["outputs"][0]["frames"] == 0 == stats["outputs"][0]["bytes"]
    assert stats["frames"]["written"] == 0
    assert re.search(r"failed after \d+ frames \(OSError: \[Errno 28\] No space left on device\); "
                     r"no frame could be kept and 'out\.mp4' was not changed: the file could "
                     r"not be finished, and the part of it on disk holds no whole frame; the "
                     r"disk holding '.*' is full", stats["error"])
    assert (tmp_path / "out.mp4").read_bytes() == b"yesterday's video"
    assert leftovers(tmp_path) == []


# -- a real full disk --------------------------------------------------------------------------
def mount_tmpfs(mount: Path, size: str):
    """A tmpfs of `size` at `mount` while the generator runs (root only: skips elsewhere)."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    """An 18 MiB tmpfs: room for the 16 MiB reserve and 2 MiB of video."""
    yield from mount_tmpfs(tmp_path / "tmpfs", "18m")


@pytest.fixture
def nearly_full_tmpfs(tmp_path):
    """A 600 KiB tmpfs: no room for a reserve, even the 1 MiB one."""
    yield from mount_tmpfs(tmp_path / "tmpfs", "600k")


@pytest.mark.slow
@pytest.mark.parametrize("output", FORMATS)
def test_a_real_full_disk_keeps_every_encoded_frame(small_tmpfs, output):
    frames = noise(8, side=160)
    target = small_tmpfs / output
    writer = VideoWriter(target, 16)
    with pytest.raises(EncoderError, match=r"No space left on device\); the \d+ frames encoded "
                                           r"before it are kept in") as caught:
        for _ in range(2000):  # 2000 x 8 noisy frames cannot fit in 2 MiB
            writer.write(frames)
        writer.close()

    assert 0 < writer.info.frames == kept_in(str(caught.value)) == len(read_frames(target))
    assert leftovers(small_tmpfs) == []


@pytest.mark.slow
def test_a_real_nearly_full_disk_keeps_the_mp4_frames_that_fit(nearly_full_tmpfs):
    frames = noise(8, side=160)
    target = nearly_full_tmpfs / "out.mp4"
    writer = VideoWriter(target, 16)
    with pytest.raises(EncoderError, match=r"No space left on device\); (only the first|the) "
                                           r"\d+ ") as caught:
        for _ in range(100):  # 100 x 8 noisy frames cannot fit in 600 KiB
            writer.write(frames)
        writer.close()

    assert 0 < writer.info.frames == kept_in(str(caught.value)) == len(read_frames(target))
    assert target.stat().st_size > 500 * 2**10  # what fitted, less a frame or two
    assert leftovers(nearly_full_tmpfs) == []
