"""Streaming video output: frames are encoded on a background thread as the rollout makes them.

    with VideoWriter("out.mp4", fps=16, scale=2) as writer:  # the format: the path's suffix
        writer.write(frames)        # uint8 [F, H, W, 3]; waits while the queue is full
    writer.info                     # VideoInfo: path, codec, frames kept, bytes

Formats are listed in formats.FORMATS; a path ending in '/', without a suffix or naming a
folder is a folder of PNG frames. Memory does not grow with the video: at most
`queue_blocks` blocks wait. A target (a symlink's target) is replaced only by a whole file,
when the run ends (one `os.replace`; a FIFO or device gets the bytes, see disk.py); a run
that wrote no frame leaves it untouched, and the work files go on every exit the process
survives (those of a killed run, with the next writer of the same target). A full disk
stops the writer at that frame and keeps every frame before it (an mp4 begun without room
for the space reserve: every frame that reached the disk); `info.frames` and the message
count what is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import numbers
import os
import queue
import threading
import weakref
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from ardiff.errors import ConfigError, EncoderError, OutputPathError
from ardiff.path_text import check_not_a_loop, check_path_text, landing
from ardiff.video import codecs, disk, encoders, formats, leftovers

SUPPORTED_EXTENSIONS = formats.file_suffixes()  # the shipped table's; checks read it live
_RATE_MAX_DENOMINATOR = 1001  # NTSC rates (30000/1001) stay exact
EXIT_WAIT_S = 5.0  # how long exit waits for an unclosed writer's encoder thread
_END = None  # the queue's end marker
# The encoder waits for this many blocks (or the run's end) and encodes them in a row:
# a frame encoded alone between two blocks of model work runs on cold caches and costs
# more CPU. The default queue_blocks holds a batch.
ENCODE_BATCH_BLOCKS = 8


def check_output_path(path: str | os.PathLike, codec: str | None = None,
                      crf: int | None = None, preset: str | None = None,
                      scale: int = 1) -> Path:
    """Check, before any compute, that a video can be written at `path`; returns it as a Path.

    A path ending with '/', without a suffix, or naming an existing folder means a PNG
    folder (created by the writer; its parent must exist). Creates nothing. Raises
    OutputPathError naming `output.path` (missing or unwritable folder, unsupported
    suffix) or `output.codec` (not a codec of the format, or missing from PyAV's FFmpeg),
    and ConfigError naming `output.crf` / `output.preset` (out of range, or not a knob
    of the codec) / `output.scale` (not 1..MAX_SCALE). An empty or blank path, or one
    with a NUL byte, is an OutputPathError.
    """
    check_path_text("output.path", path, file_needed=False)
    check_not_a_loop("output.path", path)
    target = Path(path)
    kind, suffixes = output_kind(path), ", ".join(formats.file_suffixes())
    if kind == formats.DIRECTORY and target.exists() and not target.is_dir():
        raise OutputPathError(f"output.path: {str(path)!r} is an existing file, and a path "
                              f"without a suffix means a folder of PNG frames; add a suffix "
                              f"({suffixes}) or pick another name")
    if kind not in formats.FORMATS:
        raise OutputPathError(f"output.path: {str(path)!r} has an unsupported suffix {kind!r}; "
                              f"use one of {suffixes}, or a folder "
                              f"(a path ending in '/') for PNG frames")
    real, stream = landing(target)  # a symlink's target gets the file (its work file beside it)
    _check_folder(path, real.parent if target.is_symlink() and not stream else target.parent)
    if kind == formats.DIRECTORY and target.is_dir():
        _check_folder(path, target)
    codecs.EncoderSettings(kind, codecs.resolve_codec(kind, codec), crf, preset, scale)
    return target


def output_kind(path: str | os.PathLike) -> str:
    """The format key of `path`: its lower-case suffix, or formats.DIRECTORY for a PNG folder."""
    text, target = os.fspath(path), Path(path)
    if text.endswith(("/", os.sep)) or not target.suffix or target.is_dir():
        return formats.DIRECTORY
    return target.suffix.lower()


def _check_folder(path: str | os.PathLike, folder: Path) -> None:
    if not folder.is_dir():
        raise OutputPathError(f"output.path: {os.fspath(path)!r} is in a folder that does not "
                              f"exist ({str(folder)!r}); create it first or pick another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"output.path: {os.fspath(path)!r} is in a folder that is not "
                              f"writable ({str(folder)!r}); fix its permissions or pick "
                              f"another path")


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    """What a closed writer produced. `frames`: frames in the file; `bytes`: its size
    (a PNG folder: the sum of its frame files)."""

    path: str
    codec: str
    frames: int
    bytes: int


class VideoWriter:
    """Encodes uint8 RGB frames to `path` on a background thread, block by block.

    Invariants: at most `queue_blocks` blocks wait in memory (plus the one being
    encoded), encoded in batches of ENCODE_BATCH_BLOCKS; every frame has the size of the
    first; the video is `scale` times that size (nearest-neighbour on the encoder thread,
    so a pipeline can hand over model-size frames); `close` (or leaving a `with` block,
    normally or by an exception) finalizes the file with every frame encoded so far.
    Raises OutputPathError / ConfigError for a bad path, codec, crf, preset, scale,
    fps or queue size; EncoderError from `write`/`close` once encoding has failed.
    """

    def __init__(self, path: str | os.PathLike, fps: float, *, codec: str | None = None,
                 crf: int | None = None, preset: str | None = None,
                 queue_blocks: int = 8, scale: int = 1) -> None:
        self.path = check_output_path(path, codec)  # settings are checked before anything is made
        kind = output_kind(path)
        settings = codecs.EncoderSettings(kind, codecs.resolve_codec(kind, codec), crf, preset,
                                            scale)
        rate, maxsize = _stream_rate(fps), _queue_size(queue_blocks)
        self.codec = settings.codec.name
        self.frames_written = 0  # frames handed to `write`
        self._frame_size: tuple[int, int] | None = None  # (H, W) of the first block
        self._error: BaseException | None = None  # the first failure (encoder thread, publish)
        self._closed = False
        self._info: VideoInfo | None = None
        folder = kind == formats.DIRECTORY
        # Written where the path leads: a symlink's target is replaced (its work file beside
        # it), a FIFO or device gets the finished file (its work file beside the path).
        self._target, stream = (self.path, False) if folder else landing(self.path)
        beside = self.path if stream else self._target
        leftovers.remove_dead_work(beside, folder=folder)  # a killed run's
        work = disk.work_path(beside, folder=folder)
        self._encoder = encoders.make_encoder(work, rate, settings)  # creates nothing yet
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(maxsize)
        self._batch_blocks = min(ENCODE_BATCH_BLOCKS, maxsize)
        self._thread = threading.Thread(target=self._run, name=f"ardiff-video:{self.path.name}",
                                        daemon=True)
        # At exit, if never closed: stop the encoder first (it may still create its space
        # reserve), then remove the work files.
        self._cleanup = weakref.finalize(self, _discard_at_exit, work, self._queue, self._thread)
        self._thread.start()

    @property
    def info(self) -> VideoInfo | None:
        """What the closed writer produced (also after a failure); None before `close`."""
        return self._info

    def write(self, frames: torch.Tensor | np.ndarray) -> None:
        """Queue uint8 frames [F, H, W, 3] (a tensor on any device, or an array) for encoding.

        Copies the frames, so the caller may reuse its buffer. Waits while the queue is
        full. Raises EncoderError for a wrong dtype/shape, a size unlike the first
        frames', a closed writer, or an earlier encoding failure (then the writer has
        closed itself: the file holds what the message says).
        """
        if self._closed:
            self._raise_if_failed()  # closed by its own failure: say that again
            raise EncoderError(f"video {str(self.path)!r}: write() after close(); write every "
                               f"frame before closing the writer")
        block = _as_block(frames)
        self._check_size(block)
        if self._error is not None:
            self.close()  # finish and publish first, so the message can say what is kept
        if len(block):
            self._queue.put(block)
            self.frames_written += len(block)

    def close(self) -> VideoInfo:
        """Encode what is queued, finish the file, move it onto `path`; returns what was written.

        Waits for the encoder uninterruptibly: a KeyboardInterrupt meanwhile is raised
        again after the file is published. Safe to call twice: later calls return the
        same info (or raise the same error). Raises EncoderError if encoding failed; the
        file then holds what `info` and the message say.
        """
        if not self._closed:
            self._closed = True
            held = self._wait_for_encoder()
            self._info = self._publish()
            if held is not None:
                raise held
        self._raise_if_failed()
        return self._info

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Finalize the file; an exception from the `with` body always propagates."""
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except EncoderError as err:  # the body's exception matters more; keep this as a note
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(str(err))

    def _run(self) -> None:
        """Encoder thread: encode blocks in batches until the end marker, then finish the file.

        After a failure the file is finished at once and later blocks are taken and
        dropped, so a producer waiting on a full queue is never stuck (a full queue
        holds a whole batch).
        """
        while True:
            for _ in range(self._wait_for_batch()):
                block = self._queue.get()  # one at a time: the queue bounds the memory
                if block is _END:
                    self._finish_encoder()
                    return
                self._encode(block)

    def _wait_for_batch(self) -> int:
        """Wait until a batch of blocks, or the end marker, is queued; how many are queued."""
        blocks, ready = self._queue.queue, self._queue.not_empty  # not_empty holds the mutex
        with ready:
            while len(blocks) < self._batch_blocks and not (blocks and blocks[-1] is _END):
                ready.wait()
            return len(blocks)

    def _encode(self, block: np.ndarray) -> None:
        if self._error is None:
            try:
                self._encoder.write(block)
            except BaseException as exc:  # noqa: BLE001 - handed to the producer thread
                self._error = exc
                self._finish_encoder()

    def _finish_encoder(self) -> None:
        try:
            self._encoder.close()  # idempotent: the second call after a failure does nothing
        except BaseException as exc:  # noqa: BLE001
            self._error = self._error or exc

    def _wait_for_encoder(self) -> KeyboardInterrupt | None:
        """Send the end marker and join the encoder thread, holding back Ctrl-C meanwhile."""
        held = None
        for step in (lambda: self._queue.put(_END), self._thread.join):
            while True:
                try:
                    step()
                    break
                except KeyboardInterrupt as exc:
                    held = exc
        return held

    def _publish(self) -> VideoInfo:
        """Move a finished file onto the target (never an unfinished one); describe the result."""
        kept, size = self._encoder.kept or 0, 0
        if kept:
            try:
                size = self._encoder.publish(self._target)
            except OSError as exc:
                self._error, kept = self._error or exc, 0
        self._encoder.discard()
        self._cleanup.detach()
        return VideoInfo(str(self.path), self.codec, kept, size)

    def _check_size(self, block: np.ndarray) -> None:
        size = block.shape[1:3]
        if self._frame_size is None:
            self._frame_size = size
        elif size != self._frame_size:
            raise EncoderError(f"frames: size {size[0]}x{size[1]} (HxW) differs from the first "
                               f"frames' {self._frame_size[0]}x{self._frame_size[1]} in "
                               f"{str(self.path)!r}; every frame of a video has one size, so "
                               f"write other sizes to another output")

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise EncoderError(_failure_message(self._error, str(self.path), self.codec,
                                                self._encoder.frames, self._info.frames)
                               ) from self._error


