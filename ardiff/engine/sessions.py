"""The runner's session map: least-recently-used order and lifecycle counters."""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field


class Release(enum.Enum):
    """Why a session's KV and model state were released."""

    RESET = "reset"        # request.reset: the pipeline's reset hook
    CLOSED = "closed"      # request.close_session after a successful block
    EVICTED = "evicted"    # least recently used when a new session needed room
    FAILED = "failed"      # the forward (or the synchronize after it) raised


@dataclass
class SessionInfo:
    """What the runner knows of a resident session."""

    session_id: str
    blocks: int = 0
    frame_size: tuple[int, int] | None = None  # (H, W) of its first output, kept for the rest


@dataclass
class SessionCounts:
    created: int = 0
    reset: int = 0
    closed: int = 0
    evicted: int = 0
    failed: int = 0
    resident: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class SessionMap:
    """Resident sessions in LRU order (oldest first), bounded by `capacity`."""

    capacity: int
    uncounted: frozenset[str] = frozenset()  # e.g. the warmup session: not a user's session
    counts: SessionCounts = field(default_factory=SessionCounts)
    _sessions: OrderedDict[str, SessionInfo] = field(default_factory=OrderedDict)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def session_ids(self) -> list[str]:
        return list(self._sessions)

    @property
    def is_full(self) -> bool:
        return len(self._sessions) >= self.capacity

    def least_recently_used(self) -> str:
        return next(iter(self._sessions))

    def touch(self, session_id: str) -> SessionInfo:
        """Mark a session used now, creating it if new; returns its info."""
        info = self._sessions.get(session_id)
        if info is None:
            assert not self.is_full, "make room before creating a session"
            info = self._sessions[session_id] = SessionInfo(session_id)
            self.counts.created += session_id not in self.uncounted
        self._sessions.move_to_end(session_id)
        self.counts.resident = len(self._sessions)
        return info

    def remove(self, session_id: str, why: Release) -> None:
        del self._sessions[session_id]
        if session_id not in self.uncounted:
            setattr(self.counts, why.value, getattr(self.counts, why.value) + 1)
        self.counts.resident = len(self._sessions)
