"""The frame encoders behind `writer.VideoWriter`, one class per kind of output; formats.py
names the class each format uses.

    Encoder.write(block)   opens on the first block (its size fixes the video size)
    Encoder.close()        finishes the file; idempotent; sets `kept`, the frames it holds

An encoder writes one work file (or PNG work folder) through `disk.OutputFile`, holding at
most one block of frames and a `leftovers.WorkLock` on it. On a full disk .npy, GIF and PNG
folders finish in place without new room; PyAV formats finish in the space reserve's room
(disk.py), else `kept` is what a decoder can still read (an mp4 begun on a disk too full
for the reserve is written as fragments, so that is every fragment on disk). Encoders run
on the writer's thread, are not thread-safe, and raise what their library raises (the
writer turns it into an `EncoderError`).
"""

from __future__ import annotations

import contextlib
import os
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter
from PIL import GifImagePlugin, Image

from ardiff.video import disk, leftovers
from ardiff.video.codecs import EncoderSettings
from ardiff.video.pixels import pad_to_even, upscale, yuv420_upscaled

GIF_COLORS = 256
PNG_COMPRESS_LEVEL = 1  # zlib level: fast; PNG stays lossless at any level
_NPY_COUNT_DIGITS = 20  # the frame count's fixed width in the .npy header, so it can be rewritten
GIF_TRAILER = b";"
_BOX_HEADER_BYTES = 8  # an ISO BMFF box: 32-bit size, 4-byte type
PYAV_BUFFER_BYTES = 256 * 2**10  # PyAV hands the file this much per write call (default 32 KiB)


