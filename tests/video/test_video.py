"""ardiff.video.writer: every format opens with a real decoder; failures leave playable files."""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from PIL import Image

from ardiff.errors import ConfigError, EncoderError, OutputPathError
from ardiff.video import codecs, encoders, pixels
from ardiff.video.writer import (
    ENCODE_BATCH_BLOCKS,
    SUPPORTED_EXTENSIONS,
    VideoInfo,
    VideoWriter,
    check_output_path,
)

H, W = 16, 24


def make_frames(count: int, height: int = H, width: int = W, seed: int = 0) -> np.ndarray:
    """Random uint8 frames [count, height, width, 3]."""
    return np.random.default_rng(seed).integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def write_video(path, frames: np.ndarray, fps: float = 16, block: int = 3, **kwargs) -> VideoInfo:
    with VideoWriter(path, fps, **kwargs) as writer:
        for start in range(0, len(frames), block):
            writer.write(frames[start:start + block])
    return writer.info


@dataclass(frozen=True)
class StreamFacts:
    """What the tests check of a video stream, read while its container is open (PyAV 18
    refuses a closed container's stream attributes)."""

    average_rate: Fraction | None
    codec: str


def decode(path) -> tuple[np.ndarray, StreamFacts]:
    """All frames of a PyAV-readable file as rgb24 [N, H, W, 3], and its stream's facts."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        facts = StreamFacts(stream.average_rate, stream.codec_context.name)
    return np.stack(frames), facts


def fail_after(monkeypatch, encoder_class, frames: int, exc: BaseException) -> None:
    """Make `encoder_class` raise `exc` when asked to encode frame number `frames`."""
    original = encoder_class._encode_frame

    def encode_frame(self, frame):
        if self.frames == frames:
            raise exc
        original(self, frame)

    monkeypatch.setattr(encoder_class, "_encode_frame", encode_frame)


# --- formats ---------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".mp4", ".mkv", ".webm"])
@pytest.mark.parametrize("fps", [16, 29.97])
def test_pyav_formats_round_trip(tmp_path, suffix, fps):
    info = write_video(tmp_path / f"out{suffix}", make_frames(7), fps=fps)
    decoded, stream = decode(tmp_path / f"out{suffix}")
    assert decoded.shape == (7, H, W, 3)
    assert stream.average_rate == Fraction(fps).limit_denominator(1001)
    assert info == VideoInfo(str(tmp_path / f"out{suffix}"), info.codec, 7,
                             (tmp_path / f"out{suffix}").stat().st_size)
    assert info.codec == {".mp4": "libx264", ".mkv": "ffv1", ".webm": "libvpx-vp9"}[suffix]


def test_ffv1_mkv_is_bit_exact(tmp_path):
    frames = make_frames(5, 17, 23)
    write_video(tmp_path / "out.mkv", frames)
    decoded, stream = decode(tmp_path / "out.mkv")
    assert stream.codec == "ffv1"
    np.testing.assert_array_equal(decoded, frames)


def test_mkv_takes_h264(tmp_path):
    info = write_video(tmp_path / "out.mkv", make_frames(4), codec="h264", crf=30,
                       preset="ultrafast")
    decoded, stream = decode(tmp_path / "out.mkv")
    assert (info.codec, stream.codec, len(decoded)) == ("libx264", "h264", 4)


def test_mp4_pads_odd_sizes_by_one_pixel(tmp_path):
    write_video(tmp_path / "odd.mp4", make_frames(3, 15, 17))
    decoded, _ = decode(tmp_path / "odd.mp4")
    assert decoded.shape == (3, 16, 18, 3)  # documented: odd sizes grow by one repeated pixel
    padded = pixels.pad_to_even(make_frames(1, 15, 17))
    np.testing.assert_array_equal(padded[:, 15], padded[:, 14])
    np.testing.assert_array_equal(padded[:, :, 17], padded[:, :, 16])


def test_webm_keeps_odd_sizes(tmp_path):
    write_video(tmp_path / "odd.webm", make_frames(3, 15, 17))
    assert decode(tmp_path / "odd.webm")[0].shape == (3, 15, 17, 3)


def test_gif_streams_frames_with_drift_free_delays(tmp_path):
    frames = make_frames(8)
    info = write_video(tmp_path / "out.gif", frames, fps=16)
    with Image.open(tmp_path / "out.gif") as image:
        assert (image.n_frames, image.size, image.info["loop"]) == (8, (W, H), 0)
        durations = []
        for index in range(image.n_frames):
            image.seek(index)
            durations.append(image.info["duration"])
            error = np.abs(np.asarray(image.convert("RGB"), dtype=int) - frames[index]).mean()
            assert error < 16  # 256-colour palette per frame
    assert sum(durations) == 500 and set(durations) == {60, 70}  # 8 frames at 16 fps = 0.5 s
    assert (info.codec, info.frames) == ("gif", 8)


def test_webp_round_trips(tmp_path):
    info = write_video(tmp_path / "out.webp", make_frames(6), fps=16)
    with Image.open(tmp_path / "out.webp") as image:
        assert (image.n_frames, image.size, image.info["loop"]) == (6, (W, H), 0)
    assert (info.codec, info.frames) == ("libwebp", 6)


def test_npy_is_exact_across_many_small_blocks(tmp_path):
    frames = make_frames(40)
    info = write_video(tmp_path / "out.npy", frames, block=1)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), frames)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy", mmap_mode="r"), frames)
    assert info.frames == 40 and info.bytes == (tmp_path / "out.npy").stat().st_size


def test_png_folder_is_exact_and_drops_stale_frames(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "frame_000009.png").write_bytes(b"stale")
    (folder / "notes.txt").write_text("kept")
    frames = make_frames(4)
    info = write_video(f"{folder}/", frames)
    names = sorted(path.name for path in folder.glob("frame_*.png"))
    assert names == [f"frame_{index:06d}.png" for index in range(4)]
    for index, name in enumerate(names):
        np.testing.assert_array_equal(np.asarray(Image.open(folder / name)), frames[index])
    assert (folder / "notes.txt").exists()
    assert info.bytes == sum(path.stat().st_size for path in folder.glob("frame_*.png"))


def test_path_without_suffix_is_a_new_png_folder(tmp_path):
    info = write_video(tmp_path / "frames", make_frames(2))
    assert (info.codec, len(list((tmp_path / "frames").glob("frame_*.png")))) == ("png", 2)


def test_takes_tensors_and_copies_the_callers_buffer(tmp_path):
    frames = make_frames(4)
    buffer = frames.copy()
    with VideoWriter(tmp_path / "out.npy", 16) as writer:
        writer.write(torch.from_numpy(buffer[:2]).permute(0, 3, 1, 2).permute(0, 2, 3, 1))
        writer.write(buffer[2:])
        buffer[:] = 0  # the writer owns copies: reusing the buffer changes nothing
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), frames)
    assert writer.frames_written == 4


# --- finishing, failures, overwrite -------------------------------------------------------

def test_close_twice_returns_the_same_info(tmp_path):
    writer = VideoWriter(tmp_path / "out.mp4", 16)
    writer.write(make_frames(2))
    assert writer.close() == writer.close() == writer.info
    with pytest.raises(EncoderError, match=r"write\(\) after close\(\)"):
        writer.write(make_frames(1))


def test_disk_full_mid_run_keeps_a_playable_file(tmp_path, monkeypatch):
    fail_after(monkeypatch, encoders.PyAVEncoder, 3,
               OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    writer = VideoWriter(tmp_path / "out.mp4", 16)
    deadline = time.monotonic() + 10
    with pytest.raises(EncoderError, match="failed after 3 frames .*No space left on device"):
        while time.monotonic() < deadline:  # write raises once the encoder thread has failed
            writer.write(make_frames(2))
            time.sleep(0.01)
    with pytest.raises(EncoderError, match=r"out\.mp4.*the 3 frames encoded before it are kept in"):
        writer.close()
    with pytest.raises(EncoderError):  # a second close reports the same failure
        writer.close()
    assert writer.info.frames == 3
    assert len(decode(tmp_path / "out.mp4")[0]) == 3
    assert not list(tmp_path.glob(".*partial*"))


def test_exception_in_with_block_finalizes_and_propagates(tmp_path):
    frames = make_frames(5)
    with pytest.raises(KeyboardInterrupt):
        with VideoWriter(tmp_path / "out.mkv", 16) as writer:
            writer.write(frames)
            raise KeyboardInterrupt  # Ctrl-C mid-rollout
    np.testing.assert_array_equal(decode(tmp_path / "out.mkv")[0], frames)


def test_body_exception_wins_over_encoder_failure(tmp_path, monkeypatch):
    fail_after(monkeypatch, encoders.NpyEncoder, 1, OSError(errno.EIO, "I/O error"))
    with pytest.raises(RuntimeError, match="pipeline broke") as caught:
        with VideoWriter(tmp_path / "out.npy", 16) as writer:
            writer.write(make_frames(3))
            raise RuntimeError("pipeline broke")
    assert any("failed after 1 frames" in note for note in caught.value.__notes__)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), make_frames(3)[:1])


def test_existing_file_is_replaced_only_when_the_run_ends(tmp_path):
    target = tmp_path / "out.mp4"
    target.write_bytes(b"old video")
    with VideoWriter(target, 16) as writer:
        writer.write(make_frames(3))
        assert target.read_bytes() == b"old video"  # still the old one while encoding
    assert len(decode(target)[0]) == 3
    assert not list(tmp_path.glob(".*partial*"))


def test_run_without_frames_leaves_the_target_alone(tmp_path):
    target = tmp_path / "out.mp4"
    target.write_bytes(b"old video")
    with VideoWriter(target, 16) as writer:
        pass
    assert writer.info == VideoInfo(str(target), "libx264", 0, 0)
    assert target.read_bytes() == b"old video"


def test_write_waits_when_the_queue_is_full(tmp_path, monkeypatch):
    release = threading.Event()
    original = encoders.NpyEncoder._encode_frame

    def slow_encode(self, frame):
        release.wait(10)
        original(self, frame)

    monkeypatch.setattr(encoders.NpyEncoder, "_encode_frame", slow_encode)
    writer = VideoWriter(tmp_path / "out.npy", 16, queue_blocks=2)
    done = []

    def produce():
        for index in range(10):
            writer.write(make_frames(1, seed=index))
            done.append(index)

    producer = threading.Thread(target=produce)
    producer.start()
    deadline = time.monotonic() + 5
    while len(done) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    # one block in the encoder, two queued; the fourth write waits instead of growing memory
    assert len(done) == 3 and producer.is_alive()
    release.set()
    producer.join(10)
    assert writer.close().frames == 10


def test_the_encoder_starts_on_a_whole_batch_and_close_encodes_the_rest(tmp_path):
    writer = VideoWriter(tmp_path / "out.npy", 16)
    for index in range(ENCODE_BATCH_BLOCKS - 1):
        writer.write(make_frames(1, seed=index))
    time.sleep(0.2)
    assert writer._encoder.frames == 0  # waiting for the batch: nothing encoded yet
    writer.write(make_frames(1, seed=99))
    deadline = time.monotonic() + 10
    while writer._encoder.frames < ENCODE_BATCH_BLOCKS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer._encoder.frames == ENCODE_BATCH_BLOCKS
    writer.write(make_frames(1, seed=100))  # less than a batch: close encodes it
    assert writer.close().frames == ENCODE_BATCH_BLOCKS + 1
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy")[-1], make_frames(1, seed=100)[0])


# --- misuse -----------------------------------------------------------------------------

@pytest.mark.parametrize("frames, message", [
    (np.zeros((2, H, W, 3), np.float32), "frames: dtype float32 is not uint8"),
    (torch.zeros(2, H, W, 3), "frames: dtype torch.float32 is not torch.uint8"),
    (np.zeros((2, 3, H, W), np.uint8), r"frames: shape \(2, 3, 16, 24\) is not \[F, H, W, 3\]"),
    (np.zeros((H, W, 3), np.uint8), r"frames: shape \(16, 24, 3\) is not"),
    ([[0]], "frames: list is not a torch.Tensor or a numpy array"),
])
def test_write_rejects_bad_frames(tmp_path, frames, message):
    with VideoWriter(tmp_path / "out.npy", 16) as writer:
        with pytest.raises(EncoderError, match=message):
            writer.write(frames)


def test_frame_size_is_fixed_by_the_first_write(tmp_path):
    with VideoWriter(tmp_path / "out.mp4", 16) as writer:
        writer.write(make_frames(1))
        with pytest.raises(EncoderError, match="frames: size 8x8 .HxW. differs from the first "
                                               "frames' 16x24"):
            writer.write(make_frames(1, 8, 8))


@pytest.mark.parametrize("kwargs, message", [
    (dict(fps=0), "output.fps: 0 must be a finite number > 0"),
    (dict(fps=16, crf=99), r"output.crf: 99 is out of range for libx264 \(0..51\)"),
    (dict(fps=16, preset="turbo"), "output.preset: 'turbo' is not an x264 preset"),
    (dict(fps=16, queue_blocks=0), "output.queue_blocks: 0 must be an integer >= 1"),
])
def test_writer_rejects_bad_settings(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        VideoWriter(tmp_path / "out.mp4", **kwargs)
    with pytest.raises(ConfigError):
        VideoWriter(f"{tmp_path}/frames/", **kwargs)
    assert not list(tmp_path.iterdir())  # nothing is made before the settings are checked


def test_crf_on_a_codec_without_one_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="output.crf: 20 is set but gif has no crf"):
        VideoWriter(tmp_path / "out.gif", 16, crf=20)


# --- check_output_path ------------------------------------------------------------------

def test_check_output_path_accepts_and_creates_nothing(tmp_path):
    for suffix in SUPPORTED_EXTENSIONS:
        assert check_output_path(tmp_path / f"out{suffix}") == tmp_path / f"out{suffix}"
    check_output_path(f"{tmp_path}/frames/")
    check_output_path(tmp_path / "out.mkv", codec="h264")
    assert not list(tmp_path.iterdir())


def test_check_output_path_missing_folder(tmp_path):
    with pytest.raises(OutputPathError, match=r"output.path: '.*/nope/out.mp4' is in a folder "
                                              r"that does not exist .*; create it first"):
        check_output_path(tmp_path / "nope" / "out.mp4")


def test_check_output_path_unwritable_folder(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    if os.access(folder, os.W_OK):
        pytest.skip("running as root: permissions do not block writing")
    with pytest.raises(OutputPathError, match="output.path: .* is in a folder that is not "
                                              "writable .*; fix its permissions"):
        check_output_path(folder / "out.mp4")


def test_check_output_path_unsupported_suffix(tmp_path):
    with pytest.raises(OutputPathError, match=r"output.path: '.*out.avi' has an unsupported "
                                              r"suffix '.avi'; use one of .mp4, .mkv, .webm, "
                                              r".gif, .webp, .npy, or a folder"):
        check_output_path(tmp_path / "out.avi")


def test_check_output_path_unknown_codec(tmp_path):
    with pytest.raises(OutputPathError, match="output.codec: 'hevc' is not a codec for .mp4 "
                                              "files; use one of libx264"):
        check_output_path(tmp_path / "out.mp4", codec="hevc")


def test_check_output_path_codec_missing_from_ffmpeg(tmp_path, monkeypatch):
    monkeypatch.setattr(codecs, "is_codec_available", lambda name: False)
    with pytest.raises(OutputPathError, match="output.codec: 'libvpx-vp9' .* is not available "
                                              "in this PyAV/FFmpeg build"):
        check_output_path(tmp_path / "out.webm")


def test_check_output_path_file_where_a_folder_is_meant(tmp_path):
    (tmp_path / "frames").write_text("a file")
    with pytest.raises(OutputPathError, match="output.path: .* is an existing file, and a path "
                                              "without a suffix means a folder of PNG frames"):
        check_output_path(tmp_path / "frames")
