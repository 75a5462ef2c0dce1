"""diffusers' `WanTransformer3DModel`, run one AR block at a time through the KV state.

`BlockTransformer.flow_rows` walks the model's own submodules in the stock order (patch and
timestep embedding, the `WanTransformerBlock`s, output norm, projection, unpatchify) for B
sessions' blocks at once, with two changes a block-causal rollout needs:

    RoPE   the time rows of each row's rotary tables start at that row's `start_frame`
           (rows at different positions side by side); height / width rows start at 0
    text   cross-attention reads K/V made once per prompt (`text_kv`), kept in each
           session's "text" cross-attention cache: row i reads its own session's pair

    x [B, C, F, h, w] -> patches [B, F*rows*cols, dim] -> blocks (self-attention through
    blk.attend, row i to its own session's history) -> flow [B, C, F, h, w]

One timestep per row (the same one for every row: one embedding row, broadcast).
`flow(x, t, blk, cross)` is one session's block: `flow_rows` over a batch of one. A row of
`flow_rows` equals that row alone within the bounds across kernels (docs/development.md,
numerics): another batch size may take another kernel. The patch convolution, which sums
in another order for a batch on every CPU, runs row by row.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ardiff.pipelines.causal_wan.processors import AttentionBinding, install, text_kv
from ardiff.pipelines.shared.rows import OneRowBlock

CrossLayers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v) [text_len, heads, hs]
RowsCross = list[tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]]  # per layer, per row


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

    def rope_rows(self, start_frames: Sequence[int], frames: int, rows: int, cols: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, frames * rows * cols, 1, head_size], row i at start_frames[i]
        ([1, ...] when every row starts at the same frame: broadcast)."""
        tables = {start: self.rope(start, frames, rows, cols) for start in start_frames}
        if len(tables) == 1:
            cos, sin = next(iter(tables.values()))
        else:
            cos = torch.cat([tables[start][0] for start in start_frames])
            sin = torch.cat([tables[start][1] for start in start_frames])
        return cos.to(device), sin.to(device)

    def time_embedding(self, timestep: float | Sequence[float],
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(temb [n, dim], modulation [n, 6, dim]) of one timestep (n = 1) or one per row,
        as the stock forward."""
        steps = [timestep] if isinstance(timestep, (int, float)) else list(timestep)
        embedder = self.model.condition_embedder
        sinusoid = embedder.timesteps_proj(torch.tensor(steps, device=device))
        sinusoid = sinusoid.to(next(embedder.time_embedder.parameters()).dtype)
        temb = embedder.time_embedder(sinusoid).to(self.dtype)
        return temb, embedder.time_proj(embedder.act_fn(temb)).unflatten(1, (6, -1))

    def flow(self, x: torch.Tensor, timestep: float, blk: Any,
             cross: CrossLayers) -> torch.Tensor:
        """The model's flow prediction for one session's block x [1, C, F, h, w] at
        `timestep`, its self-attention through `blk` (an `ARDiffusionKVBlock`) and its
        cross-attention to `cross` (per layer (k, v) [text_len, heads, hs])."""
        return self.flow_rows(x, timestep, OneRowBlock(blk), [([k], [v]) for k, v in cross])

    def flow_rows(self, x: torch.Tensor, timesteps: float | Sequence[float], blk: Any,
                  cross: RowsCross) -> torch.Tensor:
        """The flow prediction for B sessions' blocks x [B, C, F, h, w]: self-attention
        through `blk` (an `ARDiffusionKVBatchBlock`, row i at blk.start_frames[i]),
        cross-attention to `cross` (per layer (keys, values): row i's [text_len, heads, hs]),
        at one timestep for all rows or one per row. Returns [B, C, F, h, w]."""
        model = self.model
        _, p_h, p_w = model.config.patch_size
        _, _, frames, height, width = x.shape
        rows, cols = height // p_h, width // p_w
        rope = self.rope_rows(blk.start_frames, frames, rows, cols, x.device)
        if not isinstance(timesteps, (int, float)) and len(set(timesteps)) == 1:
            timesteps = timesteps[0]  # one row of embedding, broadcast over the batch
        temb, modulation = self.time_embedding(timesteps, x.device)
        h = self._patches(x.to(self.dtype))  # [B, tokens, dim]
        with self.binding.bound(blk, cross):
            for block in model.blocks:
                h = block(h, None, modulation, rope)  # [B, tokens, dim]
        shift, scale = (model.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        h = (model.norm_out(h.float()) * (1 + scale) + shift).type_as(h)
        h = model.proj_out(h)
        return self._unpatchify(h, frames, rows, cols)

    def _patches(self, x: torch.Tensor) -> torch.Tensor:
        """The patch embedding [B, tokens, dim] of x [B, C, F, h, w], row by row: a batched
        convolution may sum in another order than one row's (CPU: it does), and this one
        is a small part of the forward."""
        rows = [self.model.patch_embedding(x[row:row + 1]) for row in range(x.shape[0])]
        h = rows[0] if len(rows) == 1 else torch.cat(rows)
        return h.flatten(2).transpose(1, 2).contiguous()

    def _unpatchify(self, h: torch.Tensor, frames: int, rows: int, cols: int) -> torch.Tensor:
        """[B, tokens, C * p_t * p_h * p_w] -> [B, C, F, h, w] (the stock forward's reshape)."""
        p_t, p_h, p_w = self.model.config.patch_size
        h = h.reshape(h.shape[0], frames, rows, cols, p_t, p_h, p_w, -1)
        h = h.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return h.flatten(6, 7).flatten(4, 5).flatten(2, 3)
