"""The stock-diffusers reference the causal-Wan proofs compare against (needs diffusers:
import it after `pytest.importorskip("diffusers")`)."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor


class MaskedAttention(WanAttnProcessor):
    """diffusers' own attention processor, with a fixed attention mask (True = may attend)."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.mask = mask

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        return super().__call__(attn, hidden_states, encoder_hidden_states, self.mask,
                                rotary_emb)
