"""The bouncing world model's network: a causal DiT over pixel patches, one frame per block.

    frame [3, 32, 32] --8x8 patches--> 16 tokens --4 x Layer--> predicted clean frame
    Layer:   adaLN-Zero from the frame's noise level -> self-attention (3-axis RoPE over
             frame, row, column; q/k RMS-norm) to the visible clean frames, the frame
             itself and the frame's action registers -> MLP
    actions: each frame's action is `registers_per_action` register tokens, passed as
             extra_k / extra_v: attended to, never committed

The same `Layer`s run through the KV state (`forward_blocks`: one frame of each of B
sessions, each at its own position; the runtime) or over whole clips under a block-causal
mask (`forward_frames`, training) with the same attention: a frame at p sees the sink, the
clean frames in (p - window_frames, p) and itself. Pixels are the latents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.config import RGB_CHANNELS, BouncingConfig
from ardiff.pipelines.shared.nn import (
    AdaLN,
    Modulation,
    Patches,
    Rope,
    RotaryEmbedding,
    TimestepEmbedding,
    rotate,
)
from ardiff.pipelines.shared.rows import OneRowBlock
from ardiff.pipelines.shared.sampling import sample

CELL_INIT_STD = 0.02   # per-cell embedding, small beside the patch projection


def pixels_to_model(frames: np.ndarray) -> torch.Tensor:
    """Simulator frames in [0, 1] -> model pixels in [-1, 1]."""
    return torch.from_numpy(frames) * 2 - 1


def model_to_pixels(x: torch.Tensor) -> np.ndarray:
    """Model pixels (clamped to [-1, 1]) -> float32 numpy frames in [0, 1]."""
    return ((x.float().clamp(-1, 1) + 1) / 2).numpy()


class Conditioning(NamedTuple):
    """What a noise level sets, each part [B, S, 1, dim]: per layer the (attention, MLP)
    modulations, and the final un-gated modulation before the patch projection."""

    layers: list[tuple[Modulation, Modulation]]
    final: Modulation


class Layer(nn.Module):
    """adaLN self-attention + MLP. Attention itself is done by the caller (KV state or mask)."""

    def __init__(self, c: BouncingConfig) -> None:
        super().__init__()
        self.heads, self.head_size = c.num_heads, c.head_size
        self.modulation = AdaLN(c.dim, num_sets=2, zero_init=True)  # every layer starts as identity
        self.norm1 = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.q_norm, self.k_norm = nn.RMSNorm(c.head_size), nn.RMSNorm(c.head_size)
        self.out = nn.Linear(c.dim, c.dim)
        hidden = c.mlp_ratio * c.dim
        self.mlp = nn.Sequential(nn.Linear(c.dim, hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(hidden, c.dim))

    def _split(self, x: torch.Tensor):
        return x.unflatten(-1, (3, self.heads, self.head_size)).unbind(-3)

    def project(self, h, attn: Modulation, rope: Rope):
        """h [..., n, dim] -> rotated q, k and v [..., n, heads, head_size], all in v's dtype."""
        q, k, v = self._split(self.qkv(attn.modulate(self.norm1(h))))
        # Under autocast the norms and the rotation come out in fp32; attention must not.
        return (rotate(self.q_norm(q.float()), rope).to(v.dtype),
                rotate(self.k_norm(k.float()), rope).to(v.dtype), v)

    def register_kv(self, registers, rope: Rope):
        """Action registers [..., r, dim] -> their k, v [..., r, heads, head_size]."""
        _, k, v = self._split(self.qkv(registers))
        return rotate(self.k_norm(k.float()), rope).to(v.dtype), v

    def finish(self, h, attended, mods: tuple[Modulation, Modulation]):
        """Residual update from the attention output [..., n, heads, head_size], then the MLP."""
        attn, mlp = mods
        h = h + attn.gate * self.out(attended.flatten(-2))
        return h + mlp.gate * self.mlp(mlp.modulate(self.norm2(h)))


@dataclass
class FrameInputs:
    """What every forward of the frames at `positions` shares: RoPE of their tokens and,
    per layer, the K/V of their action registers [B, S, R, heads, hs]. From `frame_inputs`
    the S positions are shared by the B rows (rope [S, T, hs/2]); from `block_inputs` each
    row has its own (positions [B], rope [B, 1, T, hs/2])."""

    positions: torch.Tensor
    rope: Rope
    registers: list[tuple[torch.Tensor, torch.Tensor]]

    def rows(self, rows: list[int]) -> FrameInputs:
        """The inputs of `block_inputs` rows `rows` alone, in that order."""
        return FrameInputs(self.positions[rows], Rope(*(x[rows] for x in self.rope)),
                           [(k[rows], v[rows]) for k, v in self.registers])


