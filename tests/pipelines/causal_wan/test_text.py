"""Prompt encoding: padded to text_len, and the padded positions are zero."""

from __future__ import annotations

import sys

import pytest
import torch
from extras import require_extra


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


# -- prompt cleaning (prompt_clean.py): Wan's basic_clean + whitespace_clean ----------------
CLEANED = [
    ("  a  cat &amp;amp; a \u201cdog\u201d\n", 'a cat & a "dog"'),   # HTML twice, curly quotes
    ("sch\u00c3\u00b6n caf\u00c3\u00a9", "sch\u00f6n caf\u00e9"),          # mojibake (ftfy)
    ("tabs\t\tand\u3000ideographic\u00a0nbsp\r\nlines", "tabs and ideographic nbsp lines"),
    ("&lt;b&gt; bold &amp;lt;i&amp;gt;", "<b> bold <i>"),
    ("already clean.", "already clean."),
]


def test_prompts_are_cleaned_as_wan_cleans_them():
    require_extra("wan")
    from ardiff.pipelines.causal_wan.prompt_clean import clean_prompt

    assert [clean_prompt(raw) for raw, _ in CLEANED] == [clean for _, clean in CLEANED]


def test_whitespace_is_the_regex_module_s_as_wan_uses_it():
    """Wan collapses `regex`'s \\s: Unicode White_Space, not U+001C..U+001F as stdlib's."""
    require_extra("wan")
    import regex

    from ardiff.pipelines.causal_wan.prompt_clean import WHITESPACE

    text = "".join(chr(c) for c in range(0x3100)) + "\u205f\ufeff\U0001f600"
    assert WHITESPACE.sub(" ", text) == regex.sub(r"\s+", " ", text)
    assert WHITESPACE.sub(" ", "a\x1cb") == "a\x1cb"


def test_the_encoder_tokenises_the_cleaned_prompt(tiny_pipeline):
    require_extra("wan")
    encoder = tiny_pipeline.prompt_encoder
    assert torch.equal(encoder.encode("  a \n cat &amp;amp; "), encoder.encode("a cat &"))
    raw = encoder.tokenizer(["  a \n cat &amp;amp; "]).input_ids  # what was tokenised before
    assert raw != encoder.tokenizer(["a cat &"]).input_ids
    assert tiny_pipeline.count_prompt_tokens(" a  cat ") == tiny_pipeline.count_prompt_tokens(
        "a cat")


def test_without_ftfy_cleaning_and_load_say_how_to_install_it(monkeypatch, tiny_args):
    from ardiff.errors import PipelineLoadError
    from ardiff.pipelines.causal_wan import CausalWan
    from ardiff.pipelines.causal_wan.prompt_clean import clean_prompt

    monkeypatch.setitem(sys.modules, "ftfy", None)  # importing it fails
    message = (r"^pipeline: causal-wan cleans every prompt with ftfy before tokenising, as Wan "
               r"does, and ftfy is not installed; pip install 'ardiff\[wan\]' \(or ftfy\)$")
    with pytest.raises(PipelineLoadError, match=message):
        clean_prompt("a cat")
    pipeline = CausalWan(**tiny_args)
    with pytest.raises(PipelineLoadError, match=message):
        pipeline.load("cpu", torch.float32)
    assert pipeline.transformer is None  # refused before any weights were read
