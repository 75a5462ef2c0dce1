"""Per-format frame encoders behind `ardiff.video.writer.VideoWriter`, and the table of formats.

An encoder writes one file (or one PNG folder) frame by frame, holding at most
one block of frames: nothing grows with the length of the video.

    Encoder.write(block)   opens on the first block (its size fixes the video size)
    Encoder.close()        finalizes: flush + trailer (mp4/mkv/webm/webp), GIF
                           trailer, the .npy header's frame count; idempotent

Encoders run on the writer's background thread and are not thread-safe. They
raise what their library raises (OSError, av.FFmpegError, ...); the writer
turns that into an `EncoderError`.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import GifImagePlugin, Image

from ardiff.errors import ConfigError, OutputPathError

DIRECTORY = "/"  # the format key of a PNG-per-frame folder
# Allowed codecs per format; the first is the default.
FORMAT_CODECS: dict[str, tuple[str, ...]] = {
    ".mp4": ("libx264",),
    ".mkv": ("ffv1", "libx264"),
    ".webm": ("libvpx-vp9",),
    ".gif": ("gif",),
    ".webp": ("libwebp",),
    ".npy": ("npy",),
    DIRECTORY: ("png",),
}
CODEC_ALIASES = {"h264": "libx264", "x264": "libx264", "vp9": "libvpx-vp9", "webp": "libwebp"}
_AV_FORMATS = {".mp4": "mp4", ".mkv": "matroska", ".webm": "webm", ".webp": "webp"}
_AV_PIX_FMTS = {"libx264": "yuv420p", "ffv1": "bgr0", "libvpx-vp9": "yuv420p", "libwebp": "yuv420p"}
_EVEN_SIZE_CODECS = {"libx264"}  # x264 cannot encode 4:2:0 at odd width or height
_CRF_RANGES = {"libx264": range(0, 52), "libvpx-vp9": range(0, 64)}
DEFAULT_CRF = {"libx264": 23, "libvpx-vp9": 32}
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                "slower", "veryslow", "placebo")
DEFAULT_PRESET = "veryfast"
# VP9 in constant-quality mode (bit rate 0); 'good' at cpu-used 5 encodes 480x832 at ~60 fps
# on 2 cores with ~40% smaller files than 'realtime'.
_VP9_SPEED = {"deadline": "good", "cpu-used": "5", "row-mt": "1"}
WEBP_QUALITY = 80
GIF_COLORS = 256
PNG_COMPRESS_LEVEL = 1  # zlib level: fast; PNG stays lossless at any level
_NPY_COUNT_DIGITS = 20  # the frame count's fixed width in the .npy header, so it can be rewritten


def resolve_codec(kind: str, codec: str | None) -> str:
    """The codec a format uses: `codec` (or its alias) if the format allows it, else the default.

    `kind` is a key of FORMAT_CODECS. Raises OutputPathError (`output.codec`) when the
    codec is not one of the format's, or when PyAV's FFmpeg build cannot encode it.
    """
    allowed = FORMAT_CODECS[kind]
    name = allowed[0] if codec is None else CODEC_ALIASES.get(codec, codec)
    where = "a PNG folder" if kind == DIRECTORY else f"{kind} files"
    if name not in allowed:
        raise OutputPathError(f"output.codec: {codec!r} is not a codec for {where}; "
                              f"use one of {', '.join(allowed)} (or leave it unset)")
    if name in _AV_PIX_FMTS and not is_codec_available(name):
        raise OutputPathError(f"output.codec: {name!r} (for {where}) is not available in this "
                              f"PyAV/FFmpeg build (av {av.__version__}); install a PyAV wheel "
                              f"that includes it, or pick another format")
    return name


def is_codec_available(name: str) -> bool:
    """Whether PyAV's FFmpeg can encode with `name`."""
    try:
        av.codec.Codec(name, "w")
    except ValueError:  # av.codec.codec.UnknownCodecError
        return False
    return True


