"""ardiff.video.formats: one table of output formats. A format added in one entry (here a dummy
`.raw`, frames as raw bytes) is checked, written, listed in `--output`'s help and benched."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest

from ardiff.bench.encode import encoded_suffixes
from ardiff.errors import ConfigError, OutputPathError
from ardiff.video import disk, encoders, formats
from ardiff.video.formats import DIRECTORY, FORMATS, Codec, OutputFormat
from ardiff.video.writer import VideoWriter, check_output_path
from ardiff_cli.rollout import rollout_command

SHIPPED_HELP = "Output video: .mp4 .mkv .webm .gif .webp .npy or a directory (PNG frames)."


class RawEncoder(encoders.Encoder):
    """uint8 frames, one after another, no header: the least an encoder can be."""

    def _open(self, height: int, width: int) -> None:
        self._file = disk.OutputFile(self.path)

    def _encode_frame(self, frame: np.ndarray) -> None:
        self._file.write(frame.tobytes())


RAW = OutputFormat((Codec("raw"),), f"{__name__}:RawEncoder")


@pytest.fixture
def raw_format(monkeypatch):
    """The dummy format, added to the table and nowhere else."""
    monkeypatch.setitem(FORMATS, ".raw", RAW)


def frames(count: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (count, 5, 7, 3), dtype=np.uint8)


def test_an_unlisted_suffix_is_refused(tmp_path):
    with pytest.raises(OutputPathError, match=r"unsupported suffix '\.raw'; use one of .*\.npy, "
                                              r"or a folder"):
        check_output_path(tmp_path / "out.raw")


def test_a_format_added_in_one_entry_is_checked_and_named(raw_format, tmp_path):
    assert check_output_path(tmp_path / "OUT.RAW", codec="raw") == tmp_path / "OUT.RAW"
    with pytest.raises(OutputPathError, match=r"unsupported suffix '\.avi'; use one of .*\.npy, "
                                              r"\.raw, or a folder"):
        check_output_path(tmp_path / "out.avi")
    with pytest.raises(OutputPathError, match="output.codec: 'h264' is not a codec for .raw "
                                              "files; use one of raw"):
        check_output_path(tmp_path / "out.raw", codec="h264")
    with pytest.raises(ConfigError, match="output.crf: 3 is set but raw has no crf; crf "
                                          "applies to libx264 and libvpx-vp9 only"):
        check_output_path(tmp_path / "out.raw", crf=3)
    assert not list(tmp_path.iterdir())


def test_a_format_added_in_one_entry_is_written(raw_format, tmp_path):
    video = frames(5)
    with VideoWriter(tmp_path / "out.raw", 16, scale=2) as writer:
        writer.write(video[:2])
        writer.write(video[2:])
    upscaled = video.repeat(2, axis=1).repeat(2, axis=2)
    assert (writer.info.codec, writer.info.frames) == ("raw", 5)
    assert writer.info.bytes == upscaled.nbytes
    assert (tmp_path / "out.raw").read_bytes() == upscaled.tobytes()
    assert [path.name for path in tmp_path.iterdir()] == ["out.raw"]  # no work file left


def test_a_format_added_in_one_entry_is_in_the_help_and_the_bench(raw_format, monkeypatch):
    assert formats.output_choices() == ".mp4 .mkv .webm .gif .webp .npy .raw or a directory " \
                                       "(PNG frames)"
    assert encoded_suffixes()[-1] == ".raw"
    monkeypatch.setitem(FORMATS, ".raw", OutputFormat(RAW.codecs, RAW.encoder, benched=False))
    assert ".raw" not in encoded_suffixes()


def test_the_shipped_table_gives_the_help_and_the_bench_list():
    help_text = inspect.signature(rollout_command).parameters["output"].default.help
    assert help_text == f"Output video: {formats.output_choices()}." == SHIPPED_HELP
    assert encoded_suffixes() == (".mp4", ".mkv", ".webm", ".gif", ".webp")


@pytest.mark.parametrize("suffix", list(FORMATS))
def test_every_entry_is_whole(suffix):
    """Its encoder class imports, and each codec's defaults are among its own choices."""
    output = FORMATS[suffix]
    assert issubclass(output.encoder_class, encoders.Encoder)
    assert (output.container is not None) == issubclass(output.encoder_class,
                                                        encoders.PyAVEncoder)
    for codec in output.codecs:
        assert output.codec(codec.name) is codec
        assert all(output.codec(alias) is codec for alias in codec.aliases)
        assert (codec.pix_fmt is not None) == (output.container is not None)
        assert (codec.crf is None) == (codec.default_crf is None)
        assert codec.default_crf is None or codec.default_crf in codec.crf
        assert (codec.default_preset is None) == (not codec.presets)
        assert codec.default_preset is None or codec.default_preset in codec.presets
    assert output.codec(None) is output.codecs[0]
    assert (suffix == DIRECTORY) == issubclass(output.encoder_class, encoders.PngDirEncoder)


def test_the_table_imports_no_av_numpy_or_torch():
    probe = ("import sys, ardiff.video.formats; "
             "print(sorted({'av', 'numpy', 'torch', 'PIL'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"
