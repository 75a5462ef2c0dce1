"""diffusers' `WanTransformer3DModel`, run one AR block at a time through the KV state.

`BlockTransformer.flow` walks the model's own submodules in the stock order (patch and
timestep embedding, the `WanTransformerBlock`s, output norm, projection, unpatchify) with
two changes a block-causal rollout needs:

    RoPE   the time rows of the rotary tables start at the block's `start_frame`;
           height / width rows start at 0
    text   cross-attention reads K/V made once per prompt (`text_kv`), kept in the
           session's "text" cross-attention cache

One timestep for the whole block, so the timestep embedding is one row.
"""

from __future__ import annotations

from typing import Any

import torch

from ardiff.pipelines.causal_wan.processors import AttentionBinding, install, text_kv


class BlockTransformer:
    """One `WanTransformer3DModel` plus the processors that attend through ardiff."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.binding = AttentionBinding()
        install(model, self.binding)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.patch_embedding.weight.dtype

    def text_kv(self, prompt_embeds: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the cross-attention (k, v) [text_len, heads, head_size] of a prompt's
        encoder states [1, text_len, text_dim]."""
        context = self.model.condition_embedder.text_embedder(prompt_embeds.to(self.dtype))
        return [text_kv(block.attn2, context) for block in self.model.blocks]

    def rope(self, start_frame: int, frames: int, rows: int,
             cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [1, frames * rows * cols, 1, head_size] for frames
        [start_frame, start_frame + frames) of a rows x cols token grid."""
        rope = self.model.rope
        sizes = [rope.t_dim, rope.h_dim, rope.w_dim]
        tables = []
        for table in (rope.freqs_cos, rope.freqs_sin):
            t, h, w = table.split(sizes, dim=1)
            grid = (frames, rows, cols)
            parts = [t[start_frame:start_frame + frames].view(frames, 1, 1, -1).expand(*grid, -1),
                     h[:rows].view(1, rows, 1, -1).expand(*grid, -1),
                     w[:cols].view(1, 1, cols, -1).expand(*grid, -1)]
            tables.append(torch.cat(parts, dim=-1).reshape(1, frames * rows * cols, 1, -1))
        return tables[0], tables[1]

    def time_embedding(self, timestep: float,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(temb [1, dim], modulation [1, 6, dim]) of one timestep, as the stock forward."""
        embedder = self.model.condition_embedder
        sinusoid = embedder.timesteps_proj(torch.tensor([timestep], device=device))
        sinusoid = sinusoid.to(next(embedder.time_embedder.parameters()).dtype)
        temb = embedder.time_embedder(sinusoid).to(self.dtype)
        return temb, embedder.time_proj(embedder.act_fn(temb)).unflatten(1, (6, -1))

    def flow(self, x: torch.Tensor, timestep: float, blk: Any,
             cross: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The model's flow prediction for one block x [1, C, F, h, w] at `timestep`, its
        self-attention through `blk` and its cross-attention to `cross`."""
        model = self.model
        _, p_h, p_w = model.config.patch_size
        _, _, frames, height, width = x.shape
        rows, cols = height // p_h, width // p_w
        rope = self.rope(blk.start_frame, frames, rows, cols)
        rope = (rope[0].to(x.device), rope[1].to(x.device))
        temb, modulation = self.time_embedding(timestep, x.device)
        h = model.patch_embedding(x.to(self.dtype)).flatten(2).transpose(1, 2).contiguous()
        with self.binding.bound(blk, cross):
            for block in model.blocks:
                h = block(h, None, modulation, rope)  # [1, tokens, dim]
        shift, scale = (model.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        h = (model.norm_out(h.float()) * (1 + scale) + shift).type_as(h)
        h = model.proj_out(h)
        return self._unpatchify(h, frames, rows, cols)

    def _unpatchify(self, h: torch.Tensor, frames: int, rows: int, cols: int) -> torch.Tensor:
        """[1, tokens, C * p_t * p_h * p_w] -> [1, C, F, h, w] (the stock forward's reshape)."""
        p_t, p_h, p_w = self.model.config.patch_size
        h = h.reshape(1, frames, rows, cols, p_t, p_h, p_w, -1)
        h = h.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return h.flatten(6, 7).flatten(4, 5).flatten(2, 3)