@dataclass(frozen=True)
class EncoderSettings:
    """What to encode with: the resolved codec and its quality knobs (None where unused).

    Raises ConfigError (`output.crf`, `output.preset`) for a value out of range or a knob
    the codec does not have.
    """

    kind: str
    codec: str
    crf: int | None = None
    preset: str | None = None

    def __post_init__(self) -> None:
        crf_range = _CRF_RANGES.get(self.codec)
        if self.crf is not None and crf_range is None:
            raise ConfigError(f"output.crf: {self.crf!r} is set but {self.codec} has no crf; "
                              f"crf applies to libx264 and libvpx-vp9 only, so leave it unset")
        if self.crf is not None and self.crf not in crf_range:
            raise ConfigError(f"output.crf: {self.crf!r} is out of range for {self.codec} "
                              f"({crf_range.start}..{crf_range.stop - 1}); try "
                              f"{DEFAULT_CRF[self.codec]}")
        if self.preset is not None and self.codec != "libx264":
            raise ConfigError(f"output.preset: {self.preset!r} is set but {self.codec} has no "
                              f"preset; presets apply to libx264 only, so leave it unset")
        if self.preset is not None and self.preset not in X264_PRESETS:
            raise ConfigError(f"output.preset: {self.preset!r} is not an x264 preset; use one "
                              f"of {', '.join(X264_PRESETS)}")


class Encoder:
    """Writes uint8 RGB frames to `path`; subclasses say how. Holds at most one block."""

    def __init__(self, path: Path, rate: Fraction, settings: EncoderSettings) -> None:
        self.path, self.rate, self.settings = path, rate, settings
        self.frames = 0  # frames fully handed to the file's encoder
        self.size: tuple[int, int] | None = None  # (H, W) as encoded; set by the first block
        self._closed = False

    @property
    def is_open(self) -> bool:
        return self.size is not None

    def write(self, block: np.ndarray) -> None:  # block: [F, H, W, 3] uint8, F >= 1
        if self.size is None:
            self.size = block.shape[1:3]
            self._open(*self.size)
        for frame in block:  # [H, W, 3]
            self._encode_frame(frame)
            self.frames += 1

    def close(self) -> None:
        """Finalize the file (nothing if no frame came). Idempotent; may raise once."""
        if self._closed:
            return
        self._closed = True
        if self.is_open:
            self._finalize()

    def _open(self, height: int, width: int) -> None:
        pass

    def _encode_frame(self, frame: np.ndarray) -> None:
        raise NotImplementedError

    def _finalize(self) -> None:
        pass


class PyAVEncoder(Encoder):
    """mp4 / mkv / webm / webp through PyAV. Stream rate = `rate`, one pts tick per frame.

    libx264 (4:2:0) needs even sizes: an odd width or height is padded by one pixel
    that repeats the last column/row, so a 15x17 video is stored as 16x18.
    """

    def write(self, block: np.ndarray) -> None:
        if self.settings.codec in _EVEN_SIZE_CODECS:
            block = pad_to_even(block)
        super().write(block)

    def _open(self, height: int, width: int) -> None:
        kind, codec = self.settings.kind, self.settings.codec
        container_options = {"loop": "0"} if kind == ".webp" else {}  # 0: loop forever
        self._container = av.open(str(self.path), "w", format=_AV_FORMATS[kind],
                                  options=container_options)
        stream = self._container.add_stream(codec, rate=self.rate, options=self._codec_options())
        stream.width, stream.height, stream.pix_fmt = width, height, _AV_PIX_FMTS[codec]
        stream.time_base = stream.codec_context.time_base = 1 / self.rate  # pts counts frames
        if codec == "libvpx-vp9":
            stream.bit_rate = 0  # with crf: constant quality
        self._stream = stream

    def _codec_options(self) -> dict[str, str]:
        codec, crf = self.settings.codec, self.settings.crf
        if codec == "libx264":
            return {"crf": str(DEFAULT_CRF[codec] if crf is None else crf),
                    "preset": self.settings.preset or DEFAULT_PRESET}
        if codec == "libvpx-vp9":
            return {"crf": str(DEFAULT_CRF[codec] if crf is None else crf), "b": "0", **_VP9_SPEED}
        if codec == "libwebp":
            return {"quality": str(WEBP_QUALITY), "lossless": "0"}
        return {}

    def _encode_frame(self, frame: np.ndarray) -> None:
        av_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
        av_frame.pts = self.frames
        self._container.mux(self._stream.encode(av_frame))

    def _finalize(self) -> None:
        try:
            self._container.mux(self._stream.encode())  # flush frames held by the codec
        finally:
            self._container.close()  # writes the trailer (mp4: the moov atom)


