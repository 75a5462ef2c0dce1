"""What every KV backend shares: sessions, slot rules, cross-attention K/V, states.

A backend (paged or dense) subclasses `KVCacheBase` and supplies the branch
objects that hold history (`new_branch`, `release_branch`) and its numbers
(`stats`). The runner alone opens and releases sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ardiff.errors import KVStateError, SessionError
from ardiff.kv.cross import CrossKVStore
from ardiff.kv.plan import KVPlan
from ardiff.kv.state import BranchKV, KVState
from ardiff.kv.storage import TORCH_DTYPES


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


class SessionKV:
    """One session's branches on one backend; which branch owns which local slot."""

    def __init__(self, cache: KVCacheBase, session_id: str) -> None:
        self.cache, self.session_id = cache, session_id
        self.branches: dict[str, BranchKV] = {}
        self.slot_owner: dict[int, str] = {}
        self.is_released = False

    def check_branch(self, name: str) -> int:
        """The branch's local slot; raises on an undeclared branch."""
        for branch in self.cache.spec.branches:
            if branch.name == name:
                return branch.local_index
        known = ", ".join(b.name for b in self.cache.spec.branches)
        raise KVStateError(f"branch {name!r} is not declared by the spec (declared: {known})")

    def check_slot(self, name: str) -> int:
        """The branch's local slot, if no other branch of this session holds it; else raise."""
        slot = self.check_branch(name)
        owner = self.slot_owner.get(slot, name)
        if owner != name:
            raise KVStateError(f"branches {owner!r} and {name!r} share local_index {slot}; one "
                               f"session can use only one of them on this worker")
        return slot

    def claim_slot(self, name: str) -> int:
        """Bind `name` to its local slot for this session; a second branch on it raises."""
        slot = self.check_slot(name)
        self.slot_owner[slot] = name
        return slot

    def branch(self, name: str) -> BranchKV:
        self.claim_slot(name)
        if name not in self.branches:
            self.branches[name] = self.cache.new_branch(self.session_id, name)
        return self.branches[name]


class KVCacheBase:
    """Sessions, states and cross-attention K/V over a backend's branch storage."""

    backend_name = "base"

    def __init__(self, plan: KVPlan, device: str | torch.device = "cpu") -> None:
        self.plan, self.spec = plan, plan.spec
        self.device = _normalize(torch.device(device))
        self.torch_dtype = TORCH_DTYPES[plan.dtype]
        self.cross = CrossKVStore(plan.spec, self.torch_dtype, self.device)
        self._sessions: dict[str, SessionKV] = {}
        self._open_slots: dict[int, str] = {}
        self._states: dict[str, list[KVState]] = {}

    # -- backend hooks -------------------------------------------------------
    def new_branch(self, session_id: str, name: str) -> BranchKV:
        raise NotImplementedError

    def release_branch(self, branch: BranchKV) -> None:
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
        if session is None or branch not in session.branches:
            return 0
        return session.branches[branch].num_committed_frames

    def open_state(self, session_id: str) -> KVState:
        """A state over `session_id`, creating the session if it is new (capacity permitting)."""
        session = self._sessions.get(session_id)
        if session is None:
            if len(self._sessions) >= self.capacity:
                raise SessionError(f"KV cache is full ({self.capacity} sessions resident); "
                                   f"release one before opening session {session_id!r}")
            session = self._sessions[session_id] = SessionKV(self, session_id)
        state = KVState(self, session)
        self._states.setdefault(session_id, []).append(state)
        return state

    def release_session(self, session_id: str) -> None:
        """Free every page and tensor of the session and close its states. Raises if unknown."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionError(f"session {session_id!r} is not resident; nothing to release")
        session.is_released = True
        for state in self._states.pop(session_id, []):
            state.close()
        for branch in session.branches.values():
            self.release_branch(branch)
        self.cross.release(session_id)

    def forget_state(self, state: KVState) -> None:
        """Drop a finished bind's state (it stays closed)."""
        state.close()
        states = self._states.get(state.session_id, [])
        if state in states:
            states.remove(state)

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

    def describe(self) -> dict[str, Any]:
        stats = self.stats()
        return {k: getattr(stats, k) for k in stats.__dataclass_fields__}


def _normalize(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
