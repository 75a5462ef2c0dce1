"""A small latent-to-RGB decoder with per-session temporal state (model-owned state).

Each latent frame is decoded together with the previous one of the same
session (a causal temporal context, like the streaming VAE decoders of the
research models), so the decoder keeps the last latent frame per session.

    latents [B, F, C, h, w] -> standardise -> (frame | previous frame) [B*F, 2C, h, w]
        -> channels_last -> per chunk of frames: conv, GELU, upsample, conv, GELU, conv
        -> uint8 [B, F, H, W, 3]

Every frame's pixels depend on that frame and its context alone: decoding a batch's rows
together, one by one, or in any chunks gives the same frames, within a level where another
batch size takes another convolution kernel (the tests compare them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

STATE_DTYPE = torch.float32
RGB_GAIN = 4.0  # spreads the random decoder's output over the colour range
# Frames decode in chunks whose widest activation (hidden x H x W) stays about this size: a
# batch's frames then stay in the cache through the convolutions (one frame's result does
# not depend on which others share its chunk, so chunking changes no bits).
DECODE_CHUNK_BYTES = 4 << 20
gelu_ = torch.ops.aten.gelu_  # in place, exactly `torch.nn.functional.gelu`


class LatentDecoder(nn.Module):
    """[F, C, h, w] latents (+ the previous latent frame) -> [F, h*up, w*up, 3] uint8."""

    def __init__(self, latent_channels: int, upscale: int, hidden: int = 32) -> None:
        super().__init__()
        self.latent_channels, self.upscale, self.hidden = latent_channels, upscale, hidden
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
        h = torch.cat([z, context], dim=2).flatten(0, 1).to(self.inp.weight.dtype)
        # channels_last (NHWC): the upsample and the convolutions run their NHWC kernels
        # without converting each tensor, and the RGB comes out NHWC, as frames are laid out.
        h = h.contiguous(memory_format=torch.channels_last)
        height, width = h.shape[-2] * self.upscale, h.shape[-1] * self.upscale
        frames = torch.empty(h.shape[0], height, width, 3, dtype=torch.uint8, device=h.device)
        chunk = h.shape[0]  # a GPU takes every frame at once; a CPU a cache-sized few
        if h.device.type == "cpu":
            chunk = max(1, DECODE_CHUNK_BYTES // (self.hidden * height * width * h.element_size()))
        for start in range(0, h.shape[0], chunk):
            frames[start:start + chunk] = self._decode_frames(h[start:start + chunk])
        frames = frames.unflatten(0, (num_rows, num_frames))
        return frames, [z[row, -1].clone() for row in range(num_rows)]

    def _decode_frames(self, h: torch.Tensor) -> torch.Tensor:
        """Frames [N, 2C, h, w] (each with its context) -> uint8 [N, H, W, 3].

        Element-wise steps run in place on the tensor a convolution just made (the same
        ops, so the same bits): a batch allocates a few large buffers, not one per step.
        """
        h = self.up(gelu_(self.inp(h)))
        rgb = self.rgb(gelu_(self.mid(h))).mul_(RGB_GAIN).float().tanh_()
        frames = rgb.add_(1).mul_(127.5).round_().clamp_(0, 255).to(torch.uint8)
        return frames.permute(0, 2, 3, 1)
