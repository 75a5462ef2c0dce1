"""Attention over gathered K/V: `scaled_dot_product_attention`, no mask inside the block."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           scale: float | None = None) -> torch.Tensor:
    """Full (unmasked) attention of q to k/v, GQA allowed.

    q: [q_tokens, q_heads, head_size]; k, v: [kv_tokens, kv_heads, head_size]
    with q_heads a multiple of kv_heads. Returns [q_tokens, q_heads, head_size].
    """
    q4 = q.transpose(0, 1).unsqueeze(0)  # [1, q_heads, q_tokens, head_size]
    k4 = k.transpose(0, 1).unsqueeze(0)  # [1, kv_heads, kv_tokens, head_size]
    v4 = v.transpose(0, 1).unsqueeze(0)
    out = F.scaled_dot_product_attention(q4, k4, v4, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)  # [q_tokens, q_heads, head_size]


def attend_stacked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   scale: float | None = None) -> torch.Tensor:
    """`attend` for B rows of equal key count, in one call: row i of q attends to row i of
    k/v only. q: [B, q_tokens, q_heads, hs]; k, v: [B, kv_tokens, kv_heads, hs]. Returns
    [B, q_tokens, q_heads, hs], each row equal to `attend` of that row (within the bounds across kernels: another
    batch size may take another kernel)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), scale=scale,
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)  # [B, q_tokens, q_heads, head_size]
