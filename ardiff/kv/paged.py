"""The paged KV cache: plan + page pool + page storage + per-branch page tables.

    pool pages:  [ history of session A | history of B | ... | free ]
    a block:     allocate in-flight pages -> attend writes k/v there ->
                 commit hands them to the page table (no copy), the window
                 evicts whole pages back to the pool; a probe gives them back.
    a recache:   the same in-flight pages -> attend writes the kept frames'
                 new k/v there -> the table swaps them in for those frames
                 and their old pages go back to the pool (abort: the new ones).

The pool holds exactly the plan's `total_pages`; with nothing resident and no
block open, every page is free.
"""

from __future__ import annotations

import torch

from ardiff.errors import KVStateError
from ardiff.kv import attention
from ardiff.kv.address import TokenAddress
from ardiff.kv.backend import CacheStats, KVCacheBase
from ardiff.kv.plan import KVPlan
from ardiff.kv.pool import PagePool
from ardiff.kv.storage import PagedStorage
from ardiff.kv.table import FramePages, PageTable
from ardiff.kv.window import WindowPolicy


class PagedKVCache(KVCacheBase):
    """Sessions over a fixed pool of pages sized by the plan."""

    backend_name = "paged"

    def __init__(self, plan: KVPlan, device: str | torch.device = "cpu",
                 poison: bool = False) -> None:
        super().__init__(plan, device)
        self.pool = PagePool(plan.total_pages)
        self.storage = PagedStorage(plan, self.device, poison)
        self.policy = WindowPolicy.from_spec(plan.spec)

    def new_branch(self, session_id: str, name: str) -> PagedBranch:
        return PagedBranch(self, PageTable(self.policy))

    def release_branch(self, branch: PagedBranch) -> None:
        self.free_pages(branch.table.release())

    def allocate_pages(self, num: int, what: str) -> list[int]:
        page_ids = self.pool.allocate(num)
        if page_ids is None:
            raise KVStateError(f"page pool exhausted allocating {num} {what} pages "
                               f"({self.pool.num_free} free of {self.pool.num_pages}); "
                               f"more sessions or blocks are open than the plan allows")
        return page_ids

    def free_pages(self, page_ids: list[int]) -> None:
        self.pool.free(page_ids)
        self.storage.poison(page_ids)

    def stats(self) -> CacheStats:
        return CacheStats("paged", self.pool.num_pages, self.pool.num_used, self.pool.peak_used,
                          self.storage.nbytes, self.cross.nbytes, len(self._sessions))


class PagedBranch:
    """One branch of one session: its page table."""

    def __init__(self, cache: PagedKVCache, table: PageTable) -> None:
        self.cache, self.table = cache, table
        self._read: tuple[tuple, TokenAddress] | None = None  # (key, address) of the last block

    @property
    def num_committed_frames(self) -> int:
        return self.table.num_committed_frames

    @property
    def kept_frames(self) -> list[int]:
        return self.table.visible_frames

    def read_address(self, block_frames: list[FramePages],
                     before: int | None = None) -> TokenAddress:
        """Where a block reads: [visible history (the kept frames before `before`, if set) |
        the block]. Rebuilt only when the table, `before` or the block's pages changed, so
        the probes and the commit of one block share it."""
        key = (self.table.version, before, tuple(block_frames))
        if self._read is None or self._read[0] != key:
            storage = self.cache.storage
            history = self.table.visible_pages if before is None else \
                self.table.frames_before(before)
            address = storage.frames_address(history).concat(
                storage.frames_address(block_frames))
            self._read = (key, address)
        return self._read[1]

    def begin(self, num_frames: int) -> PagedBlock:
        return PagedBlock(self, num_frames)

    def begin_recache(self, start_frame: int, num_frames: int) -> PagedBlock:
        return PagedBlock(self, num_frames, recache_at=start_frame)


class PagedBlock:
    """A block in flight: its pages, and the storage addresses it writes and reads through.

    With `recache_at` set it re-commits kept frames `recache_at, ...` instead of appending:
    it sees the kept frames before them, and its commit swaps its pages in for theirs."""

    def __init__(self, branch: PagedBranch, num_frames: int,
                 recache_at: int | None = None) -> None:
        cache, plan = branch.cache, branch.cache.plan
        self.cache, self.table, self.storage = cache, branch.table, cache.storage
        self.recache_at = recache_at
        kept = branch.table.visible_frames
        if recache_at is None:
            self.start_frame, self.visible_frames = branch.table.num_committed_frames, kept
        else:
            self.start_frame = recache_at
            self.visible_frames = [index for index in kept if index < recache_at]
        ppf = plan.pages_per_frame
        pages = cache.allocate_pages(num_frames * ppf + plan.register_pages_per_branch,
                                     "in-flight and register")  # one all-or-nothing call
        self.frames: list[FramePages] = [tuple(pages[i * ppf:(i + 1) * ppf])
                                         for i in range(num_frames)]
        self.register_pages = pages[num_frames * ppf:]
        self.block_address = self.storage.frames_address(self.frames)
        # [visible history tokens | this block's tokens]: built once, read by every attend.
        self.kv_address = branch.read_address(self.frames, recache_at)
        self._registers: dict[int, TokenAddress] = {}  # register count -> address
        self._done = False

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
               scale: float | None) -> torch.Tensor:
        self.storage.write(layer, self.block_address, k, v)
        registers = None
        if extra_k is not None:
            registers = self._registers_address(extra_k.shape[0])
            self.storage.write(layer, registers, extra_k, extra_v)
        keys, values = self.storage.read(layer, self.kv_address, registers)
        return attention.attend(q, keys, values, scale)

    def _registers_address(self, num_tokens: int) -> TokenAddress:
        if num_tokens not in self._registers:
            self._registers[num_tokens] = self.storage.registers_address(self.register_pages,
                                                                         num_tokens)
        return self._registers[num_tokens]

    def commit(self) -> None:
        """Hand the in-flight pages to the table; free what the window evicts (a recache:
        the recached frames' old pages)."""
        if self.recache_at is None:
            self._finish(self.table.commit(self.frames))
        else:
            self._finish(self.table.replace(self.recache_at, self.frames))

    def abort(self) -> None:
        """Commit nothing: every in-flight page goes back to the pool."""
        self._finish([page for pages in self.frames for page in pages])

    def _finish(self, page_ids: list[int]) -> None:
        assert not self._done, "a block is finished once"
        self._done = True
        self.cache.free_pages(page_ids + self.register_pages)

