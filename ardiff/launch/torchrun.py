"""A rank started by `torchrun` (`runtime.parallel.launcher: env`): every process runs the
same `ardiff rollout` command; rank 0 gathers the ranks' results and reports the job.

    torchrun --standalone --nproc_per_node 2 -m ardiff_cli.main rollout run.yaml \
        --set runtime.parallel.launcher=env

torchrun owns the processes: its agent stops the others when one exits with an error.
A data-parallel rank that fails still reaches the final gather (its files finalised), so
rank 0's report names it; its peers finish their own streams first (with `spawn` the
parent stops them at once). The ranks of a CFG group stop together as with `spawn`. A
rank's own signal (the CLI's stop) is its result's `signal`: the job is `interrupted`. The
ranks meet within `timeout_s`; a result that never reaches rank 0 (a rank that failed
before the others arrived, a gather that failed) is named in rank 0's report.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ardiff.config.run import RunConfig
from ardiff.distributed.env import rank_from_env
from ardiff.distributed.group import Groups, leave_groups
from ardiff.distributed.topology import replica_streams
from ardiff.launch.merge import JobOutcome, RankResult, merge
from ardiff.launch.parent import prepare_job
from ardiff.launch.stop import RankStop
from ardiff.launch.worker import RankJob, run_rank
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.report import RolloutReport
from ardiff.rollout.stop import RolloutStop


def run_torchrun_rank(config: RunConfig, on_event: Callable[[ProgressEvent], None] | None = None,
                      stop: RolloutStop | None = None) -> RolloutReport:
    """Run this torchrun rank's share; rank 0 returns the job's report, the others their
    own (`is_primary` False: the CLI writes nothing for them)."""
    rank = rank_from_env(config.runtime.parallel, os.environ)
    job = prepare_job(config, [rank])
    rank_stop = RankStop(follow=stop)
    if stop is not None:
        stop.phase = "rollout"  # a signal becomes a request the CFG group agrees on
    rank_job = RankJob(config, rank, job.backend, "env://", job.threads,
                       config.runtime.parallel.timeout_s)
    try:
        result = run_rank(rank_job, rank_stop, on_event or (lambda event: None))
        result["signal"] = None if stop is None else stop.reason
        results = _gather(result, rank.world_size, rank_stop.groups)
    finally:
        leave_groups()
    if rank.rank != 0:  # its own line only, naming it: rank 0 reports the job
        error = result["report"]["error"]
        return RolloutReport(status=result["report"]["status"],
                             error=None if error is None else f"rank {rank.rank}: {error}",
                             exit_code=result["report"]["exit_code"], is_primary=False)
    outcome = JobOutcome(stop_reason=None if stop is None else stop.reason)
    for each in results:
        outcome.add_result(each)
    assert job.report.parallel is not None, "prepare_job describes the parallel job"
    job.report.parallel["workers"] = rank.workers
    streams = {r: replica_streams(r // rank.cfg, rank.workers, len(job.outputs))
               for r in range(rank.world_size)}
    return merge(outcome, job.report, streams, job.outputs)


def _gather(result: RankResult, world_size: int, groups: Groups | None) -> list[RankResult]:
    """Every rank's result at rank 0 (others get an empty list); what rank 0 has when a
    peer is gone (its own result: merge names the ranks whose result never came)."""
    import torch.distributed as dist

    if not dist.is_initialized():  # this rank failed before joining: report alone
        return [result]
    gathered: list[Any] | None = [None] * world_size if dist.get_rank() == 0 else None
    try:  # over the job's group: the ranks finish their streams far apart
        dist.gather_object(result, gathered, dst=0, group=None if groups is None else groups.job)
    except Exception:  # noqa: BLE001 - a peer gone; torchrun's agent ends the others
        return [result]
    return list(gathered or [])
