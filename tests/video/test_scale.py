"""output.scale: the video writer upscales nearest-neighbour on its encoder thread.

Lossless formats store exactly the RGB-upscaled frames; H.264 / VP9 at an even scale
upscale after the colour conversion and store the exact 4:2:0 of the upscaled frame.
"""

from __future__ import annotations

import av
import numpy as np
import pytest
from PIL import Image

from ardiff.errors import ConfigError
from ardiff.limits import MAX_SCALE
from ardiff.video import pixels
from ardiff.video.writer import VideoWriter, check_output_path

SMALL = 6  # model-size frames: 6 x 6 (even), 5 x 7 (odd) below


def frames(count: int, height: int = SMALL, width: int = SMALL, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def upscaled(block: np.ndarray, scale: int) -> np.ndarray:
    return block.repeat(scale, axis=1).repeat(scale, axis=2)


def write(path, block: np.ndarray, **kwargs):
    with VideoWriter(path, 16, **kwargs) as writer:
        for start in range(0, len(block), 2):
            writer.write(block[start:start + 2])
    return writer.info


def decode_yuv(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray() for frame in container.decode(video=0)]


@pytest.mark.parametrize("scale", [1, 3, 8])
def test_npy_holds_exactly_the_rgb_upscaled_frames(tmp_path, scale):
    block = frames(5, 5, 7)
    info = write(tmp_path / "v.npy", block, scale=scale)
    assert info.frames == 5
    assert np.array_equal(np.load(tmp_path / "v.npy"), upscaled(block, scale))


@pytest.mark.parametrize("suffix, codec", [("/", None), (".mkv", None), (".gif", None)])
def test_other_lossless_formats_upscale_in_rgb(tmp_path, suffix, codec):
    block = frames(3)
    path = tmp_path / ("png/" if suffix == "/" else f"v{suffix}")
    write(path, block, scale=4, codec=codec)
    if suffix == "/":
        stored = np.stack([np.asarray(Image.open(path / f"frame_{i:06d}.png")) for i in range(3)])
        assert np.array_equal(stored, upscaled(block, 4))
    elif suffix == ".mkv":  # ffv1: lossless
        with av.open(str(path)) as container:
            stored = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        assert np.array_equal(stored, upscaled(block, 4))
    else:
        with Image.open(path) as image:
            assert image.size == (SMALL * 4, SMALL * 4) and image.n_frames == 3


@pytest.mark.parametrize("suffix", [".mp4", ".webm"])
def test_yuv_upscale_stores_the_exact_420_of_the_upscaled_frames(tmp_path, suffix):
    """Lossless H.264 (crf 0) shows what went in: luma equals the codec's own conversion of
    the RGB-upscaled frame; chroma equals its point-sampled 4:2:0 (each 2x2 sample lies in
    one upscaled pixel), where the codec's default bilinear filter blends pixel edges."""
    block, scale = frames(4), 4
    crf = {".mp4": 0, ".webm": None}[suffix]
    write(tmp_path / f"v{suffix}", block, scale=scale, crf=crf)
    stored = decode_yuv(tmp_path / f"v{suffix}")
    side = SMALL * scale
    assert len(stored) == 4 and stored[0].shape == (side * 3 // 2, side)
    if suffix != ".mp4":
        return  # VP9 at constant quality is lossy: the size and count are what is checked
    for got, rgb in zip(stored, upscaled(block, scale)):
        source = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        point = source.reformat(format="yuv420p", interpolation="POINT").to_ndarray()
        bilinear = source.reformat(format="yuv420p").to_ndarray()
        assert np.array_equal(got, point)
        assert np.array_equal(got[:side], bilinear[:side])


def test_odd_scale_on_h264_upscales_in_rgb_and_pads(tmp_path):
    block = frames(2, 5, 7)
    write(tmp_path / "v.mp4", block, scale=3, crf=0)
    stored = decode_yuv(tmp_path / "v.mp4")
    assert stored[0].shape == (16 * 3 // 2, 22)  # 15 x 21 padded to 16 x 22


def test_each_frame_is_checked_at_model_size(tmp_path):
    with VideoWriter(tmp_path / "v.npy", 16, scale=2) as writer:
        writer.write(frames(1))
        with pytest.raises(Exception, match="differs from the first frames' 6x6"):
            writer.write(frames(1, SMALL * 2, SMALL * 2))


@pytest.mark.parametrize("scale", [0, MAX_SCALE + 1, 2.0, True])
def test_bad_scale_is_refused_before_anything_is_made(tmp_path, scale):
    message = (f"^output.scale: {scale!r} must be an integer from 1 to {MAX_SCALE} "
               f"\\(1 keeps the frames' size\\); try 1$")
    with pytest.raises(ConfigError, match=message):
        VideoWriter(tmp_path / "v.mp4", 16, scale=scale)
    with pytest.raises(ConfigError, match=message):
        check_output_path(tmp_path / "v.mp4", scale=scale)
    assert list(tmp_path.iterdir()) == []


def test_yuv420_upscaled_repeats_the_planes():
    small = frames(1, 2, 3)[0]
    yuv = av.VideoFrame.from_ndarray(small, format="rgb24").reformat(format="yuv444p")
    planes = yuv.to_ndarray()
    out = pixels.yuv420_upscaled(yuv, 4).to_ndarray()  # [12 * 3 / 2, 12]
    assert np.array_equal(out[:8], upscaled(planes[0][None, ..., None], 4)[0, ..., 0])
    chroma = out[8:].reshape(2, 4, 6)
    assert np.array_equal(chroma, planes[1:].repeat(2, axis=1).repeat(2, axis=2))


def test_the_default_models_frames_scaled_by_the_writer_equal_the_pipelines_upscale(tmp_path):
    """The default model's x8 upscale moved from the pipeline (`pipeline.args.upscale: 8`)
    to the writer (`upscale: 1`, `output.scale: 8`): the .npy holds the same bytes."""
    import ardiff
    from ardiff.config.run import load_config

    def cycle(actions, count: int) -> list[str]:
        """The first `count` actions of a repeating script, as `rollout.actions` repeats."""
        return [actions[i % len(actions)] for i in range(count)]

    def frames(upscale: int) -> np.ndarray:
        base = load_config(None, [f"pipeline.args.upscale={upscale}"])
        runner = ardiff.build_runner(base)
        try:
            return np.concatenate([runner.execute(ardiff.RolloutRequest(
                "s", block_index=i, seed=base.rollout.seed, actions=(action,))).output.frames
                .numpy() for i, action in enumerate(cycle(base.rollout.actions, 7))])
        finally:
            runner.close()

    default = load_config(None)
    assert default.pipeline.args["upscale"] == 1 and default.output.scale == 8
    write(tmp_path / "new.npy", frames(1), scale=default.output.scale)
    old = frames(8)
    assert old.shape == (7, 256, 256, 3)
    assert np.load(tmp_path / "new.npy").tobytes() == old.tobytes()
