"""What the tests claim equal, and how equal (docs/development.md#numerics-across-cpus).

    exact            the same kernels on the same shapes in the same order: paged vs dense
                     (a gather changes no arithmetic), a run repeated, ardiff vs a reference
                     loop that makes the same calls. Bit-equal on any CPU.
    across kernels   computations free to take different kernels: another batch size (a
                     batched matmul or convolution may sum in another order), another weight
                     layout in memory, another thread count, another CPU (AVX-512 or not).
                     Floats within FLOAT_RELATIVE of the largest magnitude; frames within
                     FRAME_LEVELS; an autoregressive video, where a level's difference feeds
                     the next frame, within VIDEO_LEVELS in at most VIDEO_SHARE of its values.

The bounds were measured under ATEN_CPU_CAPABILITY=default, avx2 and avx512 on an AMD EPYC
(2026-12-08): one level, in under 0.01% of values, for the bouncing games batched vs alone.
"""

from __future__ import annotations

import numpy as np
import torch

FLOAT_RELATIVE = 1e-5   # floats across kernels: within this times the largest magnitude
FRAME_LEVELS = 1        # one decoded block across kernels: uint8 levels apart at most
VIDEO_LEVELS = 4        # an AR video across kernels: levels apart at most ...
VIDEO_SHARE = 1e-3      # ... in at most this share of its values


def assert_floats_close(got: torch.Tensor, want: torch.Tensor, where: str = "") -> None:
    """`got` equals `want` within FLOAT_RELATIVE of `want`'s largest magnitude."""
    assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    error = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    bound = FLOAT_RELATIVE * max(want.double().abs().max().item() if want.numel() else 0.0, 1e-30)
    assert error <= bound, f"{where}: {error:.3g} apart (bound {bound:.3g})"


def assert_frames_close(got, want, where: str = "") -> None:
    """Decoded frames (uint8, or floats in [0, 1]) within FRAME_LEVELS of each other."""
    got, want = (_levels(x) for x in (got, want))
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    levels = int(np.abs(got - want).max(initial=0))
    assert levels <= FRAME_LEVELS, f"{where}: {levels} levels apart"


def assert_video_close(got, want, where: str = "") -> None:
    """Two AR videos (uint8, or floats in [0, 1]) within VIDEO_LEVELS in at most VIDEO_SHARE
    of their values."""
    got, want = (_levels(x) for x in (got, want))
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    diff = np.abs(got - want)
    share = float((diff > 0).mean()) if diff.size else 0.0
    assert diff.max(initial=0) <= VIDEO_LEVELS and share <= VIDEO_SHARE, (
        f"{where}: up to {diff.max(initial=0)} levels apart in {share:.2%} of values")


def _levels(video) -> np.ndarray:
    array = video.numpy() if isinstance(video, torch.Tensor) else np.asarray(video)
    if array.dtype == np.uint8:
        return array.astype(np.int32)
    return np.rint(array.astype(np.float64) * 255).astype(np.int32)
