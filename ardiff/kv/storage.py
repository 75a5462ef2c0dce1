"""Page storage: per-layer K and V pools, indexed by page id.

    k[layer]: [num_pages, page_tokens, num_kv_heads, head_size]   (v likewise, a separate tensor)

A frame starts on a fresh page and fills `pages_per_frame` pages; the tail of
its last page is never read. Readers and writers address tokens through a
`TokenAddress` (flat token ids `page_id * page_tokens + offset`, and the same
as contiguous stretches), built once per block.
"""

from __future__ import annotations

import torch

from ardiff.dtypes import torch_dtype
from ardiff.kv.address import Runs, TokenAddress, frames_address, pages_address
from ardiff.kv.plan import KVPlan

# A stretch of at least this many elements is copied as a slice rather than per token
# (a Wan-sized frame, whose stretches are megabytes, gathers faster by slices).
RUN_COPY_MIN_ELEMENTS = 1 << 16
ADDRESS_CACHE_SIZE = 256  # memoised frame addresses; cleared when full
# Up to this many stretches, the history is read as views (concatenated with the block's
# k/v by one `torch.cat`, as the dense reference does); past it, by one gather.
MAX_VIEW_RUNS = 32


class PagedStorage:
    """The K/V tensors of every page. Only the cache writes page ids into it."""

    def __init__(self, plan: KVPlan, device: torch.device, poison: bool = False) -> None:
        spec = plan.spec
        self.page_tokens = plan.page_tokens
        self.tokens_per_frame = spec.tokens_per_frame
        self._token_elements = spec.num_kv_heads * spec.head_size
        self.poison_enabled = poison
        self.dtype = torch_dtype(plan.dtype)
        self.device = torch.device(device)
        shape = (plan.total_pages, plan.page_tokens, spec.num_kv_heads, spec.head_size)
        self.k = [self._new_pool(shape) for _ in range(spec.num_layers)]
        self.v = [self._new_pool(shape) for _ in range(spec.num_layers)]
        # Per layer, K and V seen as [pages * page_tokens, heads, head_size] (views, no copy).
        self._flat_views = [(k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:]))
                            for k, v in zip(self.k, self.v)]
        self._addresses: dict[tuple[tuple[int, ...], ...], TokenAddress] = {}
        # Memoised views per (layer, runs): the pool hands the same pages back, so a block's
        # in-flight stretches and the window's history stretches recur block after block.
        self._views: dict[tuple[int, Runs], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._write_views: dict[Runs, list[tuple[torch.Tensor, torch.Tensor] | None]] = {}

    def _new_pool(self, shape: tuple[int, int, int, int]) -> torch.Tensor:
        """One layer's K (or V) pages: NaN in poison mode, else uninitialised."""
        if self.poison_enabled:
            return torch.full(shape, float("nan"), dtype=self.dtype, device=self.device)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def frames_address(self, frames: list[tuple[int, ...]]) -> TokenAddress:
        """Where the valid tokens of `frames` (each a tuple of page ids) live.

        Memoised: the pool hands the same in-flight pages back block after block."""
        key = tuple(frames)
        address = self._addresses.get(key)
        if address is None:
            if len(self._addresses) >= ADDRESS_CACHE_SIZE:
                self._addresses.clear()
            address = self._addresses[key] = frames_address(
                frames, self.page_tokens, self.tokens_per_frame, self.device)
        return address

    def registers_address(self, page_ids: list[int], num_tokens: int) -> TokenAddress:
        """Where `num_tokens` register tokens laid over consecutive `page_ids` live."""
        return pages_address(page_ids, num_tokens, self.page_tokens, self.device)

    def write_views(self, address: TokenAddress) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Per layer, the (K, V) views of `address` when it is one stretch (a write is then
        two plain copies); None per layer when it is not."""
        views = self._write_views.get(address.runs)
        if views is None:
            if len(self._write_views) >= ADDRESS_CACHE_SIZE:
                self._write_views.clear()
            views = self._write_views[address.runs] = self._new_write_views(address)
        return views

    def _new_write_views(self, address: TokenAddress
                         ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        if len(address.runs) != 1:
            return [None] * len(self._flat_views)
        start, length = address.runs[0]
        return [(k.narrow(0, start, length), v.narrow(0, start, length))
                for k, v in self._flat_views]

    def views(self, layer: int, address: TokenAddress
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """Layer `layer`'s K and V at `address` as views of their stretches, in order (None
        past MAX_VIEW_RUNS stretches: gather instead)."""
        if len(address.runs) > MAX_VIEW_RUNS:
            return None
        key = (layer, address.runs)
        views = self._views.get(key)
        if views is None:
            if len(self._views) >= ADDRESS_CACHE_SIZE:
                self._views.clear()
            k, v = self._flat_views[layer]
            views = self._views[key] = (
                [k.narrow(0, start, length) for start, length in address.runs],
                [v.narrow(0, start, length) for start, length in address.runs])
        return views

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s K and V as [pages * page_tokens, heads, head_size] (views)."""
        return self._flat_views[layer]

    def write(self, layer: int, address: TokenAddress, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V `[address.num_tokens, heads, head_size]` at `address`."""
        for pool, src in zip(self.flat(layer), (k, v)):
            self._copy(pool, address, src, into_pool=True)

    def read(self, layer: int, address: TokenAddress,
             registers: TokenAddress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V `[tokens, heads, head_size]` of `address` then `registers`, gathered into
        one new tensor each (what attention reads)."""
        return self.gather(layer, address if registers is None else address.concat(registers))

    def gather(self, layer: int, address: TokenAddress) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V `[address.num_tokens, heads, head_size]`, each one new tensor: one
        `index_select` per tensor for small stretches, slice copies for big ones."""
        pools = self._flat_views[layer]
        if not self._by_runs(address):
            return pools[0].index_select(0, address.index), pools[1].index_select(0, address.index)
        out = []
        for pool in pools:
            buf = torch.empty(address.num_tokens, *pool.shape[1:], dtype=self.dtype,
                              device=self.device)
            self._copy(pool, address, buf, into_pool=False)
            out.append(buf)
        return out[0], out[1]

    def _by_runs(self, address: TokenAddress) -> bool:
        return address.tokens_per_run * self._token_elements >= RUN_COPY_MIN_ELEMENTS

    def _copy(self, pool: torch.Tensor, address: TokenAddress, data: torch.Tensor,
              into_pool: bool) -> None:
        """Copy `data` [tokens, heads, hs] to (or from) the pool's tokens at `address`."""
        if len(address.runs) != 1 and not self._by_runs(address):
            if into_pool:
                pool.index_copy_(0, address.index, data)
            else:
                torch.index_select(pool, 0, address.index, out=data)
            return
        done = 0
        for start, length in address.runs:  # one run: a slice copy beats any index
            stretch, part = pool.narrow(0, start, length), data.narrow(0, done, length)
            stretch.copy_(part) if into_pool else part.copy_(stretch)
            done += length

    def poison(self, page_ids: list[int]) -> None:
        """Fill pages with NaN (poison mode only), so a read of a freed page shows."""
        if not self.poison_enabled or not page_ids:
            return
        ids = torch.tensor(page_ids, dtype=torch.long, device=self.device)
        for tensor in (*self.k, *self.v):
            tensor.index_fill_(0, ids, float("nan"))
