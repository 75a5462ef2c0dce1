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
from typing import Any, Generic, Protocol

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
        self._sessions: dict[str, SessionKV[BranchT]] = {}
        self._open_slots: dict[int, str] = {}

    # -- backend hooks -------------------------------------------------------
    def new_branch(self, session_id: str, name: str) -> BranchT:
        raise NotImplementedError

    def release_branch(self, branch: BranchT) -> None:
        raise NotImplementedError

    def stats(self) -> CacheStats:
        raise NotImplementedError

    # -- sessions ------------------------------------------------------------
    @property
    def session_ids(self) -> list[str]:
        return list(self._sessions)

    @property
    def capacity(self) -> int:
        return self.plan.session_capacity

    def has_session(self, session_id: str) -> bool:
        return session_id in self._sessions

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

    # -- one block in flight per slot (in-flight pages are per slot) ---------
    def open_slot(self, slot: int, branch: str) -> None:
        if slot in self._open_slots:
            raise KVStateError(f"block on branch {branch!r}: a block on local slot {slot} "
                               f"({self._open_slots[slot]!r}) is still open; close it first")
        self._open_slots[slot] = branch

    def close_slot(self, slot: int) -> None:
        self._open_slots.pop(slot, None)

    def close(self) -> None:
        """Release every session. Safe to call twice."""
        for session_id in list(self._sessions):
            self.release_session(session_id)


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