class Encoder:
    """Writes uint8 RGB frames to `path`; subclasses say how. Holds at most one block.

    `frames`: frames whose encoding completed. `kept`: frames the finished file holds,
    set by `close` (None before); after a failure it is what could be saved, maybe 0.
    """

    def __init__(self, path: Path, rate: Fraction, settings: EncoderSettings) -> None:
        self.path, self.rate, self.settings = path, rate, settings
        self.frames = 0  # frames fully handed to the file's encoder
        self.kept: int | None = None
        self.size: tuple[int, int] | None = None  # (H, W) as encoded; set by the first block
        self._file: disk.OutputFile | None = None
        self._reserve: disk.SpaceReserve | None = None
        self._lock: leftovers.WorkLock | None = None
        self._closed = False

    @property
    def is_open(self) -> bool:
        return self.size is not None

    def write(self, block: np.ndarray) -> None:  # block: [F, H, W, 3] uint8, F >= 1
        """Encode `block`, upscaled `settings.scale` times (nearest-neighbour, in RGB)."""
        self._write_frames(upscale(block, self.settings.scale), 1)

    def _write_frames(self, block: np.ndarray, scale: int) -> None:
        """Encode `block`'s frames; the video is `scale` times their size (1: already is)."""
        if self.size is None:
            height, width = block.shape[1] * scale, block.shape[2] * scale
            self._open(height, width)
            self._lock = leftovers.WorkLock(self.path)  # until `discard`: the work is a live run's
            self.size = (height, width)
        for frame in block:  # [H, W, 3]
            self._encode_frame(frame)
            self.frames += 1
            if self._file is not None and self._file.error is not None:
                raise self._file.error  # e.g. the reserve took this frame: finish now

    def close(self) -> None:
        """Finish the file (nothing if no frame came) and set `kept`. Idempotent; may raise once."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._reserve is not None:
                self._reserve.release()  # finishing may need the room
            self.kept = 0
            if self.is_open:
                self._finish()
        finally:
            if self._file is not None:
                self._file.close()

    def _finish(self) -> None:
        try:
            self._finalize()
        except BaseException:
            self.kept = self._salvage()
            raise
        self.kept = self.frames

    def publish(self, target: Path) -> int:
        """Move the finished work file onto `target` (atomically); returns its bytes."""
        return disk.publish_file(self.path, target)

    def discard(self) -> None:
        """Remove what is left of the work file and the reserve (quiet if nothing is)."""
        disk.discard(self.path)
        if self._lock is not None:
            self._lock.release()

    def _open(self, height: int, width: int) -> None:
        pass

    def _encode_frame(self, frame: np.ndarray) -> None:
        raise NotImplementedError

    def _finalize(self) -> None:
        pass

    def _salvage(self) -> int:
        """Frames a failed finish still left in a playable file."""
        return 0


class PyAVEncoder(Encoder):
    """The formats with a PyAV `container`. Stream rate = `rate`, one pts tick per frame.

    A codec with `even_size` (libx264, 4:2:0) gets an odd width or height padded by one
    pixel that repeats the last column/row, so a 15x17 video is stored as 16x18. PyAV
    writes through an `OutputFile` with a `SpaceReserve` (see disk.py). When the disk
    cannot spare the reserve, a format with `nearly_full_options` (mp4) is written with
    them, as fragments that play without the index: a failure then cuts the file after its
    last whole fragment (`whole_fragments_end`).

    `settings.scale` (nearest-neighbour) for a `yuv_upscale` codec at an even scale: each
    frame is converted to YUV 4:4:4 at its own size, then the planes are repeated (luma
    x scale, chroma x scale/2) into the 4:2:0 frame the codec takes, so neither the RGB
    upscale nor the colour conversion runs at the video's size. Every 2x2 chroma sample
    lies inside one upscaled pixel, so this is the exact 4:2:0 of the upscaled frame
    (point-sampled chroma); the codec's own conversion of an RGB-upscaled frame filters
    chroma bilinearly across the pixel edges. Luma is identical. Other scales and
    codecs upscale in RGB first.
    """

    def write(self, block: np.ndarray) -> None:
        scale, codec = self.settings.scale, self.settings.codec
        if scale > 1 and scale % 2 == 0 and codec.yuv_upscale:
            self._write_frames(block, scale)
            return
        block = upscale(block, scale)
        if codec.even_size:
            block = pad_to_even(block)
        self._write_frames(block, 1)

    def _open(self, height: int, width: int) -> None:
        output, codec = self.settings.format, self.settings.codec
        self._to_yuv = VideoReformatter()  # keeps its swscale context from frame to frame
        self._reserve = disk.SpaceReserve(disk.reserve_path(self.path))
        self._file = disk.OutputFile(self.path, self._reserve)
        self._fragmented = self._reserve.disk_full and bool(output.nearly_full_options)
        options = output.container_options + (output.nearly_full_options
                                               if self._fragmented else ())
        self._container = av.open(self._file, "w", format=output.container,
                                  options=dict(options), buffer_size=PYAV_BUFFER_BYTES)
        stream = self._container.add_stream(codec.name, rate=self.rate,
                                            options=self._codec_options())
        stream.width, stream.height, stream.pix_fmt = width, height, codec.pix_fmt
        stream.time_base = stream.codec_context.time_base = 1 / self.rate  # pts counts frames
        if codec.bit_rate is not None:
            stream.bit_rate = codec.bit_rate
        self._stream = stream

    def _codec_options(self) -> dict[str, str]:
        """crf and preset (the settings', else the codec's defaults), then the codec's options."""
        codec, crf, preset = self.settings.codec, self.settings.crf, self.settings.preset
        knobs: dict[str, str] = {}
        if codec.crf is not None:
            knobs["crf"] = str(codec.default_crf if crf is None else crf)
        if codec.presets:
            knobs["preset"] = preset or codec.default_preset
        return {**knobs, **dict(codec.options)}

    def _encode_frame(self, frame: np.ndarray) -> None:
        av_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
        if frame.shape[:2] != self.size:  # upscaled in YUV (see the class docstring)
            av_frame = yuv420_upscaled(self._to_yuv.reformat(av_frame, format="yuv444p"),
                                       self.settings.scale)
        av_frame.pts = self.frames
        self._container.mux(self._stream.encode(av_frame))

    def _finalize(self) -> None:
        try:
            if self._file.write_error is None:  # muxing after a failed write crashes PyAV
                self._container.mux(self._stream.encode())  # flush frames held by the codec
        finally:
            self._container.close()  # writes the trailer (mp4: the moov atom)
        if self._file.write_error is not None:  # PyAV does not always raise it
            raise self._file.write_error

    def _salvage(self) -> int:
        self._file.close()
        if self._fragmented:  # a torn last fragment would end playback with an error
            os.truncate(self.path, whole_fragments_end(self.path))
        return min(self.frames, playable_frames(self.path, self.settings.kind))


def whole_fragments_end(path: Path) -> int:
    """Where a fragmented mp4 (ISO BMFF) ends after its last whole fragment: the end of the
    last whole `mdat` box, else of the `moov` (0 if not even that reached the disk).

        | ftyp | moov | moof | mdat | moof | mdat | moof | md...      (torn here)
                                           end ^
    """
    end = offset = 0
    with open(path, "rb") as file:
        length = os.fstat(file.fileno()).st_size
        while offset + _BOX_HEADER_BYTES <= length:
            file.seek(offset)
            size, kind = struct.unpack(">I4s", file.read(_BOX_HEADER_BYTES))
            if size == 1:  # a 64-bit size follows the type
                size = struct.unpack(">Q", file.read(8))[0]
            if size < _BOX_HEADER_BYTES or offset + size > length:  # 0: "to the end"; torn
                break
            offset += size
            if kind in (b"moov", b"mdat"):
                end = offset
    return end


def playable_frames(path: Path, kind: str) -> int:
    """Frames a decoder reads from `path` before it ends or breaks; 0 if it cannot open it."""
    count = 0
    try:
        if kind == ".webp":  # FFmpeg does not decode animated WebP; Pillow does
            with Image.open(path) as image:
                for index in range(image.n_frames):
                    image.seek(index)
                    image.load()
                    count += 1
            return count
        with av.open(str(path)) as container:
            for _frame in container.decode(video=0):
                count += 1
    except Exception:  # noqa: BLE001 - a broken file ends the count, whatever the library says
        pass
    return count


