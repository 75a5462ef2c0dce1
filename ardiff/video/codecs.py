"""Which codec each output format uses, and the quality knobs a codec has: the checks an
output's `codec`, `crf`, `preset` and `scale` pass before anything is encoded."""

from __future__ import annotations

from dataclasses import dataclass

import av

from ardiff.limits import MAX_SCALE
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
AV_PIX_FMTS = {"libx264": "yuv420p", "ffv1": "bgr0", "libvpx-vp9": "yuv420p", "libwebp": "yuv420p"}
CRF_RANGES = {"libx264": range(0, 52), "libvpx-vp9": range(0, 64)}
DEFAULT_CRF = {"libx264": 23, "libvpx-vp9": 32}
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                "slower", "veryslow", "placebo")


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
    if name in AV_PIX_FMTS and not is_codec_available(name):
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
    scale: int = 1

    def __post_init__(self) -> None:
        if (isinstance(self.scale, bool) or not isinstance(self.scale, int)
                or not 1 <= self.scale <= MAX_SCALE):
            raise ConfigError(f"output.scale: {self.scale!r} must be an integer from 1 to "
                              f"{MAX_SCALE} (1 keeps the frames' size); try 1")
        crf_range = CRF_RANGES.get(self.codec)
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