class BouncingDiT(nn.Module):
    """The denoiser: predicts clean frames (pixels in [-1, 1]) from noisy ones and context.

    Parameters are created in a fixed order (the training script seeds the init).
    With `context_level` (an optional input; weights without it load and run as before) a
    clean history frame's conditioning also carries the noise level it was committed at
    (`conditioning(t, level)`): the model trained on noised history knows how noisy it is.
    """

    def __init__(self, c: BouncingConfig, context_level: bool = False) -> None:
        super().__init__()
        self.c = c
        self.patches = Patches(RGB_CHANNELS, c.patch, c.grid)
        patch_dim = self.patches.patch_dim
        self.patch_in, self.patch_out = nn.Linear(patch_dim, c.dim), nn.Linear(c.dim, patch_dim)
        self.cell = nn.Parameter(torch.randn(c.tokens_per_frame, c.dim) * CELL_INIT_STD)
        self.time = TimestepEmbedding(c.dim)
        self.action = nn.Embedding(len(sim.ACTIONS), c.registers_per_action * c.dim)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.final = AdaLN(c.dim, num_sets=1, gated=False, zero_init=True)
        self.final_norm = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.rotary = RotaryEmbedding(c.head_size, c.grid)
        # Created last, so the parameters before it are drawn as without it.
        self.context_level = TimestepEmbedding(c.dim) if context_level else None
        if self.context_level is not None:   # starts as no change to the conditioning
            nn.init.zeros_(self.context_level[2].weight)
            nn.init.zeros_(self.context_level[2].bias)

    def conditioning(self, t: torch.Tensor, level: torch.Tensor | None = None) -> Conditioning:
        """Noise levels t [B, S] (and, for a model with `context_level`, the context noise
        levels [B, S]: a clean history slot's, 0 for a noisy slot; None: 0) -> the
        modulations they set. Depends on its arguments alone, so a sampler may compute it
        once per level."""
        b, s = t.shape
        emb = self.time(t.flatten())
        if self.context_level is not None:
            level = torch.zeros_like(t) if level is None else level
            emb = emb + self.context_level(level.flatten())
        cond = F.silu(emb).reshape(b, s, 1, self.c.dim)
        # Layers first, then the final: the order autograd sums their gradients into `cond`.
        layers = [layer.modulation(cond) for layer in self.layers]
        (final,) = self.final(cond)
        return Conditioning(layers, final)

    def frame_inputs(self, actions: torch.Tensor, positions: torch.Tensor) -> FrameInputs:
        """actions [B, S] of the frames at absolute `positions` [S]; a register sits at its
        frame's position, row 0, column 0."""
        angles = torch.stack([self.rotary.angles(p, 1, actions.device)
                              for p in positions.tolist()])  # [S, T, hs/2]
        return self._inputs(actions, positions, Rope.from_angles(angles))

    def block_inputs(self, actions: torch.Tensor, positions: list[int]) -> FrameInputs:
        """actions [B] of one frame per row, row b at absolute position positions[b]: the
        inputs of `forward_blocks` (rope [B, 1, T, hs/2], registers [B, 1, R, heads, hs])."""
        angles = self.rotary.angles_rows(positions, 1, actions.device)[:, None]  # [B, 1, T, hs/2]
        return self._inputs(actions[:, None], torch.tensor(positions), Rope.from_angles(angles))

    def _inputs(self, actions: torch.Tensor, positions: torch.Tensor, rope: Rope) -> FrameInputs:
        r = self.c.registers_per_action
        register_rope = Rope(*(x[..., :1, :].expand(*x.shape[:-2], r, -1) for x in rope))
        emb = self.action(actions).unflatten(-1, (r, self.c.dim))
        return FrameInputs(positions, rope,
                           [layer.register_kv(emb, register_rope) for layer in self.layers])

    def _run(self, frames, conditioning: Conditioning, inputs: FrameInputs, attend):
        """The layers over frames [B, S, 3, size, size]; attend(layer, q, k, v, rk, rv) does
        attention. Returns predicted frames of the same shape."""
        h = self.patch_in(self.patches.patchify(frames)) + self.cell  # [B, S, T, dim]
        for index, layer in enumerate(self.layers):
            mods = conditioning.layers[index]
            q, k, v = layer.project(h, mods[0], inputs.rope)            # [B, S, T, heads, hs]
            h = layer.finish(h, attend(index, q, k, v, *inputs.registers[index]), mods)
        out = self.patch_out(conditioning.final.modulate(self.final_norm(h)))
        return self.patches.unpatchify(out)

    def forward_block(self, x, conditioning: Conditioning, inputs: FrameInputs, blk):
        """One frame x [1, 3, size, size] attending through one session's KV `blk`.
        `conditioning` is `conditioning(t)` of its noise level, `inputs` the `frame_inputs`
        of its action at position blk.start_frame."""
        return self.forward_blocks(x[None], conditioning, inputs, OneRowBlock(blk))[0]

    def forward_blocks(self, x, conditioning: Conditioning, inputs: FrameInputs, blk):
        """One frame of each of B sessions, x [B, 1, 3, size, size], attending through the
        batch block `blk` (row b: its own session). `conditioning` is `conditioning(t)` of
        their noise level, `inputs` the `block_inputs` of their actions at blk.start_frames."""
        assert inputs.positions.tolist() == blk.start_frames, "frame inputs of other frames"
        h = self.patch_in(self.patches.patchify(x)) + self.cell  # [B, 1, T, dim]
        h = self.block_layers(h, conditioning.layers, inputs.rope, inputs.registers, blk)
        out = self.patch_out(conditioning.final.modulate(self.final_norm(h)))
        return self.patches.unpatchify(out)

    def block_layers(self, h, layer_mods, rope: Rope, registers, blk):
        """The layer stack of `forward_blocks` over h [B, 1, T, dim], attending through the
        batch block `blk` (what `runtime.compile` compiles); the same ops in the same order
        as `_run`."""
        for index, layer in enumerate(self.layers):
            mods = layer_mods[index]
            q, k, v = layer.project(h, mods[0], rope)            # [B, 1, T, heads, hs]
            rk, rv = registers[index]                              # [B, 1, R, heads, hs]
            out = blk.attend(index, q[:, 0], k[:, 0], v[:, 0], extra_k=rk[:, 0],
                             extra_v=rv[:, 0])                     # [B, T, heads, hs]
            h = layer.finish(h, out[:, None], mods)
        return h

    def forward_frames(self, frames, t, actions, positions, noisy, level=None):
        """A block-causal pass over clips. frames [B, S, 3, size, size] at noise levels
        t [B, S] with actions [B, S]; positions [S] (absolute frame indices) and noisy [S]
        (bool) describe the S slots: clean slots are history, noisy slots are predicted;
        `level` [B, S] the context noise levels (`conditioning`).
        Returns the clean prediction of every slot [B, S, 3, size, size]."""
        mask = self.frame_mask(positions, noisy)

        def attend(index, q, k, v, rk, rv):
            keys = torch.cat([k.flatten(1, 2), rk.flatten(1, 2)], dim=1).transpose(1, 2)
            values = torch.cat([v.flatten(1, 2), rv.flatten(1, 2)], dim=1).transpose(1, 2)
            out = F.scaled_dot_product_attention(q.flatten(1, 2).transpose(1, 2), keys, values,
                                                 attn_mask=mask)     # [B, heads, S*T, hs]
            return out.transpose(1, 2).unflatten(1, (len(positions), -1))

        return self._run(frames, self.conditioning(t, level), self.frame_inputs(actions, positions),
                         attend)

    def frame_mask(self, positions: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
        """[S*T, S*T + S*R] bool over [frame tokens | registers]: a slot sees itself, its own
        registers, and the clean slots a block at its position sees through the KV cache
        (the sink, and positions in (p - window_frames, p))."""
        c, s = self.c, len(positions)
        p_q, p_k = positions[:, None], positions[None, :]
        history = (p_k < p_q) & ~noisy[None, :] & ((p_k > p_q - c.window_frames)
                                                    | (p_k < c.sink_frames))
        own = torch.eye(s, dtype=torch.bool, device=positions.device)
        tokens = c.tokens_per_frame
        frames = (history | own).repeat_interleave(tokens, 0).repeat_interleave(tokens, 1)
        registers = own.repeat_interleave(tokens, 0).repeat_interleave(c.registers_per_action, 1)
        return torch.cat([frames, registers], dim=1)


@torch.inference_mode()
def sample_next(model: BouncingDiT, history: torch.Tensor, actions: torch.Tensor,
                start: int, noise: torch.Tensor, num_steps: int,
                history_level: float = 0.0) -> torch.Tensor:
    """The next frame after `history` [B, H, 3, s, s] (frames start..start+H-1) under
    actions [B, H + 1]: num_steps steps from noise [B, 3, s, s], as the pipeline samples,
    through `forward_frames`; `history_level`: the context noise level the history was
    committed at (`BouncingDiT.conditioning`). The history is encoded afresh, so its first
    frames see less of the past than in a long KV-cache run."""
    b, h = history.shape[:2]
    positions = torch.arange(start, start + h + 1)
    noisy = positions == start + h
    level = torch.zeros(b, h + 1)
    level[:, :-1] = history_level

    def predict_clean(x: torch.Tensor, t: float) -> torch.Tensor:
        t_slots = torch.zeros(b, h + 1)
        t_slots[:, -1] = t
        return model.forward_frames(torch.cat([history, x[:, None]], 1), t_slots, actions,
                                    positions, noisy, level)[:, -1].clamp(-1, 1)

    return sample(noise, predict_clean, num_steps)
