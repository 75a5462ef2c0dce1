"""What every KV backend shares: the branch and block protocols, sessions, the factory.

    create_cache(plan, "paged" | "dense")  -> KVCacheBase   (ardiff.kv.backends names them)
    cache.open_session(id) -> SessionKV     the runner alone opens and releases sessions
    cache.release_session(id)               frees its pages, tensors and cross-attention K/V

A backend subclasses `KVCacheBase[ItsBranch]` and supplies the objects that hold history
(`new_branch`, `release_branch`: a `BranchKV` that begins `BlockKV`s) and its numbers
(`stats`). The state API a pipeline sees (`ardiff.kv.state`) sits on top and is the same
for every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, cast

import torch

from ardiff.dtypes import torch_dtype
from ardiff.errors import KVStateError, SessionError
from ardiff.kv import kernels
from ardiff.kv.backends import BACKENDS, DEFAULT_BACKEND, backend_names
from ardiff.kv.cross import CrossKVStore
from ardiff.kv.plan import KVPlan
from ardiff.kv.session import BranchT, SessionKV


class BlockKV(Protocol):
    """A backend's view of one block in flight."""

    start_frame: int
    visible_frames: list[int]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
               scale: float | None) -> torch.Tensor: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


class RowKV(BlockKV, Protocol):
    """A block that can be one row of a batched attend (what `BranchKV.begin` returns)."""

    def keys_values(self, layer: int, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """[visible history | k] and the same of v, as pieces to concatenate in order
        (a commit first stores k/v where its history will be)."""
        ...

    def history_stamp(self, layer: int) -> tuple[object, ...] | None:
        """What layer `layer`'s visible history is read from now (after `keys_values`): two
        stamps of equal parts (the same objects, equal numbers) mean the same K/V, bit for
        bit; None: no such promise (the batched attend then copies the history anew)."""
        ...


class BranchKV(Protocol):
    """A backend's history of one branch of one session."""

    @property
    def num_committed_frames(self) -> int: ...

    @property
    def kept_frames(self) -> list[int]:
        """Absolute indices of the frames held now, in order."""
        ...

    def begin(self, num_frames: int, commit: bool = True) -> BlockKV:
        """A block; `commit=False` marks a probe, which the state never commits."""
        ...

    def begin_recache(self, start_frame: int, num_frames: int) -> BlockKV: ...


@dataclass(frozen=True)
class CacheStats:
    """Pages (None for backends without pages) and bytes of a cache, now and at peak."""

    backend: str
    pages_total: int | None
    pages_in_use: int | None
    pages_peak: int | None
    kv_bytes_allocated: int
    cross_attention_bytes: int
    resident_sessions: int


class KVCacheBase(Generic[BranchT]):
    """Resident sessions, the one-block-per-slot rule and cross-attention K/V over a backend."""

    backend_name = "base"

    def __init__(self, plan: KVPlan, device: str | torch.device = "cpu",
                 poison: bool = False) -> None:
        """`poison`: fill unused and freed storage with NaN, where a backend has any (the
        dense backend keeps none: it allocates per block and frees by dropping)."""
        self.plan, self.spec = plan, plan.spec
        self.device = _normalize(torch.device(device))
        self.torch_dtype = torch_dtype(plan.dtype)
        self.cross = CrossKVStore(plan.spec, self.torch_dtype, self.device)
        self.branch_slots = {b.name: b.local_index for b in plan.spec.kv_branches}
        # One attention kernel for every block of this cache (ardiff.kv.kernels).
        self.kernel_name, self.attend_fn = kernels.select(self.device, self.torch_dtype,
                                                          plan.spec.head_size)
        self.stacked_fn = kernels.stacked(self.kernel_name)  # its B-row form, if it has one
        self._sessions: dict[str, SessionKV[BranchT]] = {}
        self._open_slots: dict[int, list[str]] = {}  # branches of the blocks open per slot
        self.blocks_per_slot = 1  # how many one slot may hold: B while a batch enters its rows

    # -- backend hooks -------------------------------------------------------
    def new_branch(self, session_id: str, name: str) -> BranchT:
        raise NotImplementedError

    def release_branch(self, branch: BranchT) -> None:
        raise NotImplementedError

    def stats(self) -> CacheStats:
        raise NotImplementedError

    def gather_histories(self, rows: list[RowKV], layer: int
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer `layer`'s visible history K and V of every row, one after another
        ([sum of the rows' history tokens, kv_heads, hs] each) in one gather per tensor;
        None: not by one gather here (the caller concatenates row by row)."""
        return None

    # -- sessions ------------------------------------------------------------
    @property
    def session_ids(self) -> list[str]:
        return list(self._sessions)

    @property
    def capacity(self) -> int:
        return self.plan.session_capacity

    def has_session(self, session_id: str) -> bool:
        return session_id in self._sessions

    def session_pages(self, session_id: str) -> int:
        """Pages the session's branches hold now (0: not resident, or branches without a
        page table)."""
        session = self._sessions.get(session_id)
        if session is None:
            return 0
        return sum(getattr(getattr(branch, "table", None), "num_pages", 0)
                   for branch in session.branches.values())

    def num_committed_frames(self, session_id: str, branch: str) -> int:
        session = self._sessions.get(session_id)
        return 0 if session is None else session.num_committed_frames(branch)

    def open_session(self, session_id: str) -> SessionKV[BranchT]:
        """The session, created if it is new (capacity permitting)."""
        session = self._sessions.get(session_id)
        if session is None:
            if len(self._sessions) >= self.capacity:
                raise SessionError(f"KV cache is full ({self.capacity} sessions resident); "
                                   f"release one before opening session {session_id!r}")
            session = self._sessions[session_id] = SessionKV(self, session_id)
        return session

    def release_session(self, session_id: str) -> None:
        """Free every page and tensor of the session; its states become unusable. Raises if
        unknown."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionError(f"session {session_id!r} is not resident; nothing to release")
        session.is_released = True
        for branch in session.branches.values():
            self.release_branch(branch)
        self.cross.release(session_id)

    # -- one block in flight per slot (B, one per row, while a batch block enters) --
    def open_slot(self, slot: int, branch: str) -> None:
        open_now = self._open_slots.setdefault(slot, [])
        if len(open_now) >= self.blocks_per_slot:
            raise KVStateError(f"block on branch {branch!r}: a block on local slot {slot} "
                               f"({open_now[0]!r}) is still open; close it first")
        open_now.append(branch)

    def close_slot(self, slot: int) -> None:
        """One block of `slot` ended (each open is closed exactly once)."""
        open_now = self._open_slots.get(slot)
        if open_now:
            open_now.pop()
        if not open_now:
            self._open_slots.pop(slot, None)

    def close(self) -> None:
        """Release every session. Safe to call twice."""
        for session_id in list(self._sessions):
            self.release_session(session_id)


def attend_rows(cache: KVCacheBase[Any], rows: list[RowKV], layer: int, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, extra_k: torch.Tensor | None,
                extra_v: torch.Tensor | None, scale: float | None,
                memo: dict[Any, StackedKV] | None = None,
                stores: bool = True) -> torch.Tensor:
    """Row i of q [B, q_tokens, q_heads, hs] attends to row i's [history | k[i] | extra[i]];
    returns [B, q_tokens, q_heads, hs] (docs/design.md#batched-blocks).

    Rows with the same key count go through the kernel's stacked form in one call (equal
    to row-by-row attends within the bounds across kernels, docs/development.md); a row alone in its key count, a
    kernel without a stacked form, or a group past STACKED_MAX_BYTES goes row by row,
    as the single attend does. Ragged histories are grouped, never padded (masked,
    padded SDPA measured slower than the rows one by one).

    `memo` (one per batch of sessions, keyed by `memo_key`): where every row has the same
    key count, the stacked K and V of `layer` are kept there with each row's history
    stamp; a later attend whose rows' stamps are all the same (the probes of one block and
    of its commit read one history) copies only k/v/extra into them, not the history.
    `stores`: the rows are a commit's (their `keys_values` store k/v, so each row runs it);
    a probe's rows on such a hit do not."""
    if memo is not None and not stores and len(rows) > 1 and cache.stacked_fn is not None:
        entry = _memo_hit(memo, rows, layer, k, v, extra_k, extra_v)
        if entry is not None:
            return cache.stacked_fn(q, entry.keys, entry.values, scale)
    keys, values = [], []
    for row, kv in enumerate(rows):
        row_keys, row_values = kv.keys_values(layer, k[row], v[row])
        if extra_k is not None:
            assert extra_v is not None, "TensorChecks.extra passes both or neither"
            row_keys.append(extra_k[row])
            row_values.append(extra_v[row])
        keys.append(row_keys)
        values.append(row_values)
    if len(rows) == 1:  # the single attend's own call
        return cache.attend_fn(q[0], torch.cat(keys[0]), torch.cat(values[0]), scale)[None]
    if memo is not None and cache.stacked_fn is not None:
        stacked = _memo_stacked(cache, memo, rows, layer, q, keys, values, k, v, extra_k,
                                extra_v)
        if stacked is not None:
            return cache.stacked_fn(q, stacked.keys, stacked.values, scale)
    groups = _stack_groups(cache, q, keys)
    if len(groups) == 1:  # lockstep: one call over every row, no copy of its output
        return _attend_stacked(cache, q, keys, values, scale)
    outs: list[torch.Tensor] = [q] * len(rows)  # every entry replaced below
    for group in groups:
        if len(group) == 1:
            (row,) = group
            outs[row] = cache.attend_fn(q[row], torch.cat(keys[row]), torch.cat(values[row]),
                                        scale)
            continue
        first, last = group[0], group[-1]
        group_q = q[first:last + 1] if last - first + 1 == len(group) else \
            q.index_select(0, torch.tensor(group, device=q.device))
        group_out = _attend_stacked(cache, group_q, [keys[r] for r in group],
                                    [values[r] for r in group], scale)
        for i, row in enumerate(group):
            outs[row] = group_out[i]
    return torch.stack(outs)


@dataclass
class StackedKV:
    """A layer's stacked [B, history + block (+ extra), kv_heads, hs] K and V of a batch's
    rows, and the history stamps of the rows it was copied from."""

    stamps: list[tuple[object, ...]]
    keys: torch.Tensor
    values: torch.Tensor
    history: int  # tokens of history before each row's block


def _same_stamps(old: list[tuple[object, ...]], new: list[tuple[object, ...] | None]) -> bool:
    """Each row's parts the same objects (numbers: equal) as when the memo was copied."""
    if len(old) != len(new):
        return False
    for was, now in zip(old, new):
        if now is None or len(was) != len(now):
            return False
        for a, b in zip(was, now):
            if a is not b and not (type(a) is int and type(b) is int and a == b):
                return False
    return True


def _memo_stacked(cache: KVCacheBase[Any], memo: dict[Any, StackedKV], rows: list[RowKV],
                  layer: int, q: torch.Tensor, keys: list[list[torch.Tensor]],
                  values: list[list[torch.Tensor]], k: torch.Tensor, v: torch.Tensor,
                  extra_k: torch.Tensor | None,
                  extra_v: torch.Tensor | None) -> StackedKV | None:
    """The stacked K/V of every row for this attend, its history copied only when a row's
    stamp changed; None where the rows are not one group (ragged, or too big): the caller
    groups them."""
    entry = _memo_hit(memo, rows, layer, k, v, extra_k, extra_v)
    if entry is None:
        stamps = [kv.history_stamp(layer) for kv in rows]
        block = k.shape[1] + (0 if extra_k is None else extra_k.shape[1])
        memo.pop(layer, None)
        count = sum(t.shape[0] for t in keys[0])
        if any(sum(t.shape[0] for t in pieces) != count for pieces in keys[1:]):
            return None
        shape = (len(rows), count, cache.spec.num_kv_heads, cache.spec.head_size)
        per_layer = 2 * q.element_size() * shape[0] * shape[1] * shape[2] * shape[3]
        if per_layer * cache.spec.num_layers > STACKED_MAX_BYTES:
            return None  # as many layers kept as a group's bytes allow: none, here
        k_rows, v_rows = q.new_empty(shape), q.new_empty(shape)
        history = count - block
        gathered = cache.gather_histories(rows, layer) if history else None
        if gathered is not None:  # every row's history in one gather, then the block's
            k_rows[:, :history].copy_(gathered[0].view(len(rows), history, *shape[2:]))
            v_rows[:, :history].copy_(gathered[1].view(len(rows), history, *shape[2:]))
            k_rows[:, history:history + k.shape[1]].copy_(k)
            v_rows[:, history:history + k.shape[1]].copy_(v)
            if extra_k is not None:
                assert extra_v is not None, "TensorChecks.extra passes both or neither"
                k_rows[:, history + k.shape[1]:].copy_(extra_k)
                v_rows[:, history + k.shape[1]:].copy_(extra_v)
        else:
            for row, (row_keys, row_values) in enumerate(zip(keys, values)):
                torch.cat(row_keys, out=k_rows[row])
                torch.cat(row_values, out=v_rows[row])
        if all(stamp is not None for stamp in stamps):
            memo[layer] = StackedKV(cast(list[tuple[object, ...]], stamps), k_rows, v_rows,
                                    history)
        return StackedKV([], k_rows, v_rows, history)
    return entry


def _memo_hit(memo: dict[Any, StackedKV], rows: list[RowKV], layer: int, k: torch.Tensor,
              v: torch.Tensor, extra_k: torch.Tensor | None,
              extra_v: torch.Tensor | None) -> StackedKV | None:
    """The memo's stacked K/V of `layer` with this attend's k/v/extra copied in after the
    history, where every row's history stamp is the one it was copied with; else None."""
    entry = memo.get(layer)
    if entry is None:
        return None
    block = k.shape[1] + (0 if extra_k is None else extra_k.shape[1])
    if entry.keys.shape[1] != entry.history + block or not _same_stamps(
            entry.stamps, [kv.history_stamp(layer) for kv in rows]):
        return None
    start, end = entry.history, entry.history + k.shape[1]
    entry.keys[:, start:end].copy_(k)
    entry.values[:, start:end].copy_(v)
    if extra_k is not None:
        assert extra_v is not None, "TensorChecks.extra passes both or neither"
        entry.keys[:, end:].copy_(extra_k)
        entry.values[:, end:].copy_(extra_v)
    return entry


# A stacked group's K and V together stay under this (else it is split): past it the rows
# gain nothing from one call (docs/performance.md) and the copy would cost B rows' memory.
STACKED_MAX_BYTES = 64 << 20


def _stack_groups(cache: KVCacheBase[Any], q: torch.Tensor,
                  keys: list[list[torch.Tensor]]) -> list[list[int]]:
    """Rows grouped by key count (in row order), each group cut to fit STACKED_MAX_BYTES;
    every row alone when the kernel has no stacked form."""
    if cache.stacked_fn is None:
        return [[row] for row in range(len(keys))]
    by_count: dict[int, list[int]] = {}
    for row, pieces in enumerate(keys):
        by_count.setdefault(sum(t.shape[0] for t in pieces), []).append(row)
    groups = []
    for count, rows in by_count.items():
        row_bytes = 2 * count * q.element_size() * cache.spec.num_kv_heads * cache.spec.head_size
        per_group = max(1, STACKED_MAX_BYTES // max(1, row_bytes))
        groups += [rows[i:i + per_group] for i in range(0, len(rows), per_group)]
    return groups


def _attend_stacked(cache: KVCacheBase[Any], q: torch.Tensor, keys: list[list[torch.Tensor]],
                    values: list[list[torch.Tensor]], scale: float | None) -> torch.Tensor:
    """q [n, q_tokens, q_heads, hs] to n rows of equal key count, copied into one
    [n, kv_tokens, kv_heads, hs] K and V (one copy, as each row's own concatenation)."""
    assert cache.stacked_fn is not None, "grouped only where the kernel has a stacked form"
    count = sum(t.shape[0] for t in keys[0])
    shape = (len(keys), count, cache.spec.num_kv_heads, cache.spec.head_size)
    k_rows, v_rows = q.new_empty(shape), q.new_empty(shape)
    for row, (row_keys, row_values) in enumerate(zip(keys, values)):
        torch.cat(row_keys, out=k_rows[row])
        torch.cat(row_values, out=v_rows[row])
    return cache.stacked_fn(q, k_rows, v_rows, scale)


def create_cache(plan: KVPlan, backend: str = DEFAULT_BACKEND, device: str | torch.device = "cpu",
                 poison: bool = False) -> KVCacheBase[Any]:
    """The cache for `runtime.kv.backend`, a name in `ardiff.kv.backends.BACKENDS`.

    `poison` fills unused and freed pages with NaN (where a backend has pages) so a wrong
    read shows."""
    if backend not in BACKENDS:
        names = " or ".join(backend_names())
        raise KVStateError(f"runtime.kv.backend: {backend!r} is not a backend; use {names}")
    return BACKENDS[backend].cache_class()(plan, device, poison)


def _normalize(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
