"""Prompt encoding: the UMT5 encoder of Wan2.1, as Wan and Self-Forcing run it.

A prompt is tokenized to exactly `text_len` tokens (512 for Wan: truncated or padded),
encoded, and the padded positions are set to zero: UMT5 gives them non-zero states,
and the model was trained on zeros there. The result [1, text_len, text_dim] feeds the
transformer's text embedding once per prompt (its K/V live in the cross-attention cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ardiff.errors import PipelineLoadError

TOKENIZER_DIR = "tokenizer"
TEXT_ENCODER_DIR = "text_encoder"


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

    @classmethod
    def load(cls, model_dir: Path, text_len: int, device: torch.device,
             dtype: torch.dtype) -> PromptEncoder:
        """From the local folder only (no hub access)."""
        from transformers import AutoTokenizer, UMT5EncoderModel

        tokenizer = AutoTokenizer.from_pretrained(check_folder(model_dir, TOKENIZER_DIR),
                                                  local_files_only=True)
        encoder = UMT5EncoderModel.from_pretrained(check_folder(model_dir, TEXT_ENCODER_DIR),
                                                   dtype=dtype, local_files_only=True)
        return cls(tokenizer, encoder.to(device).eval(), text_len)

    @torch.inference_mode()
    def encode(self, prompt: str) -> torch.Tensor:
        tokens = self.tokenizer([prompt], padding="max_length", max_length=self.text_len,
                                truncation=True, add_special_tokens=True,
                                return_attention_mask=True, return_tensors="pt")
        device = next(self.encoder.parameters()).device
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        states = self.encoder(ids, mask).last_hidden_state  # [1, text_len, text_dim]
        return states.masked_fill(mask[..., None] == 0, 0.0)