class GifEncoder(Encoder):
    """Animated GIF, written frame by frame (Pillow's save_all keeps every frame in memory).

    Each frame gets its own 256-colour palette (Pillow's fast octree quantizer). GIF
    delays are in 1/100 s: frame i lasts round((i+1)*100/fps) - round(i*100/fps), so
    the total length does not drift (16 fps: 6,6,7,6,6,...). Loops forever.
    """

    def _open(self, height: int, width: int) -> None:
        self._file = open(self.path, "wb")

    def _encode_frame(self, frame: np.ndarray) -> None:
        image = Image.fromarray(frame).quantize(GIF_COLORS, method=Image.Quantize.FASTOCTREE)
        duration_ms = 10 * (self._ticks(self.frames + 1) - self._ticks(self.frames))
        if self.frames == 0:  # the first frame's palette is the global one
            header, _ = GifImagePlugin.getheader(image, info={"loop": 0, "duration": duration_ms})
            chunks = [*header, *GifImagePlugin.getdata(image, duration=duration_ms)]
        else:
            chunks = GifImagePlugin.getdata(image, duration=duration_ms, include_color_table=True)
        self._file.write(b"".join(chunks))

    def _ticks(self, frames: int) -> int:
        return round(frames * 100 / self.rate)  # centiseconds since the start

    def _finalize(self) -> None:
        try:
            self._file.write(b";")  # GIF trailer
        finally:
            self._file.close()


class PngDirEncoder(Encoder):
    """One PNG per frame, frame_000000.png, ... in the folder `path` (created if missing).

    Opening removes frame_*.png left by an earlier run. Each PNG is written under a
    hidden name and renamed, so every frame_*.png present is complete.
    """

    def __init__(self, path: Path, rate: Fraction, settings: EncoderSettings) -> None:
        super().__init__(path, rate, settings)
        path.mkdir(exist_ok=True)
        for stale in path.glob("frame_*.png"):
            stale.unlink()

    def _encode_frame(self, frame: np.ndarray) -> None:
        final = self.path / f"frame_{self.frames:06d}.png"
        partial = self.path / f".{final.name}.partial"
        Image.fromarray(frame).save(partial, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        os.replace(partial, final)


class NpyEncoder(Encoder):
    """Raw uint8 [N, H, W, 3] in .npy v1.0; N in the header is rewritten at close.

        | magic 8 B | header len 2 B | {'shape': (<N, 20 wide>, H, W, 3)...} padded to 64 | frames |
    """

    def _open(self, height: int, width: int) -> None:
        self._file = open(self.path, "wb")
        self._file.write(npy_header(0, height, width))

    def _encode_frame(self, frame: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(frame).data)

    def _finalize(self) -> None:
        try:
            header = npy_header(self.frames, *self.size)
            height, width = self.size
            self._file.truncate(len(header) + self.frames * height * width * 3)  # a torn frame
            self._file.seek(0)
            self._file.write(header)
        finally:
            self._file.close()


def npy_header(frames: int, height: int, width: int) -> bytes:
    """The .npy v1.0 header of uint8 [frames, height, width, 3]; same length for any frames."""
    count = str(frames).rjust(_NPY_COUNT_DIGITS)
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({count}, {height}, {width}, 3), }}"
    magic = np.lib.format.magic(1, 0)
    unpadded = len(magic) + 2 + len(text) + 1  # 2: the header length field; 1: the newline
    text += " " * (-unpadded % np.lib.format.ARRAY_ALIGN) + "\n"
    return magic + struct.pack("<H", len(text)) + text.encode("latin1")


def pad_to_even(block: np.ndarray) -> np.ndarray:
    """[F, H, W, 3] -> [F, H + H % 2, W + W % 2, 3], repeating the last row / column."""
    pad_h, pad_w = block.shape[1] % 2, block.shape[2] % 2
    if not (pad_h or pad_w):
        return block
    return np.pad(block, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


_ENCODERS = {".gif": GifEncoder, ".npy": NpyEncoder, DIRECTORY: PngDirEncoder}


def make_encoder(path: Path, rate: Fraction, settings: EncoderSettings) -> Encoder:
    """The encoder for `settings.kind`, writing to `path` (opened at the first block)."""
    return _ENCODERS.get(settings.kind, PyAVEncoder)(path, rate, settings)
