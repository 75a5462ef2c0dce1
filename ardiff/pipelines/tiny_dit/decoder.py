"""A small latent-to-RGB decoder with per-session temporal state (model-owned state).

Each latent frame is decoded together with the previous one of the same
session (a causal temporal context, like the streaming VAE decoders of the
research models), so the decoder keeps the last latent frame per session.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

STATE_DTYPE = torch.float32
RGB_GAIN = 4.0  # spreads the random decoder's output over the colour range


class LatentDecoder(nn.Module):
    """[F, C, h, w] latents (+ the previous latent frame) -> [F, h*up, w*up, 3] uint8."""

    def __init__(self, latent_channels: int, upscale: int, hidden: int = 32) -> None:
        super().__init__()
        self.latent_channels = latent_channels
        self.inp = nn.Conv2d(2 * latent_channels, hidden, 3, padding=1)
        self.up = nn.Upsample(scale_factor=upscale, mode="bilinear", align_corners=False)
        self.mid = nn.Conv2d(hidden, hidden, 3, padding=1)
        self.rgb = nn.Conv2d(hidden, 3, 3, padding=1)

    @staticmethod
    def state_bytes(latent_channels: int, latent_size: int) -> int:
        """Bytes of one session's decoder state: the last latent frame, in STATE_DTYPE."""
        return latent_channels * latent_size * latent_size * STATE_DTYPE.itemsize

    def forward(self, latents: torch.Tensor,
                previous: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode a block; returns (frames uint8 [F, H, W, 3], new state [C, h, w])."""
        frames, (state,) = self.decode_rows(latents[None], [previous])
        return frames[0], state

    def decode_rows(self, latents: torch.Tensor, previous: Sequence[torch.Tensor | None]
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Decode one block per session: latents [B, F, C, h, w], previous[b] the state of
        row b's session (None: a new one). Returns (frames uint8 [B, F, H, W, 3], the new
        state [C, h, w] of each row). Each frame is decoded on its own: a row's frames do
        not depend on the other rows."""
        num_rows, num_frames = latents.shape[:2]
        # Standardise each frame: an untrained model's latents are small, and
        # decoding them raw gives a flat grey video.
        z = latents.to(STATE_DTYPE).flatten(0, 1)
        z = (z - z.mean(dim=(1, 2, 3), keepdim=True)) / (z.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        z = z.unflatten(0, (num_rows, num_frames))  # [B, F, C, h, w]
        first = torch.stack([z[row, :1] if state is None else state[None]
                             for row, state in enumerate(previous)])
        context = torch.cat([first, z[:, :-1]], dim=1)  # each frame's previous latent frame
        weight_dtype = self.inp.weight.dtype
        h = torch.cat([z, context], dim=2).flatten(0, 1).to(weight_dtype)
        h = self.up(torch.nn.functional.gelu(self.inp(h)))
        rgb = torch.tanh(RGB_GAIN * self.rgb(torch.nn.functional.gelu(self.mid(h))).float())
        frames = ((rgb + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
        frames = frames.permute(0, 2, 3, 1).contiguous().unflatten(0, (num_rows, num_frames))
        return frames, [z[row, -1].clone() for row in range(num_rows)]
