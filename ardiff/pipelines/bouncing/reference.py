"""The default model's rollout written by hand: the baseline `ardiff bench` holds ardiff to.

What a research repo would write for this model, over the same weights: one contiguous
K/V ring per layer, `scaled_dot_product_attention`, no runner, no sessions, no checks.
It makes the same frames as `BouncingWorld` through ardiff (the bench checks that), so the
ratio of the two times is ardiff's own overhead.

The ring keeps the `recent` = window_frames - 1 frames a frame attends to besides itself
(and the sink before them), each written twice, at slot s and s + recent, so the last m
frames are always one contiguous slice, oldest first (the order ardiff gives them):

    slots     | 0 | 1 | 2 | 3 | 0'| 1'| 2'| 3'|     recent = 4, frames 0..5 committed
    frames    | 4 | 5 | 2 | 3 | 4 | 5 | 2 | 3 |
    visible               [ 2   3   4   5 ]       = ring[2:6]
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.config import RGB_CHANNELS, BouncingConfig
from ardiff.pipelines.bouncing.model import BouncingDiT, pixels_to_model
from ardiff.pipelines.bouncing.pipeline import CLEAN, to_video
from ardiff.pipelines.sampling import block_noise, sample


class KVRing:
    """One layer's K or V history: [sink frames | 2 x recent frames] tokens, preallocated."""

    def __init__(self, config: BouncingConfig, device, dtype: torch.dtype) -> None:
        self.tokens, self.sink = config.tokens_per_frame, config.sink_frames
        self.recent = max(0, config.window_frames - 1)  # one frame per block
        shape = ((self.sink + 2 * self.recent) * self.tokens, config.num_heads, config.head_size)
        self.data = torch.empty(shape, device=device, dtype=dtype)

    def write(self, frame: int, x: torch.Tensor) -> None:  # x: [tokens, heads, head_size]
        if frame < self.sink:
            self._slot(frame).copy_(x)
        elif self.recent:
            slot = self.sink + (frame - self.sink) % self.recent
            self._slot(slot).copy_(x)
            self._slot(slot + self.recent).copy_(x)

    def visible(self, frames: int) -> list[torch.Tensor]:
        """The history a frame at position `frames` sees: [sink, recent], oldest first."""
        sink = min(self.sink, frames)
        recent = min(self.recent, frames - sink)
        start = self.sink + (frames - recent - self.sink) % self.recent if recent else 0
        t = self.tokens
        return [self.data[:sink * t], self.data[start * t:(start + recent) * t]]

    def _slot(self, slot: int) -> torch.Tensor:
        return self.data[slot * self.tokens:(slot + 1) * self.tokens]


class RingBlock:
    """What `BouncingDiT.forward_block` needs of a KV block: its position and `attend`."""

    def __init__(self, loop: ReferenceLoop, frame: int, commit: bool) -> None:
        self.loop, self.start_frame, self.commit = loop, frame, commit

    def attend(self, layer: int, q, k, v, extra_k, extra_v):  # [tokens, heads, head_size]
        k_ring, v_ring = self.loop.k[layer], self.loop.v[layer]
        keys = torch.cat([*k_ring.visible(self.start_frame), k, extra_k])
        values = torch.cat([*v_ring.visible(self.start_frame), v, extra_v])
        out = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, keys, values)))
        if self.commit:
            k_ring.write(self.start_frame, k)
            v_ring.write(self.start_frame, v)
        return out[0].transpose(0, 1)  # [1, heads, tokens, head_size] -> [tokens, heads, head_size]


class ReferenceLoop:
    """One rollout of the bouncing world model, frame by frame, without ardiff's runtime.

    `model` is a loaded `BouncingDiT` (the pipeline's own, so the weights are the same);
    `config` the pipeline's `BouncingConfig`. `step` makes the next frame.
    """

    def __init__(self, model: BouncingDiT, config: BouncingConfig) -> None:
        self.model, self.config = model, config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        layers = range(config.num_layers)
        self.k = [KVRing(config, self.device, self.dtype) for _ in layers]
        self.v = [KVRing(config, self.device, self.dtype) for _ in layers]
        self.levels = {}
        self.frame, self.world = 0, None

    @torch.inference_mode()
    def step(self, seed: int, action: str = "none", num_steps: int | None = None) -> torch.Tensor:
        """The next frame as uint8 video [1, H, W, 3]; `seed` names the world and the noise."""
        model, frame, a = self.model, self.frame, sim.ACTIONS.index(action)
        inputs = model.frame_inputs(torch.tensor([[a]], device=self.device),
                                    torch.tensor([frame]))
        if frame < self.config.context_frames:
            x = self._start_frame(seed, a)
        else:
            shape = (1, RGB_CHANNELS, self.config.size, self.config.size)
            noise = block_noise(shape, seed, frame, self.device, self.dtype)

            def predict_clean(x, t):
                return model.forward_block(x, self._level(t), inputs,
                                           RingBlock(self, frame, False)).clamp(-1, 1)

            x = sample(noise, predict_clean, num_steps or self.config.num_steps)
        model.forward_block(x, self._level(CLEAN), inputs, RingBlock(self, frame, True))
        self.frame += 1
        return to_video(x, self.config.upscale)

    def _level(self, t: float):
        if t not in self.levels:
            self.levels[t] = self.model.conditioning(torch.full((1, 1), t, device=self.device))
        return self.levels[t]

    def _start_frame(self, seed: int, action: int) -> torch.Tensor:
        if self.frame == 0:
            self.world = sim.SimState.from_seed(seed)
        self.world = sim.step(self.world, np.array([action]))
        return pixels_to_model(sim.render(self.world)).to(self.device, self.dtype)
