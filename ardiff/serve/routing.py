"""The front's routing table: which worker holds each session, and the sessions lost with one.

    table = RouteTable()
    table.add("kV4...", worker=1, generation=0)   # placed: its every request goes to worker 1
    table.get("kV4...")                           # Route(worker=1, generation=0, ...)
    table.fail_worker(1, "worker 1 died ...")     # its ids move to `lost` (newest MAX_LOST)
    table.lost_error("kV4...")                    # (1, "worker 1 died ...") for its client

Plain bookkeeping: no lock (the pool's guards it), no processes, no HTTP. A route names the
worker's generation (its restarts), so a session never reaches a restarted worker that
does not hold it.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

MAX_LOST = 10_000  # records of sessions lost with a worker, kept for their clients


@dataclass
class Route:
    worker: int
    generation: int
    added_s: float = field(default_factory=time.monotonic)


class RouteTable:
    """id -> Route of every live session, and id -> (worker, why) of lost ones."""

    def __init__(self, max_lost: int = MAX_LOST) -> None:
        self.routes: dict[str, Route] = {}
        self.lost: collections.OrderedDict[str, tuple[int, str]] = collections.OrderedDict()
        self.max_lost = max_lost

    def add(self, session_id: str, worker: int, generation: int) -> None:
        self.routes[session_id] = Route(worker, generation)
        self.lost.pop(session_id, None)

    def get(self, session_id: str) -> Route | None:
        return self.routes.get(session_id)

    def forget(self, session_id: str) -> None:
        """The session is closed (or its worker no longer has it): no route, no record."""
        self.routes.pop(session_id, None)
        self.lost.pop(session_id, None)

    def remember_lost(self, session_id: str, worker: int, error: str) -> None:
        self.lost[session_id] = (worker, error)
        while len(self.lost) > self.max_lost:
            self.lost.popitem(last=False)

    def lost_error(self, session_id: str) -> tuple[int, str] | None:
        return self.lost.get(session_id)

    def lost_sessions(self) -> list[tuple[str, int, str]]:
        """(id, worker, why) of every session lost with its worker, oldest first."""
        return [(sid, worker, error) for sid, (worker, error) in self.lost.items()]

    def counts(self, workers: int) -> list[int]:
        """Sessions routed to each of `workers` workers now."""
        counts = [0] * workers
        for route in self.routes.values():
            counts[route.worker] += 1
        return counts

    def fail_worker(self, worker: int, error: str | None) -> list[str]:
        """The worker ended: its routes go; with `error` (it died) each id is remembered as
        lost with it (None: it stopped cleanly, its sessions were closed). Returns the ids."""
        ids = [sid for sid, route in self.routes.items() if route.worker == worker]
        for sid in ids:
            del self.routes[sid]
            if error is not None:
                self.remember_lost(sid, worker, error)
        return ids

    def drop_missing(self, worker: int, generation: int, asked_s: float,
                     held: set[str]) -> None:
        """Forget routes to `worker` (this generation, added before `asked_s`) of sessions
        it no longer holds (`held`: its ids when asked), closed when idle or done."""
        for sid, route in list(self.routes.items()):
            if (route.worker == worker and route.generation == generation
                    and route.added_s < asked_s and sid not in held):
                del self.routes[sid]
