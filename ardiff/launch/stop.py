"""A rank's stop: set by its parent (or a signal), agreed on by its CFG group.

The ranks of a CFG group all-gather every denoising step, so they must stop at the same
block: at each safe point they all-reduce "does any of us want to stop?" (a few bytes,
once per block). Data-parallel replicas share nothing mid-run and stop on their own.
Each phase the job enters is passed to `on_phase` (a spawned rank tells its parent, which
ends a rank that still loads when the job stops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ardiff.rollout.stop import RolloutStop

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.distributed.group import Groups

PEER_STOPPED = "a stop of its CFG peer"


class RankStop(RolloutStop):
    """`poll()` is collective when `groups` has a CFG group: call it at the same points on
    every rank of the group (`run_rollout` does: the ranks run the same blocks)."""

    def __init__(self, follow: RolloutStop | None = None,
                 on_phase: Callable[[str], None] | None = None) -> None:
        self.on_phase = on_phase  # before the base sets the first phase
        super().__init__()
        self.groups: Groups | None = None  # once joined
        self.follow = follow  # a caller's stop (torchrun: the CLI's), read at each poll

    @property  # an attribute of RolloutStop, watched here
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        self._phase = phase
        if self.on_phase is not None:
            self.on_phase(phase)

    def poll(self) -> str | None:
        if self.follow is not None and self.follow.reason is not None:
            self.request(self.follow.reason)
        groups = self.groups
        if groups is None or groups.cfg is None:
            return self.reason
        wanted = groups.reduce(int(self.reason is not None), "MAX", groups.cfg)
        if wanted and self.reason is None:
            self.request(PEER_STOPPED)
        return self.reason
