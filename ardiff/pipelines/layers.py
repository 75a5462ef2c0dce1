"""Building blocks of the reference DiT: rotary positions, timestep embedding, adaLN block.

Shapes: tokens are laid out frame by frame, `tokens_per_frame` each, row-major
over the patch grid. Heads are `[tokens, heads, head_size]` throughout.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ardiff.kv.attention import attend


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of timesteps in [0, 1]: [n] -> [n, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=t.device) / half)
    angles = (t.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class Rotary:
    """3-axis rotary embedding over (frame, row, column) positions.

    The head's rotation pairs are split between the axes: the frame axis gets
    what is left after a quarter each to rows and columns. Frame positions are
    absolute (from `blk.start_frame`), so an evicted past does not shift them.
    """

    def __init__(self, head_size: int, grid: int, base: float = 10_000.0) -> None:
        pairs = head_size // 2
        self.space_pairs = pairs // 4
        self.frame_pairs = pairs - 2 * self.space_pairs
        self.grid, self.base = grid, base

    def _angles(self, pos: torch.Tensor, pairs: int) -> torch.Tensor:
        inv = self.base ** (-torch.arange(pairs, device=pos.device, dtype=torch.float32) / pairs)
        return pos.float()[:, None] * inv[None]  # [tokens, pairs]

    def angles(self, start_frame: int, num_frames: int, device: torch.device) -> torch.Tensor:
        """Rotation angles for a block of frames: [num_frames * grid^2, head_size // 2]."""
        cells = self.grid * self.grid
        token = torch.arange(num_frames * cells, device=device)
        frame = start_frame + token // cells
        row, col = (token % cells) // self.grid, token % self.grid
        return torch.cat([self._angles(frame, self.frame_pairs),
                          self._angles(row, self.space_pairs),
                          self._angles(col, self.space_pairs)], dim=-1)

    @staticmethod
    def apply(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Rotate [tokens, heads, head_size] by angles [tokens, head_size // 2]."""
        x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        return out.to(x.dtype)


class DiTBlock(nn.Module):
    """adaLN-modulated self-attention (through the KV state), cross-attention and MLP."""

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_size = dim // num_heads
        kv_dim = num_kv_heads * self.head_size
        self.modulation = nn.Linear(dim, 6 * dim)
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, kv_dim), nn.Linear(dim, kv_dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_q, self.cross_out = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.cross_k, self.cross_v = nn.Linear(dim, kv_dim), nn.Linear(dim, kv_dim)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(mlp_ratio * dim, dim))

    def heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.unflatten(-1, (n, self.head_size))  # [tokens, n, head_size]

    def cross_kv(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention K/V of the text tokens: [text_tokens, kv_heads, head_size] each."""
        return (self.heads(self.cross_k(text), self.num_kv_heads),
                self.heads(self.cross_v(text), self.num_kv_heads))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, angles: torch.Tensor, blk,
                layer: int, cross: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(cond).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        q = Rotary.apply(self.heads(self.q(h), self.num_heads), angles)
        k = Rotary.apply(self.heads(self.k(h), self.num_kv_heads), angles)
        v = self.heads(self.v(h), self.num_kv_heads)
        x = x + gate1 * self.out(blk.attend(layer, q, k, v).flatten(-2))
        q = self.heads(self.cross_q(self.norm2(x)), self.num_heads)
        x = x + self.cross_out(attend(q, *cross).flatten(-2))
        return x + gate2 * self.mlp(self.norm3(x) * (1 + scale2) + shift2)
