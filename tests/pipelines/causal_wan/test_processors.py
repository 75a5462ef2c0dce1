"""The attention processors refuse to run with nothing bound."""

from __future__ import annotations

import pytest
import torch

from ardiff.errors import KVStateError
from ardiff.pipelines.causal_wan.processors import (
    AttentionBinding,
    CrossAttentionProcessor,
    SelfAttentionProcessor,
)


def test_a_cross_processor_with_nothing_bound_raises_instead_of_self_attending(tiny_pipeline):
    attn = tiny_pipeline.transformer.model.blocks[0].attn2
    hidden = torch.randn(1, 5, 32)
    with pytest.raises(KVStateError, match=r"cross-attention of layer 0 ran with no text K/V "
                                           r"bound"):
        CrossAttentionProcessor(0, AttentionBinding())(attn, hidden, hidden)


def test_a_self_processor_with_nothing_bound_raises(tiny_pipeline):
    attn = tiny_pipeline.transformer.model.blocks[1].attn1
    with pytest.raises(KVStateError, match=r"self-attention of layer 1 ran with no KV block"):
        SelfAttentionProcessor(1, AttentionBinding())(attn, torch.randn(1, 5, 32))


def test_the_installed_model_cannot_be_run_outside_a_forward(tiny_pipeline):
    model = tiny_pipeline.transformer.model
    latents = torch.randn(1, 16, 3, 6, 8)
    with pytest.raises(KVStateError, match="no KV block bound"), torch.inference_mode():
        model(latents, torch.tensor([500.0]), torch.randn(1, 16, 32))
