"""What a local slot keeps from one block to the next (one block is in flight per slot):

    Slot.register_pages   the slot's register pages (the last pages of the storage)
    Slot.held             per layer, the register tensors those pages hold now
    Slot.indices          static index buffers `ardiff::paged_attend` reads, updated in place

    write buffer  [ block tokens        | register tokens (max) ]     write(n) = first b + n
    read buffer   [ history | block     | register tokens (max) ]     read(n)  = first h + b + n

Registers come last in both, so n registers are a prefix. A window-full block has the same
h and b block after block, so its index views keep one address and one shape: the tensors a
CUDA graph captured stay valid while the buffers are rewritten for each new block.
"""

from __future__ import annotations

import torch

from ardiff.kv.address import TokenAddress


class StaticIndices:
    """One slot's write and read index buffers, sized for a window-full block."""

    def __init__(self, max_write_tokens: int, max_read_tokens: int,
                 device: torch.device) -> None:
        self.write = torch.zeros(max_write_tokens, dtype=torch.long, device=device)
        self.read = torch.zeros(max_read_tokens, dtype=torch.long, device=device)
        self.owner: object | None = None   # the address whose indices the buffers hold
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def load(self, owner: object, block: TokenAddress, history_block: TokenAddress,
             registers: TokenAddress) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Write `owner`'s indices into the buffers (in place; nothing if they hold them
        already) and return its (write, read) index views per register count."""
        if self.owner is not owner:
            b, h_b, r = block.num_tokens, history_block.num_tokens, registers.num_tokens
            self.write[:b].copy_(block.index)
            self.write[b:b + r].copy_(registers.index)
            self.read[:h_b].copy_(history_block.index)
            self.read[h_b:h_b + r].copy_(registers.index)
            self.views = {n: (self.write[:b + n], self.read[:h_b + n]) for n in range(r + 1)}
            self.owner = owner
        return self.views


class Slot:
    """Register pages, the register tensors they hold per layer, and the static indices."""

    def __init__(self, register_pages: list[int], num_layers: int,
                 indices: StaticIndices) -> None:
        self.register_pages = register_pages
        self.held: list[tuple | None] = [None] * num_layers  # see `hold`
        self.indices = indices

    def holds(self, layer: int, extra_k: torch.Tensor, extra_v: torch.Tensor) -> bool:
        """Whether the register pages hold these tensors for `layer`: the same memory,
        count and strides (dtype and head shape are checked by `attend`), and, where torch
        tracks one (not for inference tensors), the same version. Held tensors stay
        referenced, so no other tensor can take their memory meanwhile."""
        held = self.held[layer]
        return (held is not None and held[0] == extra_k.data_ptr()
                and held[1] == extra_v.data_ptr() and held[2] == extra_k.shape[0]
                and held[3] == extra_k.stride() and held[4] == extra_v.stride()
                and (held[5] is None or held[5] == extra_k._version)
                and (held[6] is None or held[6] == extra_v._version))

    def hold(self, layer: int, extra_k: torch.Tensor, extra_v: torch.Tensor) -> None:
        """Record that the register pages of `layer` now hold these tensors."""
        self.held[layer] = (extra_k.data_ptr(), extra_v.data_ptr(), extra_k.shape[0],
                            extra_k.stride(), extra_v.stride(), _version(extra_k),
                            _version(extra_v), extra_k, extra_v)

    def forget(self) -> None:
        """Drop what the register pages were known to hold (their session is gone)."""
        self.held = [None] * len(self.held)
        self.indices.owner = None


def _version(t: torch.Tensor) -> int | None:
    """The in-place version counter, or None for an inference tensor (it has none)."""
    return None if t.is_inference() else t._version