def _failure_message(error: BaseException, target: str, codec: str, encoded: int,
                     kept: int) -> str:
    """One line: what failed (the OSError's errno and text), what the target holds, the fix."""
    if not encoded:
        holds = f"no frame was written and {target!r} was not changed"
    elif kept == encoded:
        holds = f"the {kept} frames encoded before it are kept in {target!r}"
    elif kept:
        holds = (f"only the first {kept} of them could be kept in {target!r} (the file could "
                 f"not be finished)")
    else:
        holds = (f"no frame could be kept and {target!r} was not changed: the file could not "
                 f"be finished, and the part of it on disk holds no whole frame")
    return (f"output.path: writing {target!r} ({codec}) failed after {encoded} frames "
            f"({_describe(error)}); {holds}; {_fix(error, target)}")


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno is not None:
        return f"{type(error).__name__}: [Errno {error.errno}] {error.strerror}"
    return f"{type(error).__name__}: {error}"


def _fix(error: BaseException, target: str) -> str:
    folder = str(Path(target).resolve().parent)
    code = error.errno if isinstance(error, OSError) else None
    if code == errno.ENOSPC:
        return f"the disk holding {folder!r} is full: free some space, then rerun"
    if code == errno.EDQUOT:
        return f"your disk quota for {folder!r} is used up: free some space, then rerun"
    if isinstance(error, TimeoutError):  # disk.write_stream: a FIFO nobody reads
        return f"{target!r} is a FIFO that no process reads: start its reader first"
    if code == errno.EFBIG:
        return ("the file grew past what its file system (or `ulimit -f`) allows: write to "
                "another disk, or fewer frames")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{folder!r} cannot be written: fix its permissions, then rerun"
    if code is not None:
        return f"check the disk holding {folder!r}, then rerun"
    return "this is the encoder failing, not the disk; rerun with --debug for the traceback"


