"""Pixel geometry of the frames an encoder gets: nearest-neighbour upscaling (in RGB, or
of a YUV frame's planes) and padding to the even sizes H.264 and VP9 need."""

from __future__ import annotations

import av
import numpy as np


def upscale(block: np.ndarray, scale: int) -> np.ndarray:
    """[F, H, W, 3] -> [F, H * scale, W * scale, 3], nearest-neighbour (the block if scale 1)."""
    return block if scale == 1 else block.repeat(scale, axis=1).repeat(scale, axis=2)


def yuv420_upscaled(frame: av.VideoFrame, scale: int) -> av.VideoFrame:
    """A yuv444p frame -> the yuv420p frame of it upscaled `scale` (even) times, nearest:
    luma repeated `scale` times each way, chroma `scale / 2` times.

    Each small row is widened once and broadcast into its `times` output rows in one copy,
    with no full-size temporary (cheaper than two repeats and a copy)."""
    height, width = frame.height, frame.width
    out = av.VideoFrame(width * scale, height * scale, "yuv420p")
    for source, plane, times in zip(frame.planes, out.planes, (scale, scale // 2, scale // 2)):
        wide = _plane_rows(source)[:height, :width].repeat(times, 1)  # [height, width * times]
        rows = _plane_rows(plane)[:height * times].reshape(height, times, plane.line_size)
        rows[:, :, :width * times] = wide[:, None, :]
    return out


def _plane_rows(plane) -> np.ndarray:
    """A PyAV plane's bytes as rows of `line_size` (a view: writing it writes the plane)."""
    return np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)


def pad_to_even(block: np.ndarray) -> np.ndarray:
    """[F, H, W, 3] -> [F, H + H % 2, W + W % 2, 3], repeating the last row / column."""
    pad_h, pad_w = block.shape[1] % 2, block.shape[2] % 2
    if not (pad_h or pad_w):
        return block
    return np.pad(block, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
