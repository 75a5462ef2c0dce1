"""Attention processors that route diffusers' `WanAttention` through ardiff's KV state.

`WanTransformerBlock` calls its attention with positional arguments only, so the KV block
and the text K/V travel in an `AttentionBinding` the pipeline fills for one forward, shared
by every layer's pair of processors (each holding its layer index). A forward carries B
sessions' rows (B = 1 for one session): the block is an `ARDiffusionKVBatchBlock`, the text
K/V one pair per row (each session's own cache, stacked only for the layer that reads them).

    self-attention   q, k, v [B, tokens, heads, hs] projections -> qk RMS-norm -> RoPE (each
                     row at its own frames) -> blk.attend(layer, q, k, v): row i to its own
                     session's history + its own block
    cross-attention  q projection -> qk RMS-norm on q -> row i attends to its own prompt's
                     cached (k, v), each [text_len, heads, hs]

A processor called with nothing bound raises: it never falls back to its own input.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

from ardiff.errors import KVStateError
from ardiff.kv.attention import attend, attend_stacked

# Per layer (keys, values): one [text_len, heads, head_size] tensor per row of the forward.
CrossLayers = list


class AttentionBinding:
    """The batch block (`ARDiffusionKVBatchBlock`) and the per-row text K/V the processors
    of one forward attend through."""

    def __init__(self) -> None:
        self.block: Any | None = None
        self.cross: CrossLayers | None = None

    @contextlib.contextmanager
    def bound(self, block: Any, cross: CrossLayers) -> Iterator[None]:
        """Bind one branch's batch block and its rows' text K/V for one forward; unbound
        again after it."""
        if self.block is not None:
            raise KVStateError("causal-wan: a forward is already bound; forwards of one "
                               "pipeline do not nest")
        self.block, self.cross = block, cross
        try:
            yield
        finally:
            self.block, self.cross = None, None

    def get_block(self, layer: int) -> Any:
        if self.block is None:
            raise KVStateError(f"causal-wan: self-attention of layer {layer} ran with no KV "
                               f"block bound; run the transformer through CausalWan."
                               f"generate_block (inside bind_ar_diffusion_state)")
        return self.block

    def get_cross(self, layer: int) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
        if self.cross is None:
            raise KVStateError(f"causal-wan: cross-attention of layer {layer} ran with no text "
                               f"K/V bound; run the transformer through CausalWan."
                               f"generate_block (inside bind_ar_diffusion_state)")
        return self.cross[layer]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' Wan RoPE on interleaved pairs: x [B, tokens, heads, hs], cos/sin
    [B or 1, tokens, 1, hs] (each pair's angle repeated twice)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def _heads(attn: Any, x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(2, (attn.heads, -1))  # [B, tokens, heads, head_size]


def _project_out(attn: Any, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = out.flatten(2, 3).type_as(like)  # [B, tokens, heads * head_size]
    return attn.to_out[1](attn.to_out[0](out))


def _check_rows(layer: int, hidden_states: torch.Tensor, rows: int) -> None:
    if hidden_states.shape[0] != rows:
        raise KVStateError(f"causal-wan: layer {layer} got a batch of "
                           f"{hidden_states.shape[0]} rows, but the forward bound text K/V "
                           f"for {rows} sessions; one row per session of the batch")


def attend_text(q: torch.Tensor, keys: Sequence[torch.Tensor],
                values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Row i of q [B, tokens, heads, hs] attends to keys[i], values[i] [text_len, heads, hs]
    (one row: the single-session `attend`; several: stacked for this call only, so a batch
    never holds a copy of every layer's prompt K/V)."""
    if q.shape[0] == 1:
        return attend(q[0], keys[0], values[0])[None]
    return attend_stacked(q, torch.stack(list(keys)), torch.stack(list(values)))


class SelfAttentionProcessor:
    """Self-attention of one layer through `blk.attend` (history | this block)."""

    def __init__(self, layer: int, binding: AttentionBinding) -> None:
        self.layer, self.binding = layer, binding

    def __call__(self, attn: Any, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        blk = self.binding.get_block(self.layer)
        q = _heads(attn, attn.norm_q(attn.to_q(hidden_states)))
        k = _heads(attn, attn.norm_k(attn.to_k(hidden_states)))
        v = _heads(attn, attn.to_v(hidden_states))
        q, k = rotate(q, *rotary_emb), rotate(k, *rotary_emb)
        out = blk.attend(self.layer, q, k, v)  # [B, tokens, heads, head_size]
        return _project_out(attn, out, q)


class CrossAttentionProcessor:
    """Cross-attention of one layer, each row to its session's cached text K/V."""

    def __init__(self, layer: int, binding: AttentionBinding) -> None:
        self.layer, self.binding = layer, binding

    def __call__(self, attn: Any, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        keys, values = self.binding.get_cross(self.layer)
        _check_rows(self.layer, hidden_states, len(keys))
        q = _heads(attn, attn.norm_q(attn.to_q(hidden_states)))
        return _project_out(attn, attend_text(q, keys, values), q)


def text_kv(attn: Any, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's cross-attention K/V of the embedded text [1, L, dim]: [L, heads, hs] each."""
    k = _heads(attn, attn.norm_k(attn.to_k(context)))
    v = _heads(attn, attn.to_v(context))
    return k[0], v[0]


def install(model: Any, binding: AttentionBinding) -> None:
    """Give every layer of a `WanTransformer3DModel` its self- and cross-attention processor."""
    processors = {}
    for layer in range(len(model.blocks)):
        processors[f"blocks.{layer}.attn1.processor"] = SelfAttentionProcessor(layer, binding)
        processors[f"blocks.{layer}.attn2.processor"] = CrossAttentionProcessor(layer, binding)
    model.set_attn_processor(processors)
