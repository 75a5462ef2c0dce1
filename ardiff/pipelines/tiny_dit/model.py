"""The tiny causal video DiT's network and config: the Wan / Self-Forcing family at toy width.

    latents [F, C, h, w] --patchify--> tokens [F * grid^2, dim] --N x DiTBlock--> clean latents
    DiTBlock: adaLN(t) -> self-attention through blk.attend (3-axis RoPE, absolute frame
              positions) -> cross-attention to the prompt's K/V -> MLP

One forward is one block of one session (x [F, C, h, w], a KV block, the prompt's K/V
[L, kv_heads, hs]) or one block of each of B sessions (x [B, F, C, h, w], a batch block,
each row's prompt K/V stacked [B, L, kv_heads, hs]); the same layers run either way.

Weights are a deterministic random initialisation from `weights_seed` (parameters are made
in a fixed order): the videos carry no meaning; the model exists to exercise ardiff.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import ardiff
from ardiff.kv.attention import attend
from ardiff.pipelines.shared.nn import (
    AdaLN,
    Patches,
    Rope,
    RotaryEmbedding,
    TimestepEmbedding,
    rotate,
)
from ardiff.pipelines.tiny_dit.text import TextEncoder

ROPES_KEPT = 16  # positions whose rope a model keeps (a block's forwards share one)


@dataclass(frozen=True)
class TinyDiTConfig:
    """Model and window shape; the KV spec is derived from it and nothing else."""

    latent_channels: int = 4
    latent_size: int = 16       # latent height = width
    patch_size: int = 2
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2       # grouped-query attention
    mlp_ratio: int = 2
    frames_per_block: int = 3
    window_frames: int = 9
    sink_frames: int = 1
    reset_at_boundary: bool = False
    text_tokens: int = 16
    num_steps: int = 4
    upscale: int = 4            # decoder upsampling: video side = latent_size * upscale
    max_frames: int = 100_000   # RoPE positions along time
    cfg: bool = False           # declare positive/negative branches for guidance
    session_capacity: int = 8
    weights_seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.dim % self.num_heads == 0, "dim", "a multiple of num_heads"),
            (self.num_heads % self.num_kv_heads == 0, "num_heads", "a multiple of num_kv_heads"),
            (self.latent_size % self.patch_size == 0, "latent_size", "a multiple of patch_size"),
            ((self.dim // self.num_heads) % 8 == 0, "dim", "such that dim / num_heads is a "
                                                           "multiple of 8 (3-axis RoPE)"),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise ardiff.ConfigError(f"pipeline.args.{name}: {getattr(self, name)!r} must "
                                         f"be {rule}")

    @property
    def head_size(self) -> int:
        return self.dim // self.num_heads

    @property
    def grid(self) -> int:
        return self.latent_size // self.patch_size

    @property
    def tokens_per_frame(self) -> int:
        return self.grid * self.grid

    @property
    def patches(self) -> Patches:
        return Patches(self.latent_channels, self.patch_size, self.grid)

    @property
    def branch_names(self) -> tuple[str, ...]:
        return ("positive", "negative") if self.cfg else ("main",)


class DiTBlock(nn.Module):
    """adaLN-modulated self-attention (through the KV state), cross-attention and MLP.

    Parameters are created in a fixed order: a seeded random model is the same model.
    """

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_size = dim // num_heads
        kv_dim = num_kv_heads * self.head_size
        self.modulation = AdaLN(dim, num_sets=2)   # attention, MLP
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
        return x.unflatten(-1, (n, self.head_size))  # [(B,) tokens, n, head_size]

    def cross_kv(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention K/V of the text tokens: [text_tokens, kv_heads, head_size] each."""
        return (self.heads(self.cross_k(text), self.num_kv_heads),
                self.heads(self.cross_v(text), self.num_kv_heads))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, rope: Rope, blk,
                layer: int, cross: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        attn, mlp = self.modulation(cond)
        h = attn.modulate(self.norm1(x))
        q = rotate(self.heads(self.q(h), self.num_heads), rope)
        k = rotate(self.heads(self.k(h), self.num_kv_heads), rope)
        v = self.heads(self.v(h), self.num_kv_heads)
        x = x + attn.gate * self.out(blk.attend(layer, q, k, v).flatten(-2))
        q = self.heads(self.cross_q(self.norm2(x)), self.num_heads)
        x = x + self.cross_out(cross_attend(q, *cross).flatten(-2))
        return x + mlp.gate * self.mlp(mlp.modulate(self.norm3(x)))


