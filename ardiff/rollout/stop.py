"""A cooperative stop shared by a caller (the CLI's signal handler) and one rollout job.

    stop = RolloutStop(); run_rollout(config, stop=stop)   # elsewhere: stop.request("SIGTERM")

The job polls it at its safe points and publishes where it is in `phase`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.rollout.gate import FileGate

INTERRUPTIBLE_PHASES = ("loading", "warmup")  # nothing on disk yet: an exception costs nothing


class RolloutStop:
    """`request(reason)` asks the job to stop at its next safe point; it only sets an
    attribute, so a signal handler may call it. `reason` is the first request (None: go
    on). `phase` is set by the job: `loading`, `warmup`, `rollout`, `finalising` (a file is
    being finished), `closing` (every file is; the pipeline closes its sessions), `done`;
    `is_interruptible` says whether a KeyboardInterrupt raised now would find no file
    open (the job still reports it as `interrupted`). `gate` is the job's `FileGate` once
    it has one: whether it runs pipeline code now, and a takeover of its files if that
    code never returns (ardiff.rollout.gate).
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self.requests = 0  # how often a caller asked (2: a second stop signal came)
        self.ranks = 0  # a parallel job's parent: its ranks (a 2nd request ends their blocks)
        self.phase = "loading"
        self.gate: FileGate | None = None

    def request(self, reason: str = "a stop request") -> None:
        self.requests += 1
        if self.reason is None:
            self.reason = reason

    @property
    def is_interruptible(self) -> bool:
        return self.phase in INTERRUPTIBLE_PHASES

    def poll(self) -> str | None:
        """The reason to stop, read at a safe point (a rank's stop agrees on it with its
        peers here, so the ranks of a CFG group stop at the same block)."""
        return self.reason
