"""The part of a job one process runs: a rank of `ardiff.launch` passes its share to
`run_rollout`; a single-process job runs the default share (everything)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ardiff.rollout.streams import RolloutPlan

if TYPE_CHECKING:
    from ardiff.distributed.context import ParallelContext


@dataclass(frozen=True)
class JobShare:
    """The streams `i` with `i % workers == replica`; `writes`: whether this process encodes
    them (one rank per CFG group); `context`: the pipeline's CFG-parallel context;
    `agree_min`: the minimum of an integer over the ranks (the session capacity, so every
    rank's LRU decides alike)."""

    replica: int = 0
    workers: int = 1
    writes: bool = True
    context: ParallelContext | None = None
    agree_min: Callable[[int], int] | None = None

    def select(self, plan: RolloutPlan) -> RolloutPlan:
        streams = tuple(s for s in plan.streams if s.index % self.workers == self.replica)
        return dataclasses.replace(plan, streams=streams)