class TinyDiT(nn.Module):
    """The denoiser: one forward over one block of one branch."""

    def __init__(self, c: TinyDiTConfig) -> None:
        super().__init__()
        self.c = c
        self.patches = c.patches
        self.patch_in = nn.Linear(self.patches.patch_dim, c.dim)
        self.time = TimestepEmbedding(c.dim)
        self.blocks = nn.ModuleList(DiTBlock(c.dim, c.num_heads, c.num_kv_heads, c.mlp_ratio)
                                    for _ in range(c.num_layers))
        self.final_modulation = AdaLN(c.dim, num_sets=1, gated=False)
        self.final_norm = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.patch_out = nn.Linear(c.dim, self.patches.patch_dim)
        self.text = TextEncoder(c.dim, c.text_tokens)
        self.rotary = RotaryEmbedding(c.head_size, c.grid)
        self._ropes: dict[tuple, Rope] = {}  # (positions, num_frames, device) -> their rope

    def layers(self, h: torch.Tensor, cond: torch.Tensor, rope: Rope, blk,
               cross: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The layer stack over tokens h [(B,) F * grid^2, dim] (what `runtime.compile`
        compiles)."""
        for layer, block in enumerate(self.blocks):
            h = block(h, cond, rope, blk, layer, cross[layer])
        return h

    def text_kv(self, prompt: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        text = self.text(prompt)
        return [block.cross_kv(text) for block in self.blocks]

    def forward(self, x: torch.Tensor, t: float, blk,
                cross: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Predicted clean latents for noisy latents x [F, C, h, w] at noise level t, or for
        x [B, F, C, h, w] through a batch block (row b at blk.start_frames[b])."""
        num_frames = x.shape[-4]
        rope = self._rope(blk.start_frames if x.dim() == 5 else blk.start_frame, num_frames,
                          x.device)
        cond = self.time(torch.full((1,), t, device=x.device))  # [1, dim]
        h = self.patch_in(self.patches.patchify(x).flatten(-3, -2))  # [(B,) F * grid^2, dim]
        h = self.layers(h, cond, rope, blk, cross)
        (final,) = self.final_modulation(cond)
        out = self.patch_out(final.modulate(self.final_norm(h)))
        return self.patches.unpatchify(out.unflatten(-2, (num_frames, -1)))

    def _rope(self, start_frames: int | list[int], num_frames: int,
              device: torch.device) -> Rope:
        """`block_rope`, kept for the last few positions: a block's probes and commit share
        it (the rope depends on the positions alone)."""
        key = (start_frames if isinstance(start_frames, int) else tuple(start_frames),
               num_frames, device)
        if key not in self._ropes:
            if len(self._ropes) >= ROPES_KEPT:
                self._ropes.clear()
            self._ropes[key] = self.block_rope(start_frames, num_frames, device)
        return self._ropes[key]

    def block_rope(self, start_frames: int | list[int], num_frames: int,
                   device: torch.device) -> Rope:
        """RoPE of a block at `start_frames` ([F * grid^2, hs/2] each), or of one block per
        row at start_frames[b] ([B, F * grid^2, hs/2] each)."""
        if isinstance(start_frames, int):
            return self.rotary.rope(start_frames, num_frames, device)
        return Rope.from_angles(self.rotary.angles_rows(start_frames, num_frames, device))


def cross_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked attention of q [(B,) tokens, heads, hs] to k, v [(B,) L, kv_heads, hs]: each
    row to its own prompt (every prompt has the same L tokens, so no mask)."""
    if q.dim() == 3:
        return attend(q, k, v)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)  # [B, tokens, heads, hs]