def _as_block(frames: torch.Tensor | np.ndarray) -> np.ndarray:
    """A private uint8 [F, H, W, 3] numpy copy of `frames`. Raises EncoderError."""
    if isinstance(frames, torch.Tensor):
        if frames.dtype != torch.uint8:
            raise EncoderError(f"frames: dtype {frames.dtype} is not torch.uint8; convert with "
                               f"(x.clamp(0, 1) * 255).round().to(torch.uint8) before writing")
        block = frames.detach().to("cpu", copy=True).numpy()
    elif isinstance(frames, np.ndarray):
        if frames.dtype != np.uint8:
            raise EncoderError(f"frames: dtype {frames.dtype} is not uint8; convert with "
                               f"(x.clip(0, 1) * 255).round().astype(np.uint8) before writing")
        block = frames.copy()
    else:
        raise EncoderError(f"frames: {type(frames).__name__} is not a torch.Tensor or a "
                           f"numpy array; pass uint8 frames [F, H, W, 3]")
    if block.ndim != 4 or block.shape[3] != 3 or 0 in block.shape[1:3]:
        raise EncoderError(f"frames: shape {tuple(block.shape)} is not [F, H, W, 3] with H, W "
                           f">= 1; channels go last (x.permute(0, 2, 3, 1) for [F, 3, H, W])")
    return np.ascontiguousarray(block)


def _stream_rate(fps: float) -> Fraction:
    """fps as the exact stream rate (29.97 -> 2997/100). Raises ConfigError (`output.fps`)."""
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not 0 < fps < math.inf:
        raise ConfigError(f"output.fps: {fps!r} must be a finite number > 0; try 16")
    exact = fps if isinstance(fps, numbers.Rational) else Fraction(float(fps))
    return Fraction(exact).limit_denominator(_RATE_MAX_DENOMINATOR)


def _queue_size(queue_blocks: int) -> int:
    if isinstance(queue_blocks, bool) or not isinstance(queue_blocks, int) or queue_blocks < 1:
        raise ConfigError(f"output.queue_blocks: {queue_blocks!r} must be an integer >= 1 "
                          f"(0 would make the queue unbounded); try 8")
    return queue_blocks


def _discard_at_exit(work: Path, blocks: queue.Queue, thread: threading.Thread) -> None:
    """A writer never closed, at interpreter exit: end its encoder thread (so it creates no
    file after this), then remove its work file and reserve."""
    with contextlib.suppress(queue.Full):
        blocks.put(_END, timeout=EXIT_WAIT_S)
    thread.join(timeout=EXIT_WAIT_S)
    disk.discard(work)
