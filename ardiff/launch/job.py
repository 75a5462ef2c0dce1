"""`run_job`: the one entry for a rollout job, in this process or in several.

With `runtime.parallel` asking for one process, the job is `run_rollout`'s; with more
(or `launcher: env`), `run_parallel_rollout` spawns or joins the ranks, each of which
runs its share through `run_rollout`, and merges their reports.
"""

from __future__ import annotations

from typing import Callable

from ardiff.config.run import RunConfig
from ardiff.rollout.job import needs_processes, run_rollout
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.report import RolloutReport
from ardiff.rollout.stop import RolloutStop


def run_job(config: RunConfig, on_event: Callable[[ProgressEvent], None] | None = None,
            stop: RolloutStop | None = None) -> RolloutReport:
    """Run the whole job the config describes and return its (merged) report."""
    if needs_processes(config):
        from ardiff.launch.parent import run_parallel_rollout  # spawns: only when asked

        return run_parallel_rollout(config, on_event, stop)
    return run_rollout(config, on_event, stop)
