"""How the shipped pipelines sample a block: seeded per-block noise and the few-step
flow-matching sampler.

    noise (t = 1) --predict clean--> step --predict clean--> step ... --> clean block (t = 0)

Flow matching here means x_t = (1 - t) clean + t noise: the model predicts the clean
block from x_t, and a step moves x along the straight line to that prediction. Each
prediction is the caller's (a probe of the KV cache); the commit forward that follows
is the caller's too. A batch of sessions samples as one: `rows_noise` stacks each row's own
block noise, and the steps are elementwise, so a row's x is the x it has alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Noise streams are named by seed * SEED_STRIDE + start_frame: a prime above any frame
# position a shipped pipeline reaches, so (seed, frame) pairs never share a stream.
SEED_STRIDE = 1_000_003


def block_generator(seed: int, start_frame: int) -> torch.Generator:
    """The CPU generator of the block whose first frame is `start_frame` in a rollout seeded
    `seed`. CPU on every device, so a seed gives the same noise on CPU and GPU."""
    return torch.Generator().manual_seed(seed * SEED_STRIDE + start_frame)


def block_noise(shape: tuple[int, ...], seed: int, start_frame: int,
                device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal noise of `shape` for that block: drawn in float32 on the CPU, then
    moved, so it depends on (seed, start_frame) alone. To a GPU it goes from pinned memory
    without a host sync (the copy is queued on the current stream like the model's work)."""
    return _to_device(torch.randn(shape, generator=block_generator(seed, start_frame)),
                      device, dtype)


def rows_noise(shape: tuple[int, ...], seeds: Sequence[int], start_frames: Sequence[int],
               device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`block_noise` of B sessions' blocks, row b that of (seeds[b], start_frames[b]):
    [B, *shape], each row exactly what `block_noise` gives that block; moved in one copy."""
    return _to_device(torch.stack([torch.randn(shape, generator=block_generator(seed, frame))
                                   for seed, frame in zip(seeds, start_frames, strict=True)]),
                      device, dtype)


def _to_device(noise: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if torch.device(device).type == "cuda":
        return noise.pin_memory().to(device, non_blocking=True).to(dtype)
    return noise.to(device, dtype)


def noise_levels(num_steps: int) -> list[float]:
    """`num_steps + 1` evenly spaced levels from 1 (pure noise) down to 0 (clean)."""
    return torch.linspace(1.0, 0.0, num_steps + 1).tolist()


def flow_step(x: torch.Tensor, clean: torch.Tensor, t: float, t_next: float) -> torch.Tensor:
    """x at level t -> x at level t_next, along the line from `clean` through x (t > 0)."""
    return clean + t_next * (x - clean) / t


def sample(noise: torch.Tensor, predict_clean: Callable[[torch.Tensor, float], torch.Tensor],
           num_steps: int) -> torch.Tensor:
    """Run `num_steps` flow-matching steps from `noise`; predict_clean(x, t) is called once
    per step, at levels 1, ..., 1 / num_steps. Returns the clean block (t = 0)."""
    levels = noise_levels(num_steps)
    x = noise
    for t, t_next in zip(levels[:-1], levels[1:]):
        x = flow_step(x, predict_clean(x, t), t, t_next)
    return x
