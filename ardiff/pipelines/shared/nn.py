"""Model parts the shipped pipelines share: timestep embedding, 3-axis rotary positions,
adaLN modulation with named shift / scale / gate, and patchify / unpatchify.

Each part computes exactly what the pipelines computed when each had its own copy (same
op order, same dtypes), so a shipped video is byte-identical whichever model calls it,
and parameters keep the names the shipped weights were saved under.

Shapes: tokens are laid out frame by frame, `grid^2` each, row-major over the patch grid;
heads are `[..., tokens, heads, head_size]` throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import nn

MAX_PERIOD = 10_000.0       # longest sinusoid period, as in the Transformer / DiT embeddings
TIMESTEP_SCALE = 1000.0     # t in [0, 1] -> the 0..1000 range those embeddings were made for
ROPE_BASE = 10_000.0


def parameter_bytes(build: Callable[[], nn.Module], dtype: torch.dtype) -> int:
    """Bytes of the parameters of the module `build()` makes, in `dtype`, counted on the meta
    device: nothing is allocated or initialised (a pipeline's `weight_bytes` before `load`)."""
    with torch.device("meta"):
        module = build()
    return sum(p.numel() for p in module.parameters()) * dtype.itemsize


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of noise levels in [0, 1]: [n] -> [n, dim], float32, (cos | sin)."""
    half = dim // 2
    freqs = torch.exp(-math.log(MAX_PERIOD) * torch.arange(half, device=t.device) / half)
    angles = (t.float() * TIMESTEP_SCALE)[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class TimestepEmbedding(nn.Sequential):
    """Noise levels [n] in [0, 1] -> conditioning [n, dim]: sinusoid, Linear, SiLU, Linear.

    A Sequential, so its parameters are named `0.*` and `2.*` as in the shipped weights.
    The sinusoid is cast to the weights' dtype (the model runs in one dtype).
    """

    def __init__(self, dim: int) -> None:
        super().__init__(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return super().forward(timestep_embedding(t, self.dim).to(self[0].weight.dtype))


class Rope(NamedTuple):
    """Cosines and sines of rotation angles, each [..., tokens, head_size // 2], float32."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def from_angles(cls, angles: torch.Tensor) -> Rope:
        return cls(angles.cos(), angles.sin())


def rotate(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate x [..., tokens, heads, head_size] pairwise by `rope` [..., tokens, head_size // 2].

    Computed in float32, returned in x's dtype; every head of a token turns the same way.
    At inference each half is written into its place of one output (the same products and
    sums, so the same bits as the stacked form, without stacking a copy); under a compiler,
    which fuses the stack, and wherever gradients flow (training: `out=` has no autograd)
    it is the stacked form.
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    x1, x2 = pairs.unbind(-1)
    cos, sin = rope.cos[..., None, :], rope.sin[..., None, :]
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (
            pairs.requires_grad or cos.requires_grad)):
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos],
                           dim=-1).flatten(-2).to(x.dtype)
    out = torch.empty_like(pairs)
    first, second = out.unbind(-1)
    torch.mul(x1, cos, out=first).sub_(x2 * sin)
    torch.mul(x1, sin, out=second).add_(x2 * cos)
    return out.flatten(-2).to(x.dtype)


class RotaryEmbedding:
    """3-axis rotary embedding over (frame, row, column) positions of a `grid` x `grid` frame.

    The head's rotation pairs are split between the axes: the frame axis gets what is
    left after a quarter each to rows and columns. Frame positions are absolute (from
    `blk.start_frame`), so an evicted past does not shift them. No parameters.
    """

    def __init__(self, head_size: int, grid: int, base: float = ROPE_BASE) -> None:
        pairs = head_size // 2
        self.space_pairs = pairs // 4
        self.frame_pairs = pairs - 2 * self.space_pairs
        self.grid, self.base = grid, base

    def _angles(self, pos: torch.Tensor, pairs: int) -> torch.Tensor:
        inv = self.base ** (-torch.arange(pairs, device=pos.device, dtype=torch.float32) / pairs)
        return pos.float()[:, None] * inv[None]  # [tokens, pairs]

    def angles(self, start_frame: int, num_frames: int, device: torch.device) -> torch.Tensor:
        """Rotation angles of a block of frames: [num_frames * grid^2, head_size // 2]."""
        return self.angles_rows([start_frame], num_frames, device)[0]

    def angles_rows(self, start_frames: list[int], num_frames: int,
                    device: torch.device) -> torch.Tensor:
        """`angles` of one block per row, row b at start_frames[b]: [B, num_frames * grid^2,
        head_size // 2], each row exactly `angles(start_frames[b], ...)` (elementwise)."""
        cells = self.grid * self.grid
        token = torch.arange(num_frames * cells, device=device)
        starts = torch.tensor(start_frames, device=device)[:, None]
        frame = (starts + token // cells).flatten()            # [B * tokens]
        row, col = (token % cells) // self.grid, token % self.grid
        space = torch.cat([self._angles(row, self.space_pairs),
                           self._angles(col, self.space_pairs)], dim=-1)
        rows = len(start_frames)
        return torch.cat([self._angles(frame, self.frame_pairs).unflatten(0, (rows, -1)),
                          space.expand(rows, -1, -1)], dim=-1)

    def rope(self, start_frame: int, num_frames: int, device: torch.device) -> Rope:
        """`Rope` of a block of frames, [num_frames * grid^2, head_size // 2] each."""
        return Rope.from_angles(self.angles(start_frame, num_frames, device))


class Modulation(NamedTuple):
    """One adaLN modulation, each part [..., 1, dim] (broadcast over tokens).

    `modulate` shifts and scales a normalised input; `gate` (absent on a final,
    un-gated modulation) scales what a residual branch adds back.
    """

    shift: torch.Tensor
    scale: torch.Tensor
    gate: torch.Tensor | None = None

    def modulate(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1 + self.scale) + self.shift


class AdaLN(nn.Linear):
    """Conditioning [..., dim] -> `num_sets` `Modulation`s, in the order they are laid out:

        [shift_0 | scale_0 | gate_0 | shift_1 | scale_1 | gate_1 | ...]   (gated)
        [shift_0 | scale_0]                                               (gated=False)

    A Linear, so its parameters keep the names of the Linear it replaced (`modulation.*`
    in the shipped weights) and a seeded model draws the same initial weights.
    `zero_init` makes it adaLN-Zero: every modulation starts as the identity, no gate open.
    """

    def __init__(self, dim: int, num_sets: int, gated: bool = True,
                 zero_init: bool = False) -> None:
        parts = 3 if gated else 2
        super().__init__(dim, num_sets * parts * dim)
        self.num_sets, self.parts = num_sets, parts
        if zero_init:
            nn.init.zeros_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, cond: torch.Tensor) -> tuple[Modulation, ...]:
        chunks = super().forward(cond).chunk(self.num_sets * self.parts, dim=-1)
        return tuple(Modulation(*chunks[i:i + self.parts])
                     for i in range(0, len(chunks), self.parts))


@dataclass(frozen=True)
class Patches:
    """Square frames [..., channels, grid * patch, grid * patch] <-> patch tokens
    [..., grid^2, channels * patch^2], row-major over the grid; a token's features are
    channel-major. `unpatchify(patchify(x)) == x` exactly (pure data movement).
    """

    channels: int
    patch: int
    grid: int

    @property
    def patch_dim(self) -> int:
        return self.channels * self.patch * self.patch

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        lead, c, g, p = x.shape[:-3], self.channels, self.grid, self.patch
        x = x.reshape(-1, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(*lead, g * g, self.patch_dim)

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        lead, c, g, p = tokens.shape[:-2], self.channels, self.grid, self.patch
        x = tokens.reshape(-1, g, g, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(*lead, c, g * p, g * p)
