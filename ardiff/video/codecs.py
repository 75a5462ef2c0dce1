"""The checks an output's `codec`, `crf`, `preset` and `scale` pass before anything is encoded,
against the format table (formats.py):

    codec = resolve_codec(".mkv", "h264")          # formats.X264, or OutputPathError
    EncoderSettings(".mkv", codec, crf=18)         # or ConfigError (output.crf, ...)

`resolve_codec` also asks PyAV's FFmpeg whether it can encode a PyAV codec, so a missing
encoder is reported before any compute rather than at the first frame.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import av

from ardiff.errors import ConfigError, OutputPathError
from ardiff.limits import MAX_SCALE
from ardiff.video.formats import DIRECTORY, FORMATS, Codec, OutputFormat, all_codecs


def resolve_codec(kind: str, codec: str | None) -> Codec:
    """The codec a format uses: `codec` (or its alias) if the format allows it, else the default.

    `kind` is a key of FORMATS. Raises OutputPathError (`output.codec`) when the codec is
    not one of the format's, or when PyAV's FFmpeg build cannot encode it.
    """
    allowed = FORMATS[kind].codecs
    found = FORMATS[kind].codec(codec)
    where = "a PNG folder" if kind == DIRECTORY else f"{kind} files"
    if found is None:
        raise OutputPathError(f"output.codec: {codec!r} is not a codec for {where}; "
                              f"use one of {', '.join(c.name for c in allowed)} (or leave it "
                              f"unset)")
    if found.pix_fmt is not None and not is_codec_available(found.name):
        raise OutputPathError(f"output.codec: {found.name!r} (for {where}) is not available in "
                              f"this PyAV/FFmpeg build (av {av.__version__}); install a PyAV "
                              f"wheel that includes it, or pick another format")
    return found


def is_codec_available(name: str) -> bool:
    """Whether PyAV's FFmpeg can encode with `name`."""
    try:
        av.codec.Codec(name, "w")
    except ValueError:  # av.codec.codec.UnknownCodecError
        return False
    return True


@dataclass(frozen=True)
class EncoderSettings:
    """What to encode with: the format, its resolved codec and the quality knobs (None where
    unused).

    Raises ConfigError (`output.crf`, `output.preset`, `output.scale`) for a value out of
    range or a knob the codec does not have.
    """

    kind: str
    codec: Codec
    crf: int | None = None
    preset: str | None = None
    scale: int = 1

    @property
    def format(self) -> OutputFormat:
        return FORMATS[self.kind]

    def __post_init__(self) -> None:
        if (isinstance(self.scale, bool) or not isinstance(self.scale, int)
                or not 1 <= self.scale <= MAX_SCALE):
            raise ConfigError(f"output.scale: {self.scale!r} must be an integer from 1 to "
                              f"{MAX_SCALE} (1 keeps the frames' size); try 1")
        if self.crf is not None:
            self._check_crf(self.crf)
        if self.preset is not None:
            self._check_preset(self.preset)

    def _check_crf(self, crf: int) -> None:
        name, crf_range = self.codec.name, self.codec.crf
        if crf_range is None:
            raise ConfigError(f"output.crf: {crf!r} is set but {name} has no crf; crf applies "
                              f"to {_names(c for c in all_codecs() if c.crf)} only, so leave "
                              f"it unset")
        if crf not in crf_range:
            raise ConfigError(f"output.crf: {crf!r} is out of range for {name} "
                              f"({crf_range.start}..{crf_range.stop - 1}); try "
                              f"{self.codec.default_crf}")

    def _check_preset(self, preset: str) -> None:
        name, presets = self.codec.name, self.codec.presets
        if not presets:
            raise ConfigError(f"output.preset: {preset!r} is set but {name} has no preset; "
                              f"presets apply to {_names(c for c in all_codecs() if c.presets)} "
                              f"only, so leave it unset")
        if preset not in presets:
            raise ConfigError(f"output.preset: {preset!r} is not an x264 preset; use one of "
                              f"{', '.join(presets)}")


def _names(codecs: Iterable[Codec]) -> str:
    return " and ".join(codec.name for codec in codecs)
