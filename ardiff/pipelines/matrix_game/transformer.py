"""Matrix-Game 2.0's transformer: causal-Wan's `BlockTransformer` (diffusers'
`WanTransformer3DModel` through ardiff's KV state) with the action modules and the image.

    x [B, 16, F, h, w] | cond [B, 20, F, h, w] (first-frame mask, image latents)
      -> patches -> 30 blocks -> flow [B, 16, F, h, w]
    block: self-attention (blk.attend, RoPE at each row's frames) -> cross-attention to the
           session's 257 image tokens ("image" cross-attention cache) -> action module
           (blocks 0-14; per-session caches) -> FFN

The block is diffusers' `WanTransformerBlock.forward` with the action module inserted where
the released `CausalWanAttentionBlock` runs it. One timestep for the whole block (the
released loop gives every frame of a block the same one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from ardiff.pipelines.causal_wan.processors import text_kv
from ardiff.pipelines.causal_wan.transformer import BlockTransformer, RowsCross
from ardiff.pipelines.matrix_game.action_module import ActionModule

CLIP_DIM = 1280  # MLPProj(1280, dim): the CLIP tokens' width


class ImageProjection(nn.Module):
    """The released `img_emb` (MLPProj): CLIP tokens [B, 257, 1280] -> [B, 257, dim]."""

    def __init__(self, dim: int, clip_dim: int = CLIP_DIM) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(clip_dim), nn.Linear(clip_dim, clip_dim),
                                  nn.GELU(), nn.Linear(clip_dim, dim), nn.LayerNorm(dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(tokens)


@dataclass
class RowActions:
    """The action inputs of a forward's rows: mouse [B, F, 4*window*2] (None: no mouse),
    keyboard [B, F, 4*window, keys], and per action layer the K/V each row's session kept."""

    mouse: torch.Tensor | None
    keyboard: torch.Tensor
    kept: dict[int, list[dict[str, torch.Tensor] | None]]


class MatrixGameTransformer(BlockTransformer):
    """The backbone (diffusers), the image projection and the action modules by layer."""

    def __init__(self, model: Any, img_emb: ImageProjection,
                 actions: dict[int, ActionModule]) -> None:
        super().__init__(model)
        self.img_emb = img_emb
        self.actions = actions

    def image_kv(self, clip_tokens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the cross-attention (k, v) [257, heads, hs] of one image's CLIP tokens."""
        context = self.img_emb(clip_tokens.to(self.dtype))
        return [text_kv(block.attn2, context) for block in self.model.blocks]

    def flow_actions(self, x: torch.Tensor, timestep: float, blk: Any, cross: RowsCross,
                     actions: RowActions) -> tuple[torch.Tensor, dict[int, list[dict]]]:
        """The flow [B, 16, F, h, w] of rows x [B, 36, F, h, w] (noisy latents, mask, image
        latents) at `timestep`, and per action layer each row's new action K/V."""
        model = self.model
        _, _, frames, height, width = x.shape
        rows, cols = height // 2, width // 2
        rope = self.rope_rows(blk.start_frames, frames, rows, cols, x.device)
        temb, modulation = self.time_embedding(timestep, x.device)
        h = self._patches(x.to(self.dtype))  # [B, tokens, dim]
        new: dict[int, list[dict]] = {}
        with self.binding.bound(blk, cross):
            for layer, block in enumerate(model.blocks):
                h = self._block(layer, block, h, modulation, rope, blk.start_frames,
                                (rows, cols), actions, new)
        shift, scale = (model.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        h = (model.norm_out(h.float()) * (1 + scale) + shift).type_as(h)
        return self._unpatchify(model.proj_out(h), frames, rows, cols), new

    def _block(self, layer: int, block: Any, h: torch.Tensor, modulation: torch.Tensor,
               rope: tuple[torch.Tensor, torch.Tensor], starts: Sequence[int],
               grid: tuple[int, int], actions: RowActions, new: dict[int, list[dict]]
               ) -> torch.Tensor:
        shift, scale, gate, c_shift, c_scale, c_gate = (
            block.scale_shift_table + modulation.float()).chunk(6, dim=1)
        normed = (block.norm1(h.float()) * (1 + scale) + shift).type_as(h)
        h = (h.float() + block.attn1(normed, None, None, rope) * gate).type_as(h)
        h = h + block.attn2(block.norm2(h.float()).type_as(h), None, None, None)
        if layer in self.actions:
            h, new[layer] = self.actions[layer](h, grid, starts, actions.mouse,
                                                actions.keyboard, actions.kept[layer])
        normed = (block.norm3(h.float()) * (1 + c_scale) + c_shift).type_as(h)
        return (h.float() + block.ffn(normed).float() * c_gate).type_as(h)
