"""The shipped pipelines declare their weights' bytes (#35: inspect-spec's fit counts them),
and what they declare before `load` is what `load` then holds."""

from __future__ import annotations

import pytest
import torch

from ardiff.pipelines.bouncing.pipeline import BouncingWorld
from ardiff.pipelines.tiny_dit.pipeline import TinyCausalDiT


def loaded_bytes(*modules: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_dit_declares_what_it_loads(dtype):
    pipeline = TinyCausalDiT()
    declared = pipeline.weight_bytes(dtype)
    pipeline.load("cpu", getattr(torch, dtype))
    assert declared == {"transformer": loaded_bytes(pipeline.model),
                        "decoder": loaded_bytes(pipeline.decoder)}


def test_the_bouncing_model_declares_what_it_loads():
    pipeline = BouncingWorld()
    declared = pipeline.weight_bytes("float32")
    pipeline.load("cpu", torch.float32)
    assert declared == {"model": loaded_bytes(pipeline.model)} and declared["model"] > 0
