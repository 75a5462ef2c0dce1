"""The training objective of the bouncing world model: predict the clean frame from a noised
one that sees its window of clean history, under the block-causal mask of `forward_frames`.

    teacher forcing:  [ CLIP clean frames | noised copies of the last NOISY ]   (true history)

Stage 2 (`drift.py`) changes what the history shows. A frame's squared error is weighted
by 1 / max(t, MIN_WEIGHT_T)^2; noise levels are drawn half uniform, half biased towards
pure noise. Training runs under bf16 autocast on CPU.
"""

from __future__ import annotations

import numpy as np
import torch

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.model import BouncingDiT, pixels_to_model

CLIP = 10            # frames per training clip
NOISY = 6            # the last NOISY frames are also fed noised (each with a full window)
MIN_WEIGHT_T = 0.3   # loss weight 1 / max(t, MIN_WEIGHT_T)^2
NOISE_BIAS_POWER = 1 / 3   # u^(1/3) has density 3t^2: most levels near pure noise
AUTOCAST_DTYPE = torch.bfloat16


def sample_levels(gen: torch.Generator, shape) -> torch.Tensor:
    """Half uniform, half biased towards pure noise (density 3t^2): without the bias the
    model learns to copy its context and ignore what the noise-free history implies."""
    uniform = torch.rand(shape, generator=gen)
    biased = torch.rand(shape, generator=gen) ** NOISE_BIAS_POWER
    return torch.where(torch.rand(shape, generator=gen) < 0.5, uniform, biased)


def simulated_batch(rng: np.random.Generator, batch: int, length: int):
    """`batch` fresh simulated clips: frames [B, length, 3, s, s] in [-1, 1] and their
    actions [B, length]."""
    actions = sim.random_actions(rng, batch, length)
    frames, _ = sim.simulate(sim.SimState.sample(rng, batch), actions)
    return pixels_to_model(frames), torch.from_numpy(actions)


def weighted_error(model: BouncingDiT, frames, t_slots, actions, positions, noisy,
                    targets, t, level=None) -> torch.Tensor:
    """The weighted loss of the noisy slots (the last t.shape[1]) against targets; `level`
    [B, S]: the history slots' context noise levels (`BouncingDiT.conditioning`)."""
    with torch.autocast("cpu", dtype=AUTOCAST_DTYPE):
        pred = model.forward_frames(frames, t_slots, actions, positions, noisy, level)
    pred = pred[:, -t.shape[1]:]
    error = (pred.float() - targets).pow(2).mean(dim=(2, 3, 4))      # [B, noisy slots]
    return (error / t.clamp(min=MIN_WEIGHT_T) ** 2).mean()


def noised(targets: torch.Tensor, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    tt = t[..., None, None, None]
    return (1 - tt) * targets + tt * torch.randn(targets.shape, generator=gen)


def teacher_forcing_loss(model: BouncingDiT, clean: torch.Tensor, actions: torch.Tensor,
                         gen: torch.Generator) -> torch.Tensor:
    """clean [B, L, 3, H, W] (history), actions [B, L]; the last NOISY frames are predicted."""
    b, length = actions.shape
    target = clean[:, length - NOISY:]
    t = sample_levels(gen, (b, NOISY))
    noisy = noised(target, t, gen)
    positions = torch.cat([torch.arange(length), torch.arange(length - NOISY, length)])
    is_noisy = positions.new_zeros(len(positions), dtype=torch.bool)
    is_noisy[length:] = True
    return weighted_error(model, torch.cat([clean, noisy], 1),
                           torch.cat([torch.zeros(b, length), t], 1),
                           torch.cat([actions, actions[:, length - NOISY:]], 1),
                           positions, is_noisy, target, t)
