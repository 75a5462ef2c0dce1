"""A deterministic text encoder: UTF-8 bytes as tokens, an embedding and one mixing layer.

No vocabulary file and no download: the same prompt always gives the same
tokens, and different prompts give different embeddings.
"""

from __future__ import annotations

import torch
from torch import nn

PAD_TOKEN = 0
BYTE_VOCAB = 257  # 256 byte values shifted by one, and padding


def tokenize(prompt: str, num_tokens: int) -> torch.Tensor:
    """Prompt -> [num_tokens] token ids (bytes + 1), truncated or padded with PAD_TOKEN."""
    ids = [b + 1 for b in prompt.encode("utf-8")][:num_tokens]
    return torch.tensor(ids + [PAD_TOKEN] * (num_tokens - len(ids)), dtype=torch.long)


class TextEncoder(nn.Module):
    """[num_tokens] ids -> [num_tokens, dim] embeddings with learned positions."""

    def __init__(self, dim: int, num_tokens: int) -> None:
        super().__init__()
        self.num_tokens = num_tokens
        self.embed = nn.Embedding(BYTE_VOCAB, dim)
        self.position = nn.Parameter(torch.randn(num_tokens, dim) * 0.1)
        self.mix = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(approximate="tanh"))

    def forward(self, prompt: str) -> torch.Tensor:
        ids = tokenize(prompt, self.num_tokens).to(self.position.device)
        h = self.embed(ids) + self.position
        return h + self.mix(h)
