"""Attention processors that route diffusers' `WanAttention` through ardiff's KV state.

`WanTransformerBlock` calls its attention with positional arguments only, so the KV block
and the text K/V travel in an `AttentionBinding` the pipeline fills for one forward, shared
by every layer's pair of processors (each holding its layer index):

    self-attention   q, k, v projections -> qk RMS-norm -> RoPE -> blk.attend(layer, q, k, v)
    cross-attention  q projection -> qk RMS-norm on q -> attend to the cached text (k, v)

A processor called with nothing bound raises: it never falls back to its own input.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ardiff.errors import KVStateError
from ardiff.kv.attention import attend

CrossLayers = list  # one (k, v) per layer, each [text_len, heads, head_size]


class AttentionBinding:
    """The KV block and the text K/V the processors of one forward attend through."""

    def __init__(self) -> None:
        self.block: Any | None = None
        self.cross: CrossLayers | None = None

    @contextlib.contextmanager
    def bound(self, block: Any, cross: CrossLayers) -> Iterator[None]:
        """Bind one branch's block and text K/V for one forward; unbound again after it."""
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

    def get_cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cross is None:
            raise KVStateError(f"causal-wan: cross-attention of layer {layer} ran with no text "
                               f"K/V bound; run the transformer through CausalWan."
                               f"generate_block (inside bind_ar_diffusion_state)")
        return self.cross[layer]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' Wan RoPE on interleaved pairs: x [1, tokens, heads, hs], cos/sin
    [1, tokens, 1, hs] (each pair's angle repeated twice)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def _heads(attn: Any, x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(2, (attn.heads, -1))  # [1, tokens, heads, head_size]


def _project_out(attn: Any, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = out.unsqueeze(0).flatten(2, 3).type_as(like)  # [1, tokens, heads * head_size]
    return attn.to_out[1](attn.to_out[0](out))


def _check_batch(hidden_states: torch.Tensor) -> None:
    if hidden_states.shape[0] != 1:
        raise KVStateError(f"causal-wan: a forward carries one branch of one session (batch "
                           f"1), got batch {hidden_states.shape[0]}")


class SelfAttentionProcessor:
    """Self-attention of one layer through `blk.attend` (history | this block)."""

    def __init__(self, layer: int, binding: AttentionBinding) -> None:
        self.layer, self.binding = layer, binding

    def __call__(self, attn: Any, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        blk = self.binding.get_block(self.layer)
        _check_batch(hidden_states)
        q = _heads(attn, attn.norm_q(attn.to_q(hidden_states)))
        k = _heads(attn, attn.norm_k(attn.to_k(hidden_states)))
        v = _heads(attn, attn.to_v(hidden_states))
        q, k = rotate(q, *rotary_emb), rotate(k, *rotary_emb)
        out = blk.attend(self.layer, q[0], k[0], v[0])  # [tokens, heads, head_size]
        return _project_out(attn, out, q)


class CrossAttentionProcessor:
    """Cross-attention of one layer to the session's cached text K/V."""

    def __init__(self, layer: int, binding: AttentionBinding) -> None:
        self.layer, self.binding = layer, binding

    def __call__(self, attn: Any, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        k, v = self.binding.get_cross(self.layer)
        _check_batch(hidden_states)
        q = _heads(attn, attn.norm_q(attn.to_q(hidden_states)))
        return _project_out(attn, attend(q[0], k, v), q)


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