class GifEncoder(Encoder):
    """Animated GIF, written frame by frame (Pillow's save_all keeps every frame in memory).

    Each frame gets its own 256-colour palette (Pillow's fast octree quantizer). GIF
    delays are in 1/100 s: frame i lasts round((i+1)*100/fps) - round(i*100/fps), so
    the total length does not drift (16 fps: 6,6,7,6,6,...). Loops forever.

        | header | frame 0 | frame 1 | ... | frame n-1 | ; |      the trailer follows every
                                              _end ----^          frame; frame n starts on it
    """

    def _open(self, height: int, width: int) -> None:
        self._file = disk.OutputFile(self.path)
        self._end = 0  # where the trailer after the last whole frame sits

    def _encode_frame(self, frame: np.ndarray) -> None:
        image = Image.fromarray(frame).quantize(GIF_COLORS, method=Image.Quantize.FASTOCTREE)
        duration_ms = 10 * (self._ticks(self.frames + 1) - self._ticks(self.frames))
        if self.frames == 0:  # the first frame's palette is the global one
            header, _ = GifImagePlugin.getheader(image, info={"loop": 0, "duration": duration_ms})
            chunks = [*header, *GifImagePlugin.getdata(image, duration=duration_ms)]
        else:
            chunks = GifImagePlugin.getdata(image, duration=duration_ms, include_color_table=True)
        data = b"".join(chunks)
        self._file.seek(self._end)
        self._file.write(data + GIF_TRAILER)
        self._end += len(data)

    def _ticks(self, frames: int) -> int:
        return round(frames * 100 / self.rate)  # centiseconds since the start

    def _finalize(self) -> None:
        """Cut a torn frame off and put the trailer back: bytes already on disk, no new room."""
        self._file.truncate(self._end + len(GIF_TRAILER))
        self._file.seek(self._end)
        self._file.write(GIF_TRAILER)


class PngDirEncoder(Encoder):
    """One PNG per frame, frame_000000.png, ..., in the work folder `path` (inside the target
    folder, made with the first frame; the writer moves the frames out when the run ends).

    Each PNG is written under a hidden name and renamed, so every frame_*.png is complete.
    """

    made_target = False  # whether the first frame made the target folder

    def _open(self, height: int, width: int) -> None:
        self.made_target = not self.path.parent.exists()
        self.path.parent.mkdir(exist_ok=True)
        self.path.mkdir()

    def publish(self, target: Path) -> int:
        return disk.publish_folder(self.path, target)

    def discard(self) -> None:
        super().discard()
        if self.made_target and not self.kept:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()  # only if still empty

    def _encode_frame(self, frame: np.ndarray) -> None:
        final = self.path / f"frame_{self.frames:06d}.png"
        partial = self.path / f".{final.name}.partial"
        file = disk.OutputFile(partial)
        try:
            Image.fromarray(frame).save(file, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        except BaseException:
            file.close()
            partial.unlink(missing_ok=True)
            raise
        file.close()
        os.replace(partial, final)


class NpyEncoder(Encoder):
    """Raw uint8 [N, H, W, 3] in .npy v1.0; N in the header is rewritten at close.

        | magic 8 B | header len 2 B | {'shape': (<N, 20 wide>, H, W, 3)...} padded to 64 | frames |
    """

    def _open(self, height: int, width: int) -> None:
        self._file = disk.OutputFile(self.path)
        self._file.write(npy_header(0, height, width))

    def _encode_frame(self, frame: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(frame).data)

    def _finalize(self) -> None:
        """Cut a torn frame off and rewrite the header in place: no new room needed."""
        header = npy_header(self.frames, *self.size)
        height, width = self.size
        self._file.truncate(len(header) + self.frames * height * width * 3)
        self._file.seek(0)
        self._file.write(header)


def npy_header(frames: int, height: int, width: int) -> bytes:
    """The .npy v1.0 header of uint8 [frames, height, width, 3]; same length for any frames."""
    count = str(frames).rjust(_NPY_COUNT_DIGITS)
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({count}, {height}, {width}, 3), }}"
    magic = np.lib.format.magic(1, 0)
    unpadded = len(magic) + 2 + len(text) + 1  # 2: the header length field; 1: the newline
    text += " " * (-unpadded % np.lib.format.ARRAY_ALIGN) + "\n"
    return magic + struct.pack("<H", len(text)) + text.encode("latin1")


def make_encoder(path: Path, rate: Fraction, settings: EncoderSettings) -> Encoder:
    """The encoder of `settings.format`, writing to `path` (opened at the first block)."""
    return settings.format.encoder_class(path, rate, settings)
