"""The paged KV cache: plan + page pool + page storage + per-branch page tables.

    storage:    [ pool pages: history of A | history of B | in flight | free ][ registers ]
    a block:    allocate in-flight pages -> each attend reads [history | its k/v | registers]
                as one `torch.cat` of views (a commit's attend also writes its k/v to the
                in-flight pages) -> commit hands them to the page table, the window evicts
                whole pages to the pool; a probe writes nothing and gives them back
    a recache:  re-runs committed frames and copies the kept ones' new k/v into their pages
                at its commit (paged_recache.py)

The pool hands freed pages back last-first, so the next block gets the same pages and
its cached addresses and views hold. Registers are stored only by `ardiff::paged_attend`
(compiled), in fixed register pages per local slot (`ardiff.kv.slots`). The storage holds
exactly the plan's `total_pages`; with nothing resident every pool page is free.
"""

from __future__ import annotations

import torch

from ardiff.errors import KVStateError
from ardiff.kv import ops
from ardiff.kv.address import TokenAddress
from ardiff.kv.backend import CacheStats, KVCacheBase, RowKV
from ardiff.kv.paged_recache import PagedRecache
from ardiff.kv.plan import KVPlan
from ardiff.kv.pool import PagePool
from ardiff.kv.slots import Slot, StaticIndices
from ardiff.kv.storage import PagedStorage
from ardiff.kv.table import FramePages, PageTable
from ardiff.kv.window import WindowPolicy

# What a branch's read address is built from: (table version, block pages).
AddressKey = tuple[int, tuple[FramePages, ...]]


class PagedKVCache(KVCacheBase["PagedBranch"]):
    """Sessions over a fixed pool of pages sized by the plan."""

    backend_name = "paged"

    def __init__(self, plan: KVPlan, device: str | torch.device = "cpu",
                 poison: bool = False) -> None:
        super().__init__(plan, device)
        # Register pages are the last `register_pages` of the storage, a fixed set per local
        # slot (one block in flight per slot), so what a block stored there is still there
        # for the next block of the slot: registers are written once per AR block.
        self.pool = PagePool(plan.total_pages - plan.register_pages)
        self.storage = PagedStorage(plan, self.device, poison)
        self.policy = WindowPolicy.from_spec(plan.spec)
        self.max_registers = plan.spec.max_scratch_tokens_per_branch if plan.register_pages else 0
        self.slots = [self._new_slot(slot) for slot in range(plan.spec.num_local_kv_branches)]
        # Per layer, how far blocks' own k/v stores into in-flight pages moved the storage's
        # version counters (K, V): pages no table shows as history, so a history stamp
        # discounts them (None: storage made under inference_mode has no counters).
        self.inflight_writes: list[list[int]] | None = (
            None if self.storage.flat(0)[0].is_inference()
            else [[0, 0] for _ in range(plan.spec.num_layers)])

    def _new_slot(self, slot: int) -> Slot:
        plan, spec = self.plan, self.plan.spec
        per_slot = plan.register_pages_per_branch
        first = self.pool.num_pages + slot * per_slot
        block_tokens = spec.frames_per_block * spec.tokens_per_frame
        read_tokens = plan.history_frames_per_branch * spec.tokens_per_frame + block_tokens
        indices = StaticIndices(block_tokens + self.max_registers,
                                read_tokens + self.max_registers, self.device)
        return Slot(list(range(first, first + per_slot)), indices)

    def new_branch(self, session_id: str, name: str) -> PagedBranch:
        return PagedBranch(self, PageTable(self.policy), self.slots[self.branch_slots[name]])

    def release_branch(self, branch: PagedBranch) -> None:
        self.free_pages(branch.table.release())
        branch.slot.forget()
        self.storage.poison(branch.slot.register_pages)

    def allocate_pages(self, num: int, what: str) -> list[int]:
        page_ids = self.pool.allocate(num)
        if page_ids is None:
            raise KVStateError(f"page pool exhausted allocating {num} {what} pages "
                               f"({self.pool.num_free} free of {self.pool.num_pages}); "
                               f"more sessions or blocks are open than the plan allows "
                               f"(a batch of B sessions needs a plan for batch_rows >= B, "
                               f"this one is for {self.plan.batch_rows})")
        return page_ids

    def free_pages(self, page_ids: list[int]) -> None:
        self.pool.free(page_ids)
        self.storage.poison(page_ids)

    def gather_histories(self, rows: list[RowKV], layer: int
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every row's history by one `index_select` per tensor (rows of this cache's
        `PagedBlock`s; else None)."""
        indices = []
        for kv in rows:
            if not isinstance(kv, PagedBlock) or kv.cache is not self:
                return None
            indices.append(kv.address.history.index)
        index = torch.cat(indices)
        k_pool, v_pool = self.storage.flat(layer)
        return k_pool.index_select(0, index), v_pool.index_select(0, index)

    def stats(self) -> CacheStats:
        """Pages in use and at peak count history and in-flight pages; `pages_total` is the
        plan's, the reserved register pages included."""
        return CacheStats("paged", self.plan.total_pages, self.pool.num_used,
                          self.pool.peak_used, self.storage.nbytes, self.cross.nbytes,
                          len(self._sessions))


