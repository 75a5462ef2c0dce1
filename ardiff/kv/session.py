"""One session's KV on a backend: its branches, and which branch holds which local slot.

Branches that share a `local_index` share storage on this worker, so one
session may use only one of them (the other runs on another worker, e.g. the
second CFG branch under CFG parallelism). The first branch to use a slot
claims it for the session's lifetime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

from ardiff.errors import KVStateError

if TYPE_CHECKING:  # pragma: no cover - typing only: backend imports this module
    from ardiff.kv.backend import BranchKV, KVCacheBase

BranchT = TypeVar("BranchT", bound="BranchKV")  # a backend's branch class


class SessionKV(Generic[BranchT]):
    """The branches of one resident session; `is_released` once the cache let it go."""

    def __init__(self, cache: KVCacheBase[BranchT], session_id: str) -> None:
        self.cache, self.session_id = cache, session_id
        self.branches: dict[str, BranchT] = {}
        self.slot_owner: dict[int, str] = {}
        self.is_released = False

    def check_branch(self, name: str) -> int:
        """The branch's local slot; raises on an undeclared branch."""
        slot = self.cache.branch_slots.get(name) if isinstance(name, str) else None
        if slot is None:
            known = ", ".join(b.name for b in self.cache.spec.kv_branches)
            raise KVStateError(f"branch {name!r} is not declared by the spec (declared: {known})")
        return slot

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

    def branch(self, name: str) -> BranchT:
        """The branch's history, created on first use (claims its slot)."""
        kv = self.branches.get(name)
        if kv is not None:  # it claimed its slot when it was created
            return kv
        self.claim_slot(name)
        kv = self.branches[name] = self.cache.new_branch(self.session_id, name)
        return kv

    def num_committed_frames(self, name: str) -> int:
        kv = self.branches.get(name)
        return 0 if kv is None else kv.num_committed_frames
