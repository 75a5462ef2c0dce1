"""The tiny DiT's rollout written by hand: the baseline `ardiff bench` holds ardiff to.

Over the pipeline's own weights, one block at a time: one contiguous K/V ring per layer
(`ardiff.pipelines.shared.ring`), the text's cross-attention K/V computed once, the
streaming decoder's state kept here; no runner, no sessions, no checks. Without CFG (one
branch) and with a sliding window; it makes the frames `TinyCausalDiT` makes through ardiff.
`TinyCausalDiT.reference_loop(spec)` makes one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ardiff.contract.forward import RolloutRequest
from ardiff.pipelines.shared.ring import RingCache
from ardiff.pipelines.shared.sampling import block_noise, sample
from ardiff.pipelines.tiny_dit.model import TinyDiTConfig

if TYPE_CHECKING:  # pragma: no cover - typing only: the pipeline imports this module
    from ardiff.pipelines.tiny_dit.pipeline import TinyCausalDiT


class TinyDiTLoop:
    """One rollout of a loaded `TinyCausalDiT` (its model and decoder), block by block.

    `config` is the pipeline's config with the effective window and sink. `step(request)`
    makes the next block from the request's prompt, seed and step count.
    """

    def __init__(self, pipeline: TinyCausalDiT, config: TinyDiTConfig) -> None:
        self.model, self.decoder, self.config = pipeline.model, pipeline.decoder, config
        self.device, self.dtype = pipeline.device, pipeline.dtype
        self.cache = RingCache(config.num_layers, config.tokens_per_frame, config.sink_frames,
                               max(0, config.window_frames - config.frames_per_block),
                               config.num_kv_heads, config.head_size, self.device, self.dtype)
        self.frame, self.prompt, self.cross, self.decoded = 0, None, None, None

    @torch.inference_mode()
    def step(self, request: RolloutRequest) -> torch.Tensor:
        """The next block's frames, uint8 [F, H, W, 3]."""
        c, frame = self.config, self.frame
        if request.prompt != self.prompt:
            self.prompt, self.cross = request.prompt, self.model.text_kv(request.prompt)
        shape = (c.frames_per_block, c.latent_channels, c.latent_size, c.latent_size)
        noise = block_noise(shape, request.seed, frame, self.device, self.dtype)

        def predict_clean(x, t):
            return self.model(x, t, self.cache.block(frame, commit=False), self.cross)

        x = sample(noise, predict_clean, request.num_steps or c.num_steps)
        self.model(x, 0.0, self.cache.block(frame, commit=True), self.cross)
        frames, self.decoded = self.decoder(x, self.decoded)
        self.frame += c.frames_per_block
        return frames