class PagedBranch:
    """One branch of one session: its page table, and the read address of its last block."""

    def __init__(self, cache: PagedKVCache, table: PageTable, slot: Slot) -> None:
        self.cache, self.table, self.slot = cache, table, slot
        self._read: tuple[AddressKey, BlockAddress] | None = None  # of the last block
        self._visible: tuple[int, list[int]] = (-1, [])        # (table version, frames)

    @property
    def num_committed_frames(self) -> int:
        return self.table.num_committed_frames

    @property
    def kept_frames(self) -> list[int]:
        return self.table.visible_frames

    def visible_frames(self) -> list[int]:
        """The table's visible frames, rebuilt only when the table changed (read-only)."""
        if self._visible[0] != self.table.version:
            self._visible = (self.table.version, self.table.visible_frames)
        return self._visible[1]

    def block_address(self, block_frames: list[FramePages]) -> BlockAddress:
        """Where a block writes and reads. Rebuilt only when the table or the block's pages
        changed: the probes and the commit of a block share one, and so do the probes of
        later blocks until a commit (the pool hands the same pages back)."""
        key = (self.table.version, tuple(block_frames))
        if self._read is None or self._read[0] != key:
            history = self.table.visible_pages
            self._read = (key, BlockAddress(self.cache.storage, history, block_frames,
                                            self.slot.register_pages,
                                            self.cache.max_registers))
        return self._read[1]

    def begin(self, num_frames: int, commit: bool = True) -> PagedBlock:
        return PagedBlock(self, num_frames, commits=commit)

    def begin_recache(self, start_frame: int, num_frames: int) -> PagedRecache:
        return PagedRecache(self, start_frame, num_frames)


