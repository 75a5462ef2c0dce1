"""The flow-matching noise table of the causal-Wan family, and the steps of a block.

Self-Forcing's `FlowMatchScheduler(shift, sigma_min=0, extra_one_step=True)`, 1000 steps, float32:

    s[i]     = linspace(1, 0, 1001)[i]              i = 0 .. 999  (the trailing 0 dropped)
    sigma[i] = shift * s[i] / (1 + (shift - 1) * s[i])
    t[i]     = 1000 * sigma[i]

A step at t uses the nearest entry's sigma. A *warped* step k (Self-Forcing, LongLive) is
`cat(t, [0])[1000 - k]` (1000 750 500 250 -> 1000 937.5 833.33 625 at shift 5). The model
predicts the flow v: `x0 = x - sigma(t) v` (float64), then `x = (1 - sigma') x0 + sigma' noise`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

NUM_TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class FlowTable:
    """The 1000-entry sigma / timestep table at one `shift`."""

    shift: float

    @cached_property
    def sigmas(self) -> torch.Tensor:
        """[1000] float32, from 1 down to just above 0."""
        s = torch.linspace(1.0, 0.0, NUM_TRAIN_TIMESTEPS + 1)[:-1]
        return self.shift * s / (1 + (self.shift - 1) * s)

    @cached_property
    def timesteps(self) -> torch.Tensor:
        """[1000] float32: `1000 * sigmas`."""
        return self.sigmas * NUM_TRAIN_TIMESTEPS

    def sigma(self, timestep: float) -> float:
        """The sigma of the table entry nearest to `timestep` (0 for timestep 0)."""
        if timestep == 0:
            return 0.0
        index = int(torch.argmin((self.timesteps.double() - timestep).abs()))
        return float(self.sigmas[index])

    def warp(self, step: int) -> float:
        """A step on the unshifted 1000..0 scale -> the table's timestep (Self-Forcing's
        `warp_denoising_step`)."""
        table = torch.cat([self.timesteps, torch.zeros(1)])
        return float(table[NUM_TRAIN_TIMESTEPS - step])


def clean_from_flow(x: torch.Tensor, flow: torch.Tensor, sigma: float) -> torch.Tensor:
    """x0 = x - sigma * v, computed in float64, returned in float32."""
    return (x.double() - sigma * flow.double()).float()


def renoise(clean: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """The noisy input of the next step: (1 - sigma) x0 + sigma * noise (float32)."""
    return (1 - sigma) * clean + sigma * noise.float()
