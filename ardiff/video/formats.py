"""The output formats: one record per output path suffix, the table the writer, the bench and
the `--output` help are derived from.

    FORMATS[".mkv"] = OutputFormat(codecs=(FFV1, X264), container="matroska",
                                   encoder="ardiff.video.encoders:PyAVEncoder")

A format lists its codecs, the first being the default; a `Codec` holds what is true of a
codec in every format that uses it. Adding a format is its encoder class (any module; named
"module:Class", imported when a writer opens) and one entry here. The key DIRECTORY stands
for every folder path (PNG frames). Imports no av, numpy or torch: `ardiff --help` reads it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

DIRECTORY = "/"  # the format key of a PNG-per-frame folder
Options = tuple[tuple[str, str], ...]  # FFmpeg options, in the order they are set


@dataclass(frozen=True)
class Codec:
    """A codec as ardiff drives it. `pix_fmt` None: not encoded through PyAV (no FFmpeg check).

    `crf` None: the codec has no crf knob; `presets` empty: no preset knob. `options` are set
    after crf and preset. `even_size`: 4:2:0 at an odd size is refused, so frames are padded
    by one pixel; `yuv_upscale`: an even scale repeats the 4:2:0 planes (see PyAVEncoder).
    """

    name: str
    aliases: tuple[str, ...] = ()  # other names `output.codec` accepts for it
    pix_fmt: str | None = None
    crf: range | None = None
    default_crf: int | None = None
    presets: tuple[str, ...] = ()
    default_preset: str | None = None
    options: Options = ()
    bit_rate: int | None = None  # set on the stream when not None
    even_size: bool = False
    yuv_upscale: bool = False


@dataclass(frozen=True)
class OutputFormat:
    """What a suffix is written as: `codecs` allowed (the first is the default), the encoder
    class as "module:Class", the PyAV muxer (`container`, None: not PyAV) and its options,
    and whether the bench measures it (else it measures the default, .mp4).

    `nearly_full_options` are added when the disk cannot spare the space reserve (so no
    room will be left to finish the file): options that write an ISO BMFF container as
    fragments that play without the index, so that what reaches the disk is kept.
    """

    codecs: tuple[Codec, ...]
    encoder: str
    container: str | None = None
    container_options: Options = ()
    benched: bool = True
    nearly_full_options: Options = ()

    def codec(self, name: str | None) -> Codec | None:
        """The codec called `name` (or an alias of it); the default for None; None if not one."""
        if name is None:
            return self.codecs[0]
        return {alias: codec for codec in self.codecs
                for alias in (codec.name, *codec.aliases)}.get(name)

    @property
    def encoder_class(self) -> type:
        module, _, name = self.encoder.partition(":")
        return getattr(importlib.import_module(module), name)


X264 = Codec("libx264", aliases=("h264", "x264"), pix_fmt="yuv420p", crf=range(0, 52),
             default_crf=23,
             presets=("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                      "slower", "veryslow", "placebo"),
             # ultrafast on one thread: the least CPU beside a model on few cores, for larger
             # files; pick a slower preset for smaller ones
             default_preset="ultrafast", options=(("threads", "1"),),
             even_size=True, yuv_upscale=True)
VP9 = Codec("libvpx-vp9", aliases=("vp9",), pix_fmt="yuv420p", crf=range(0, 64), default_crf=32,
            # constant quality (bit rate 0 with crf); 'good' at cpu-used 5 makes smaller
            # files than 'realtime' at a speed a few cores keep up with
            options=(("b", "0"), ("deadline", "good"), ("cpu-used", "5"), ("row-mt", "1")),
            bit_rate=0, yuv_upscale=True)
FFV1 = Codec("ffv1", pix_fmt="bgr0")  # lossless
WEBP = Codec("libwebp", aliases=("webp",), pix_fmt="yuv420p",
             options=(("quality", "80"), ("lossless", "0")))

_PYAV = "ardiff.video.encoders:PyAVEncoder"
FORMATS: dict[str, OutputFormat] = {
    ".mp4": OutputFormat((X264,), _PYAV, container="mp4",
                         # a fragment per frame, each on disk as soon as it is muxed
                         nearly_full_options=(
                             ("movflags", "frag_every_frame+empty_moov+default_base_moof"),
                             ("flush_packets", "1"))),
    ".mkv": OutputFormat((FFV1, X264), _PYAV, container="matroska"),
    ".webm": OutputFormat((VP9,), _PYAV, container="webm"),
    ".gif": OutputFormat((Codec("gif"),), "ardiff.video.encoders:GifEncoder"),
    ".webp": OutputFormat((WEBP,), _PYAV, container="webp",
                          container_options=(("loop", "0"),)),  # 0: loop forever
    ".npy": OutputFormat((Codec("npy"),), "ardiff.video.encoders:NpyEncoder", benched=False),
    DIRECTORY: OutputFormat((Codec("png"),), "ardiff.video.encoders:PngDirEncoder",
                            benched=False),
}


def file_suffixes() -> tuple[str, ...]:
    """The suffixes of the file formats (all but the PNG folder), in table order."""
    return tuple(suffix for suffix in FORMATS if suffix != DIRECTORY)


def output_choices() -> str:
    """The outputs a path may name, for help text: '.mp4 ... .npy or a directory (PNG frames)'."""
    return f"{' '.join(file_suffixes())} or a directory (PNG frames)"


def all_codecs() -> tuple[Codec, ...]:
    """Every codec of the table, once each, in table order."""
    return tuple(dict.fromkeys(codec for format in FORMATS.values() for codec in format.codecs))
