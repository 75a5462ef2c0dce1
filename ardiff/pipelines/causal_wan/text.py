"""Prompt encoding: the UMT5 encoder of Wan2.1, as Wan and Self-Forcing run it.

A prompt is tokenized to exactly `text_len` tokens (512 for Wan: truncated or padded),
encoded, and the padded positions are set to zero: UMT5 gives them non-zero states,
and the model was trained on zeros there. The result [1, text_len, text_dim] feeds the
transformer's text embedding once per prompt (its K/V live in the cross-attention cache).
The encoder may live on another device than the transformer (`text_encoder_device: cpu`):
the last `CACHED_PROMPTS` prompts' states are kept where it made them, so a prompt costs
one encode however many sessions, branches or switches use it.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from ardiff.errors import PipelineLoadError
from ardiff.pipelines.causal_wan.layouts import (
    WAN,
    WAN_T5_FILE,
    WAN_TOKENIZER,
    detect_layout,
    existing,
)
from ardiff.pipelines.causal_wan.prompt_clean import clean_prompt
from ardiff.pipelines.causal_wan.umt5 import load_wan_t5

TOKENIZER_DIR = "tokenizer"
TEXT_ENCODER_DIR = "text_encoder"
# Prompts whose states are kept (4 MiB each for UMT5-XXL in bfloat16): enough for a CFG
# negative prompt, the prompts of a batch's sessions and a switch back to an earlier prompt.
CACHED_PROMPTS = 16


def check_folder(model_dir: Path, name: str) -> Path:
    """`model_dir / name`, or a one-line error naming the missing path."""
    path = model_dir / name
    if not path.is_dir():
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} does not exist; the "
                                f"diffusers layout has transformer/, vae/, text_encoder/ and "
                                f"tokenizer/")
    return path


class PromptEncoder:
    """Tokenizer + `UMT5EncoderModel`; `encode(prompt)` -> [1, text_len, text_dim]."""

    def __init__(self, tokenizer: Any, encoder: Any, text_len: int) -> None:
        self.tokenizer, self.encoder, self.text_len = tokenizer, encoder, text_len
        self._states: OrderedDict[str, torch.Tensor] = OrderedDict()  # prompt -> states, LRU

    @classmethod
    def load(cls, model_dir: Path, text_len: int, device: torch.device,
             dtype: torch.dtype) -> PromptEncoder:
        """From the local folder only (no hub access), in either layout (layouts.py)."""
        from transformers import AutoTokenizer, UMT5EncoderModel

        if detect_layout(model_dir) == WAN:  # Wan's .pth in UMT5's names (umt5.py)
            tokenizer_dir = existing(model_dir, WAN, WAN_TOKENIZER)
            encoder = load_wan_t5(existing(model_dir, WAN, WAN_T5_FILE), dtype)
        else:
            tokenizer_dir = check_folder(model_dir, TOKENIZER_DIR)
            encoder = UMT5EncoderModel.from_pretrained(check_folder(model_dir, TEXT_ENCODER_DIR),
                                                       dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        return cls(tokenizer, encoder.to(device).eval(), text_len)

    def encode(self, prompt: str) -> torch.Tensor:
        """[1, text_len, text_dim] on the encoder's device; a recent prompt's from the cache
        (callers must not change it in place)."""
        states = self._states.get(prompt)
        if states is None:
            states = self._states[prompt] = self._encode(prompt)
            if len(self._states) > CACHED_PROMPTS:
                self._states.popitem(last=False)
        self._states.move_to_end(prompt)
        return states

    @torch.inference_mode()
    def _encode(self, prompt: str) -> torch.Tensor:
        prompt = clean_prompt(prompt)  # as Wan cleans it (prompt_clean.py)
        tokens = self.tokenizer([prompt], padding="max_length", max_length=self.text_len,
                                truncation=True, add_special_tokens=True,
                                return_attention_mask=True, return_tensors="pt")
        device = next(self.encoder.parameters()).device
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        states = self.encoder(ids, mask).last_hidden_state  # [1, text_len, text_dim]
        return states.masked_fill(mask[..., None] == 0, 0.0)
