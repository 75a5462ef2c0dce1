"""Attention over the paged cache as one torch custom op, so a compiled layer stack keeps
it whole (`torch.compile` sees one opaque call over tensors, not ardiff's Python):

    ardiff::paged_attend(q, k, v, k_cache, v_cache, write_index, read_index, scale,
                         kernel_name) -> out [q_tokens, q_heads, head_size]
        k_cache, v_cache   [pages * page_tokens, kv_heads, head_size]   one layer's storage
        write_index [n]    flat token ids where k, v [n, kv_heads, hs] are stored (mutated)
        read_index  [m]    flat token ids attention reads: [history | block | registers]
        kernel_name        the cache's kernel (ardiff.kv.kernels; `kernel` is inductor's)

Every shape is fixed by the block, so a window-full block's index tensors can live in
static buffers updated in place (what a CUDA graph needs). The eager runtime computes the
same in `PagedBlock.attend` (on a small model the op's dispatch costs more than its copies).
"""

from __future__ import annotations

import torch

from ardiff.kv import kernels


@torch.library.custom_op("ardiff::paged_attend", mutates_args=("k_cache", "v_cache"))
def paged_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, write_index: torch.Tensor, read_index: torch.Tensor,
                 scale: float | None = None, kernel_name: str = "sdpa") -> torch.Tensor:
    """Store k/v at `write_index`, then attend q to the tokens at `read_index`."""
    k_cache.index_copy_(0, write_index, k)
    v_cache.index_copy_(0, write_index, v)
    keys = k_cache.index_select(0, read_index)
    values = v_cache.index_select(0, read_index)
    return kernels.by_name(kernel_name)(q, keys, values, scale).contiguous()


@paged_attend.register_fake
def _paged_attend_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, write_index: torch.Tensor,
                       read_index: torch.Tensor, scale: float | None = None,
                       kernel_name: str = "sdpa") -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)
