"""The default model's rollout written by hand: the baseline `ardiff bench` holds ardiff to.

What a research repo would write for this model, over the same weights: one contiguous
K/V ring per layer (`ardiff.pipelines.shared.ring`), `scaled_dot_product_attention`, no
runner, no sessions, no checks. It makes the same frames as `BouncingWorld` through ardiff
(tests and the bench check that), so the ratio of the two times is ardiff's own overhead.
`BouncingWorld.reference_loop(spec)` makes one.
"""

from __future__ import annotations

import numpy as np
import torch

from ardiff.contract.forward import RolloutRequest
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.config import RGB_CHANNELS, BouncingConfig
from ardiff.pipelines.bouncing.model import BouncingDiT, pixels_to_model
from ardiff.pipelines.bouncing.pipeline import CLEAN, FRAMES_PER_BLOCK, to_video
from ardiff.pipelines.shared.ring import RingCache
from ardiff.pipelines.shared.sampling import block_noise, sample


class ReferenceLoop:
    """One rollout of the bouncing world model, frame by frame, without ardiff's runtime.

    `model` is a loaded `BouncingDiT` (the pipeline's own, so the weights are the same);
    `config` the pipeline's `BouncingConfig`. `step(request)` makes the next frame from
    the request's seed, action and step count.
    """

    def __init__(self, model: BouncingDiT, config: BouncingConfig) -> None:
        self.model, self.config = model, config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = RingCache(config.num_layers, config.tokens_per_frame, config.sink_frames,
                               max(0, config.window_frames - FRAMES_PER_BLOCK),
                               config.num_heads, config.head_size, self.device, self.dtype)
        self.levels = {}
        self.frame, self.world = 0, None

    @torch.inference_mode()
    def step(self, request: RolloutRequest) -> torch.Tensor:
        """The next frame as uint8 video [1, H, W, 3]."""
        model, frame = self.model, self.frame
        action = sim.ACTIONS.index((request.actions or ("none",))[0])
        inputs = model.frame_inputs(torch.tensor([[action]], device=self.device),
                                    torch.tensor([frame]))
        if frame < self.config.context_frames:
            x, kept = self._start_frame(request.seed, action)
        else:
            shape = (FRAMES_PER_BLOCK, RGB_CHANNELS, self.config.size, self.config.size)
            noise = block_noise(shape, request.seed, frame, self.device, self.dtype)

            def predict_clean(x, t):
                return model.forward_block(x, self._level(t), inputs,
                                           self.cache.block(frame, commit=False)).clamp(-1, 1)

            x = kept = sample(noise, predict_clean, request.num_steps or self.config.num_steps)
        model.forward_block(kept, self._level(CLEAN), inputs, self.cache.block(frame, commit=True))
        self.frame += FRAMES_PER_BLOCK
        return to_video(x, self.config.upscale)

    def _level(self, t: float):
        if t not in self.levels:
            self.levels[t] = self.model.conditioning(torch.full((1, 1), t, device=self.device))
        return self.levels[t]

    def _start_frame(self, seed: int, action: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame as shown and as committed (a sink frame without the sprite)."""
        if self.frame == 0:
            self.world = sim.SimState.from_seed(seed)
        self.world = sim.step(self.world, np.array([action]))
        sprite = self.frame >= self.config.sink_frames
        return tuple(pixels_to_model(sim.render(self.world, sprite=shows)).to(self.device, self.dtype)
                     for shows in (True, sprite))
