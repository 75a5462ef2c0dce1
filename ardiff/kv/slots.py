"""What a local slot keeps from one block to the next (one block is in flight per slot):

    Slot.register_pages   the slot's register pages (the last pages of the storage), where
                          `ardiff::paged_attend` stores register tokens (the eager path
                          concatenates them as they come and stores none)
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
    """Register pages and the static indices of one local slot."""

    def __init__(self, register_pages: list[int], indices: StaticIndices) -> None:
        self.register_pages = register_pages
        self.indices = indices

    def forget(self) -> None:
        """Drop what the buffers were known to hold (their session is gone)."""
        self.indices.owner = None

