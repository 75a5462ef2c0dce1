"""Page storage: per-layer K and V pools, indexed by page id.

    k[layer]: [num_pages, page_tokens, num_kv_heads, head_size]   (v likewise, a separate tensor)

A frame starts on a fresh page and fills `pages_per_frame` pages; the tail of
its last page is never read. Readers and writers address tokens through a
flat index (`page_id * page_tokens + offset`) built by `frame_token_index`.
"""

from __future__ import annotations

import torch

from ardiff.kv.plan import KVPlan

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PagedStorage:
    """The K/V tensors of every page. Only the cache writes page ids into it."""

    def __init__(self, plan: KVPlan, device: torch.device, poison: bool = False) -> None:
        spec = plan.spec
        self.page_tokens = plan.page_tokens
        self.tokens_per_frame = spec.tokens_per_frame
        self.poison_enabled = poison
        self.dtype = TORCH_DTYPES[plan.dtype]
        self.device = torch.device(device)
        shape = (plan.total_pages, plan.page_tokens, spec.num_kv_heads, spec.head_size)
        fill = torch.full if poison else (lambda size, _value, **kw: torch.empty(size, **kw))
        make = lambda: fill(shape, float("nan"), dtype=self.dtype, device=self.device)  # noqa: E731
        self.k = [make() for _ in range(spec.num_layers)]
        self.v = [make() for _ in range(spec.num_layers)]
        token = torch.arange(spec.tokens_per_frame, device=self.device)
        self._page_slot = token // plan.page_tokens   # which of the frame's pages holds token t
        self._offset = token % plan.page_tokens       # where in that page

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def frame_token_index(self, frames: list[tuple[int, ...]]) -> torch.Tensor:
        """Flat token index of the valid tokens of `frames` (each a tuple of page ids)."""
        if not frames:
            return torch.empty(0, dtype=torch.long, device=self.device)
        ids = torch.tensor(frames, dtype=torch.long, device=self.device)  # [frames, pages_per_frame]
        return (ids[:, self._page_slot] * self.page_tokens + self._offset).reshape(-1)

    def page_token_index(self, page_ids: list[int], num_tokens: int) -> torch.Tensor:
        """Flat index of the first `num_tokens` tokens laid over consecutive `page_ids`."""
        token = torch.arange(num_tokens, device=self.device)
        ids = torch.tensor(page_ids, dtype=torch.long, device=self.device)
        return ids[token // self.page_tokens] * self.page_tokens + token % self.page_tokens

    def _flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.k[layer], self.v[layer]
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])  # [pages*page_tokens, heads, hs]

    def write(self, layer: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V `[len(index), heads, head_size]` at flat token `index`."""
        flat_k, flat_v = self._flat(layer)
        flat_k.index_copy_(0, index, k)
        flat_v.index_copy_(0, index, v)

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V `[len(index), heads, head_size]` read from flat token `index`."""
        flat_k, flat_v = self._flat(layer)
        return flat_k.index_select(0, index), flat_v.index_select(0, index)

    def poison(self, page_ids: list[int]) -> None:
        """Fill pages with NaN (poison mode only), so a read of a freed page shows."""
        if not self.poison_enabled or not page_ids:
            return
        ids = torch.tensor(page_ids, dtype=torch.long, device=self.device)
        for tensor in (*self.k, *self.v):
            tensor.index_fill_(0, ids, float("nan"))
