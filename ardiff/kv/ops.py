"""Attention over the paged cache as a torch custom op, so a compiled layer stack keeps it
whole: `torch.compile` sees one opaque call over tensors, not ardiff's Python.

    ardiff::paged_attend(q, k, v, k_cache, v_cache, write_index, read_index, scale,
                         kernel_name) -> out
        k_cache, v_cache: [pages * page_tokens, kv_heads, head_size]   one layer's storage
        write_index: [n]   flat token ids where k, v [n, kv_heads, hs] are stored (mutated)
        read_index:  [m]   flat token ids attention reads: [history | block | registers]
        kernel_name: the name of the cache's attention kernel (ardiff.kv.kernels); not
                 `kernel`, which inductor passes to a fallback op itself
        out: [q_tokens, q_heads, head_size]

Every shape is fixed by the block (its frames, the history it sees, its register count),
so a window-full block has the same metadata shapes block after block: its index tensors
can live in static buffers updated in place (what a CUDA graph needs). The eager runtime
does not go through the op (a custom op's dispatch costs more than the copies it makes on a
small model); `PagedBlock.attend` computes the same thing directly.
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
def _paged_attend_fake(q, k, v, k_cache, v_cache, write_index, read_index, scale=None,
                       kernel_name="sdpa"):
    return torch.empty_like(q, memory_format=torch.contiguous_format)
