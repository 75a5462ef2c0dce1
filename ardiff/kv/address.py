"""Where tokens live in the flat page storage, in the two forms the copies need.

    frame f on pages (7, 2), page_tokens 4, tokens_per_frame 6:
      flat storage  ... | page 2: t4 t5 .  .  | ... | page 7: t0 t1 t2 t3 | ...
      index         [28, 29, 30, 31, 8, 9]          (one id per token)
      runs          ((28, 4), (8, 2))               (contiguous stretches)

A gather through `index` is one `index_select`; through `runs` it is one
memcpy-like slice copy per stretch. Per-token indexing is cheap for tiny
frames but several times slower than slice copies when a stretch is
megabytes (a Wan-sized frame), so storage picks by stretch size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

Runs = tuple[tuple[int, int], ...]  # (first flat token id, length) per contiguous stretch


@dataclass(frozen=True)
class TokenAddress:
    index: torch.Tensor  # [tokens] flat token ids
    runs: Runs           # merged where adjacent

    @property
    def num_tokens(self) -> int:
        return self.index.numel()

    @functools.cached_property
    def tokens_per_run(self) -> float:
        return self.num_tokens / max(1, len(self.runs))

    def concat(self, other: TokenAddress) -> TokenAddress:
        return TokenAddress(torch.cat([self.index, other.index]), _merge(self.runs + other.runs))


def _merge(runs: Runs) -> Runs:
    merged: list[tuple[int, int]] = []
    for start, length in runs:
        if merged and merged[-1][0] + merged[-1][1] == start:
            merged[-1] = (merged[-1][0], merged[-1][1] + length)
        elif length:
            merged.append((start, length))
    return tuple(merged)


def frames_address(frames: list[tuple[int, ...]], page_tokens: int, tokens_per_frame: int,
                   device: torch.device) -> TokenAddress:
    """The valid tokens of `frames` (each a tuple of page ids), in order."""
    runs = []
    for pages in frames:
        remaining = tokens_per_frame
        for page in pages:
            length = min(page_tokens, remaining)
            runs.append((page * page_tokens, length))
            remaining -= length
    return _from_runs(runs, device)


def pages_address(page_ids: list[int], num_tokens: int, page_tokens: int,
                  device: torch.device) -> TokenAddress:
    """The first `num_tokens` tokens laid over consecutive `page_ids` (register tokens)."""
    runs, remaining = [], num_tokens
    for page in page_ids:
        length = min(page_tokens, remaining)
        runs.append((page * page_tokens, length))
        remaining -= length
    assert remaining <= 0, "register pages hold max_scratch_tokens_per_branch tokens"
    return _from_runs(runs, device)


def _from_runs(runs: list[tuple[int, int]], device: torch.device) -> TokenAddress:
    merged = _merge(tuple(runs))
    if not merged:
        return TokenAddress(torch.empty(0, dtype=torch.long, device=device), ())
    index = torch.cat([torch.arange(start, start + length) for start, length in merged])
    return TokenAddress(index.to(device), merged)
