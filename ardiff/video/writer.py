"""Streaming video output: frames are encoded as the rollout produces them.

The format follows the output path's suffix:

    .mp4   H.264 (libx264, yuv420p; crf 23, preset veryfast)
    .mkv   FFV1, lossless (default) or codec='h264'
    .webm  VP9 (libvpx-vp9, yuv420p, constant quality; crf 32)
    .gif   256-colour palette per frame, loops forever
    .webp  animated lossy WebP (quality 80), loops forever
    .npy   raw uint8 [N, H, W, 3], for exact checks
    a folder (ends with '/', has no suffix or already is one): frame_000000.png, ...

`VideoWriter.write` hands blocks of frames to a background encoder thread
through a queue of at most `queue_blocks` blocks, so memory does not grow with
the length of the video; a full queue makes `write` wait (back-pressure).

Every finished frame stays playable: the writer encodes into a hidden
`.<name>.partial<suffix>` beside the target and, when the run ends (close,
failure, Ctrl-C through `with`), finalizes it and renames it onto the target.
So an existing file is overwritten when the run ends, and only by a finished,
playable file; a run that wrote no frame leaves the target untouched. A PNG
folder is written in place (each PNG complete before it appears). Only a
killed process (SIGKILL, power loss) leaves an unfinished `.partial` file.

H.264 stores 4:2:0 colour, which needs even sizes: an odd width or height is
padded by one pixel repeating the last column/row (15x17 is stored as 16x18).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import queue
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from ardiff.video import encoders
from ardiff.errors import ConfigError, EncoderError, OutputPathError

SUPPORTED_EXTENSIONS = tuple(kind for kind in encoders.FORMAT_CODECS if kind != encoders.DIRECTORY)
_RATE_MAX_DENOMINATOR = 1001  # NTSC rates (30000/1001) stay exact
_END = None  # the queue's end marker


def check_output_path(path: str | os.PathLike, codec: str | None = None,
                      crf: int | None = None, preset: str | None = None) -> Path:
    """Check, before any compute, that a video can be written at `path`; returns it as a Path.

    A path ending with '/', without a suffix, or naming an existing folder means a PNG
    folder (created by the writer; its parent must exist). Creates nothing. Raises
    OutputPathError naming `output.path` (missing or unwritable folder, unsupported
    suffix) or `output.codec` (not a codec of the format, or missing from PyAV's FFmpeg),
    and ConfigError naming `output.crf` / `output.preset` (out of range, or not a knob
    of the codec).
    """
    target = Path(path)
    kind = output_kind(path)
    if kind == encoders.DIRECTORY and target.exists() and not target.is_dir():
        raise OutputPathError(f"output.path: {str(path)!r} is an existing file, and a path "
                              f"without a suffix means a folder of PNG frames; add a suffix "
                              f"({', '.join(SUPPORTED_EXTENSIONS)}) or pick another name")
    if kind not in encoders.FORMAT_CODECS:
        raise OutputPathError(f"output.path: {str(path)!r} has an unsupported suffix {kind!r}; "
                              f"use one of {', '.join(SUPPORTED_EXTENSIONS)}, or a folder "
                              f"(a path ending in '/') for PNG frames")
    _check_folder(path, target.parent)
    if kind == encoders.DIRECTORY and target.is_dir():
        _check_folder(path, target)
    encoders.EncoderSettings(kind, encoders.resolve_codec(kind, codec), crf, preset)
    return target


def output_kind(path: str | os.PathLike) -> str:
    """The format key of `path`: its lower-case suffix, or encoders.DIRECTORY for a PNG folder."""
    text, target = os.fspath(path), Path(path)
    if text.endswith(("/", os.sep)) or not target.suffix or target.is_dir():
        return encoders.DIRECTORY
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
    encoded); every frame has the size of the first; `close` (or leaving a `with`
    block, normally or by an exception) finalizes the file with every frame encoded
    so far. Raises OutputPathError / ConfigError for a bad path, codec, crf, preset,
    fps or queue size; EncoderError from `write`/`close` once encoding has failed.
    """

    def __init__(self, path: str | os.PathLike, fps: float, *, codec: str | None = None,
                 crf: int | None = None, preset: str | None = None,
                 queue_blocks: int = 8) -> None:
        self.path = check_output_path(path, codec)  # settings are checked before anything is made
        kind = output_kind(path)
        settings = encoders.EncoderSettings(kind, encoders.resolve_codec(kind, codec), crf, preset)
        rate, maxsize = _stream_rate(fps), _queue_size(queue_blocks)
        self.codec = settings.codec
        self.frames_written = 0  # frames handed to `write`
        self._frame_size: tuple[int, int] | None = None  # (H, W) of the first block
        self._error: BaseException | None = None  # the first failure on the encoder thread
        self._finalized: bool | None = None  # None: not yet; then whether it went without error
        self._closed = False
        self._info: VideoInfo | None = None
        self._work_path = self.path if kind == encoders.DIRECTORY else _partial_path(self.path)
        try:
            self._encoder = encoders.make_encoder(self._work_path, rate, settings)
        except OSError as exc:  # a PNG folder that cannot be made or cleaned
            raise EncoderError(f"output.path: cannot prepare {str(self.path)!r} ({exc}); check "
                               f"its permissions or pick another path") from exc
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._run, name=f"ardiff-video:{self.path.name}",
                                        daemon=True)
        self._thread.start()

    @property
    def info(self) -> VideoInfo | None:
        """What the closed writer produced (also after a failure); None before `close`."""
        return self._info

    def write(self, frames: torch.Tensor | np.ndarray) -> None:
        """Queue uint8 frames [F, H, W, 3] (a tensor on any device, or an array) for encoding.

        Copies the frames, so the caller may reuse its buffer. Waits while the queue is
        full. Raises EncoderError for a wrong dtype/shape, a size unlike the first
        frames', a closed writer, or an earlier encoding failure.
        """
        if self._closed:
            raise EncoderError(f"video {str(self.path)!r}: write() after close(); write every "
                               f"frame before closing the writer")
        block = _as_block(frames)
        self._check_size(block)
        self._raise_if_failed()
        if len(block):
            self._queue.put(block)
            self.frames_written += len(block)

    def close(self) -> VideoInfo:
        """Encode what is queued, finalize the file, move it onto `path`; returns what was written.

        Safe to call twice: later calls return the same info (or raise the same error).
        Raises EncoderError if encoding failed; the file then holds every frame encoded
        before the failure (see `info`).
        """
        if not self._closed:
            self._closed = True
            self._queue.put(_END)
            self._thread.join()
            self._info = self._publish()
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
        """Encoder thread: encode blocks until the end marker, then finalize.

        After a failure the file is finalized at once and later blocks are taken and
        dropped, so a producer waiting on a full queue is never stuck.
        """
        while (block := self._queue.get()) is not _END:
            if self._error is None:
                try:
                    self._encoder.write(block)
                except BaseException as exc:  # noqa: BLE001 - handed to the producer thread
                    self._error = exc
                    self._finalize()
        self._finalize()

    def _finalize(self) -> None:
        if self._finalized is not None:
            return
        try:
            self._encoder.close()
        except BaseException as exc:  # noqa: BLE001
            self._error = self._error or exc
            self._finalized = False
        else:
            self._finalized = True

    def _publish(self) -> VideoInfo:
        """Move a finalized file onto the target (never an unfinished one); describe the result."""
        if self._finalized and self._encoder.is_open and self._work_path != self.path:
            try:
                os.replace(self._work_path, self.path)
            except OSError as exc:
                self._error = self._error or exc
                self._finalized = False
        if not (self._finalized and self._encoder.is_open):
            return VideoInfo(str(self.path), self.codec, 0, 0)
        return VideoInfo(str(self.path), self.codec, self._encoder.frames, _size_bytes(self.path))

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
        if self._error is None:
            return
        frames = self._encoder.frames
        if self._finalized is False:
            kept = f"the unfinished file {str(self._work_path)!r} may not play"
        elif not frames:
            kept = "no frame was written"
        else:  # close() (always run by the rollout) finalizes them into the target
            kept = f"the {frames} frames encoded before it are kept in {str(self.path)!r}"
        raise EncoderError(f"output.path: encoding {str(self.path)!r} ({self.codec}) failed "
                           f"after {frames} frames ({type(self._error).__name__}: "
                           f"{self._error}); {kept}; check free disk space and permissions, "
                           f"then rerun") from self._error


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


def _partial_path(target: Path) -> Path:
    """Where a file is encoded before it replaces `target`: hidden, same folder, same suffix."""
    return target.with_name(f".{target.stem}.partial{target.suffix}")


def _size_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(frame.stat().st_size for frame in path.glob("frame_*.png"))
    return path.stat().st_size if path.exists() else 0
