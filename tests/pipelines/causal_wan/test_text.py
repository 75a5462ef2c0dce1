"""Prompt encoding: padded to text_len, and the padded positions are zero."""

from __future__ import annotations

import torch


def test_padding_is_zeroed_and_the_prompt_is_not(tiny_pipeline, tiny_args):
    encoder = tiny_pipeline.prompt_encoder
    tokens = encoder.tokenizer(["a cat"], add_special_tokens=True).input_ids[0]
    states = encoder.encode("a cat")
    assert states.shape == (1, tiny_args["text_len"], 32)
    assert torch.count_nonzero(states[0, len(tokens):]) == 0
    assert bool((states[0, :len(tokens)].abs().sum(-1) > 0).all())


def test_umt5_itself_gives_the_padding_non_zero_states(tiny_pipeline, tiny_args):
    """Why the zeroing is needed: the raw encoder output is not zero there."""
    encoder = tiny_pipeline.prompt_encoder
    batch = encoder.tokenizer(["a cat"], padding="max_length", max_length=tiny_args["text_len"],
                              return_tensors="pt")
    raw = encoder.encoder(batch.input_ids, batch.attention_mask).last_hidden_state
    assert torch.count_nonzero(raw[0, int(batch.attention_mask.sum()):]) > 0


def test_a_long_prompt_is_truncated_to_text_len(tiny_pipeline, tiny_args):
    states = tiny_pipeline.prompt_encoder.encode("a very long prompt " * 20)
    assert states.shape[1] == tiny_args["text_len"]
    assert bool((states[0].abs().sum(-1) > 0).all())
