"""One live session of `ardiff serve`: its state, its block walker, its client queue, its video.

    active --pause--> paused --resume--> active
    active --all frames made--> done            (KV pages back; the video finished)
    active --the forward raised--> failed       (the runner released it: fail-closed)
    any --DELETE, idle timeout, shutdown--> closed   (hooks run, pages back, record gone)

The manager (`ardiff.serve.manager`) owns every transition and calls the runner; a session
holds the numbers a client reads (`describe`). `public_id` is unguessable
(`secrets.token_urlsafe`); the runner and the files only ever see `session_id`, which the
server makes (`serve-<n>`), so nothing a client sends names a file.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ardiff.errors import ArdiffError
from ardiff.rollout.report import percentile
from ardiff.serve.blocks import BlockWalker
from ardiff.serve.frames import FrameQueue
from ardiff.serve.options import SessionOptions
from ardiff.serve.recording import Recording


class SessionRefused(ArdiffError):
    """No session slot or KV room is free (or the server is stopping): try again later."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnknownSession(ArdiffError):
    """No live session has this id."""


class SessionBusy(ArdiffError):
    """Another client streams this session."""


class SessionExists(ArdiffError):
    """A session with the id a client chose exists already."""


LATENCY_WINDOW_BLOCKS = 1024  # the latency percentiles a session reports: its recent blocks
TIMING_WINDOW_BLOCKS = 64     # the per-block timings a session reports: its most recent


class State(enum.Enum):
    ACTIVE = "active"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    CLOSED = "closed"

    @property
    def is_final(self) -> bool:
        return self in (State.DONE, State.FAILED, State.CLOSED)


@dataclass
class ServeSession:
    """A session's record; the manager's lock guards every field that changes."""

    public_id: str
    session_id: str
    options: SessionOptions
    walker: BlockWalker
    queue: FrameQueue
    recording: Recording
    state: State = State.ACTIVE
    error: str | None = None
    created_s: float = field(default_factory=time.monotonic)
    idle_since_s: float = field(default_factory=time.monotonic)
    next_tick_s: float = field(default_factory=time.monotonic)  # paced: when its next block may run
    last_run_s: float = 0.0     # when its last block ran (round-robin order)
    clients: int = 0
    frames_made: int = 0        # video frames handed to the client queue and the recording
    blocks: int = 0
    close_requested: bool = False
    roll_requested: bool = False
    kv_pages: int = 0           # the runner's count after its last block (the scheduler's)
    latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW_BLOCKS))
    timings: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=TIMING_WINDOW_BLOCKS))

    def add_timing(self, block: int, started_s: float, ended_s: float, forward_s: float,
                   rows: int, stages_s: Any = None) -> None:
        """One block's times (monotonic `started_s`, `ended_s`), kept as seconds since the
        session was created; `stages_s`: the pipeline's own stage times, when it gives them
        (`BlockOutput.extra["stage_times_s"]`, a mapping of name to seconds)."""
        timing: dict[str, Any] = {
            "block": block, "start_s": round(started_s - self.created_s, 6),
            "end_s": round(ended_s - self.created_s, 6), "forward_s": round(forward_s, 6),
            "rows": rows}
        if isinstance(stages_s, dict):
            timing["stages_s"] = {str(name): round(float(value), 6)
                                  for name, value in stages_s.items()
                                  if isinstance(value, (int, float))}
        self.timings.append(timing)

    @property
    def is_runnable(self) -> bool:
        return self.state is State.ACTIVE and not self.close_requested

    def is_due(self, now_s: float) -> bool:
        return self.is_runnable and (self.options.mode == "fast" or now_s >= self.next_tick_s)

    def describe(self, pages: int) -> dict[str, Any]:
        """What `GET /v1/sessions/{id}` returns."""
        latencies = list(self.latencies_s)
        return {
            "id": self.public_id, "status": self.state.value, "mode": self.options.mode,
            "frames": self.frames_made, "frames_requested": self.options.frames,
            "blocks": self.blocks, "fps": self.options.fps, "clients": self.clients,
            "frames_dropped": self.queue.dropped, "queued_frames": len(self.queue),
            "latency_ms": {name: None if value is None else round(value * 1e3, 3)
                           for name, value in (("p50", percentile(latencies, 50)),
                                               ("p95", percentile(latencies, 95)),
                                               ("max", max(latencies, default=None)))},
            "kv_pages": pages, "error": self.error, "timings": list(self.timings),
        }