class BlockAddress:
    """A block's addresses in the storage:

        history_kv(layer): the visible history's K and V, as views of its stretches of
                  storage (or, past MAX_VIEW_RUNS stretches, one gather)
        block:    the block's in-flight pages (a commit writes its k/v there)
        read(n):  [visible history | the block | n register tokens]: what the custom op reads
    """

    def __init__(self, storage: PagedStorage, history: list[FramePages],
                 frames: list[FramePages], register_pages: list[int],
                 max_registers: int) -> None:
        self.storage, self.register_pages = storage, register_pages
        self.history = storage.frames_address(history)
        self.block = storage.frames_address(frames)
        self.block_views = storage.write_views(self.block)  # per layer, None: by index
        self._history_views: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]] | None] = {}
        self._reads: dict[int, TokenAddress] = {}  # per register count, built when asked
        self._registers: dict[int, TokenAddress] = {}
        self.max_registers = max_registers

    def history_kv(self, layer: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Layer `layer`'s history K and V as lists of tensors to concatenate, in order."""
        if layer not in self._history_views:
            self._history_views[layer] = self.storage.views(layer, self.history)
        views = self._history_views[layer]
        if views is not None:
            return views
        keys, values = self.storage.gather(layer, self.history)
        return [keys], [values]

    def op_indices(self, slot: Slot) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """(write, read) index tensors of `ardiff::paged_attend` per register count: views
        of the slot's static buffers, loaded with this address (outside any compiled code)."""
        return slot.indices.load(self, self.block, self.read(0),
                                 self.registers(self.max_registers))

    def registers(self, num_tokens: int) -> TokenAddress:
        address = self._registers.get(num_tokens)
        if address is None:
            address = self._registers[num_tokens] = self.storage.registers_address(
                self.register_pages, num_tokens)
        return address

    def read(self, num_registers: int) -> TokenAddress:
        address = self._reads.get(num_registers)
        if address is None:
            history_block = self.history.concat(self.block)
            if num_registers:
                history_block = history_block.concat(self.registers(num_registers))
            address = self._reads[num_registers] = history_block
        return address


class PagedBlock:
    """A block in flight: its pages, and the storage addresses it writes and reads through.

    Every attend reads [history | k/v | registers] by one concatenation; a commit's attend
    (`commits`) first stores the block's k/v in its in-flight pages, a probe's does not."""

    def __init__(self, branch: PagedBranch, num_frames: int, commits: bool = True) -> None:
        cache, plan = branch.cache, branch.cache.plan
        self.commits = commits
        self.cache, self.table, self.storage = cache, branch.table, cache.storage
        self.start_frame = branch.table.num_committed_frames
        self.visible_frames = branch.visible_frames()
        ppf = plan.pages_per_frame
        pages = cache.allocate_pages(num_frames * ppf, "in-flight")
        self.frames: list[FramePages] = [tuple(pages[i * ppf:(i + 1) * ppf])
                                         for i in range(num_frames)]
        self.address = branch.block_address(self.frames)
        self.slot = branch.slot
        # Only a cache planned for `ardiff::paged_attend` (runtime.compile) loads its index
        # buffers: the eager path never reads them, and loading them costs ~4 copies a block.
        self.op_indices = self.address.op_indices(self.slot) if plan.stores_registers else None
        self._done = False

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
               scale: float | None) -> torch.Tensor:
        keys, values = self.keys_values(layer, k, v)
        if extra_k is not None:
            assert extra_v is not None, "TensorChecks.extra passes both or neither"
            keys.append(extra_k)
            values.append(extra_v)
        return self.cache.attend_fn(q, torch.cat(keys), torch.cat(values), scale)

    def keys_values(self, layer: int, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """[history | k] and [history | v] as pieces to concatenate, in order; a commit
        first stores k/v in its in-flight pages (what becomes history), a probe does not."""
        address = self.address
        if self.commits:
            views = address.block_views[layer]
            counts = self.cache.inflight_writes
            if counts is not None:
                k_pool, v_pool = self.storage.flat(layer)
                k_before, v_before = k_pool._version, v_pool._version
            if views is None:
                self.storage.write(layer, address.block, k, v)
            else:
                views[0].copy_(k)
                views[1].copy_(v)
            if counts is not None:
                counts[layer][0] += k_pool._version - k_before
                counts[layer][1] += v_pool._version - v_before
        keys, values = address.history_kv(layer)
        return [*keys, k], [*values, v]

    def history_stamp(self, layer: int) -> tuple[object, ...] | None:
        """The page table and its version (which pages are history) and the version
        counters of the layer's storage, less what blocks' own stores into in-flight pages
        added: any other write (a recache, a poisoned page) changes them."""
        counts = self.cache.inflight_writes
        if counts is None:
            return None
        k_pool, v_pool = self.storage.flat(layer)
        k_own, v_own = counts[layer]
        return (self.table, self.table.version, k_pool._version - k_own,
                v_pool._version - v_own)

    def traced_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
                      scale: float | None) -> torch.Tensor:
        """`attend` as a compiled layer stack traces it: one `ardiff::paged_attend` call
        (registers are stored with the block's k/v, every call)."""
        num_registers = 0
        if extra_k is not None:
            assert extra_v is not None, "TensorChecks.extra passes both or neither"
            num_registers = extra_k.shape[0]
            k, v = torch.cat([k, extra_k]), torch.cat([v, extra_v])
        if self.op_indices is None:
            raise KVStateError("attend: a compiled layer stack attended through a cache planned "
                               "for the eager path (stores_registers=False); build the runner "
                               "with runtime.compile: true")
        if num_registers not in self.op_indices:
            raise KVStateError("attend: a compiled layer stack passed register tokens to a "
                               "cache planned without register pages; build the runner with "
                               "runtime.compile: true (it plans them)")
        write_index, read_index = self.op_indices[num_registers]
        k_cache, v_cache = self.storage.flat(layer)
        out: torch.Tensor = ops.paged_attend(q, k, v, k_cache, v_cache, write_index, read_index,
                                             scale, self.cache.kernel_name)
        return out

    def commit(self) -> None:
        """Hand the in-flight pages to the table; free what the window evicts."""
        self._finish(self.table.commit(self.frames))

    def abort(self) -> None:
        """Commit nothing: every in-flight page goes back to the pool."""
        self._finish([page for pages in self.frames for page in pages])

    def _finish(self, page_ids: list[int]) -> None:
        assert not self._done, "a block is finished once"
        self._done = True
        # Freed last-first, so the next block gets the same pages in the same order (the pool
        # reuses the last freed first) and its addresses are the cached ones.
        self.cache.free_pages(page_ids[::-1])
