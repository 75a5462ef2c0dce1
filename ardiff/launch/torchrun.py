"""A rank started by `torchrun` (`runtime.parallel.launcher: env`): every process runs the
same `ardiff rollout` command; rank 0 gathers the ranks' results and reports the job.

    torchrun --standalone --nproc_per_node 2 "$(which ardiff)" rollout run.yaml \
        --set runtime.parallel.launcher=env

torchrun owns the processes: its agent stops the others when one exits with an error.
A data-parallel rank that fails still reaches the final gather (its files finalised), so
rank 0's report names it; its peers finish their own streams first (with `spawn` the
parent stops them at once). The ranks of a CFG group stop together as with `spawn`. A
rank's own signal (the CLI's stop) is its result's `signal`: the job is `interrupted`. The
ranks meet within `timeout_s`; a result that never reaches rank 0 (a rank that failed
before the others arrived, a gather that failed) is named in rank 0's report. Rank 0
alone says the job's error, and writes it where torchrun's summary reads it; a rank whose
result reached rank 0 ends quietly with 0 (one that could not tell rank 0 says its own).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping

from ardiff.config.run import RunConfig
from ardiff.distributed.env import rank_from_env
from ardiff.distributed.group import Groups, leave_groups
from ardiff.distributed.topology import replica_streams
from ardiff.launch.merge import JobOutcome, RankResult, merge
from ardiff.launch.parent import prepare_job
from ardiff.launch.stop import RankStop
from ardiff.launch.worker import MEETING, RankJob, run_rank
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.report import RolloutReport
from ardiff.rollout.stop import RolloutStop


def run_torchrun_rank(config: RunConfig, on_event: Callable[[ProgressEvent], None] | None = None,
                      stop: RolloutStop | None = None) -> RolloutReport:
    """Run this torchrun rank's share; rank 0 returns the job's report, the others their
    own (`is_primary` False: the CLI writes nothing for them)."""
    rank = rank_from_env(config.runtime.parallel, os.environ)
    job = prepare_job(config, [rank])
    rank_stop = RankStop(follow=stop, on_phase=_mirror(stop))
    rank_job = RankJob(config, rank, job.backend, "env://", job.threads,
                       config.runtime.parallel.timeout_s)
    try:
        result = run_rank(rank_job, rank_stop, on_event or (lambda event: None))
        result["signal"] = None if stop is None else stop.reason
        results, delivered = _gather(result, rank.world_size, rank_stop.groups)
    finally:
        leave_groups()
    if rank.rank != 0:
        return _peer_report(result, rank.rank, delivered)
    outcome = JobOutcome(stop_reason=None if stop is None else stop.reason)
    for each in results:
        outcome.add_result(each)
    assert job.report.parallel is not None, "prepare_job describes the parallel job"
    job.report.parallel["workers"] = rank.workers
    streams = {r: replica_streams(r // rank.cfg, rank.workers, len(job.outputs))
               for r in range(rank.world_size)}
    report = merge(outcome, job.report, streams, job.outputs)
    if report.status != "ok":
        record_for_torchrun(report.error or report.status, os.environ)
    return report


def _mirror(stop: RolloutStop | None) -> Callable[[str], None] | None:
    """The rank's phases, passed on to the caller's stop (the CLI's signals read it): while
    the rank loads or warms up a signal stops it at once (nothing is on disk: torchrun's
    SIGTERM to a rank stuck loading ends it), from its rollout on it is a request the CFG
    group agrees on."""
    if stop is None:
        return None

    def follow(phase: str) -> None:
        if phase != MEETING:  # waiting in a collective: still the phase it was
            stop.phase = phase

    return follow


def _peer_report(result: RankResult, rank: int, delivered: bool) -> RolloutReport:
    """What a rank other than 0 ends with. Its result reached rank 0, which reports the job:
    no line, exit 0 (a non-zero exit would have torchrun's agent stop rank 0 while it writes
    the stats, and list the failure twice). Interrupted without reaching rank 0 (torchrun
    ends the job's other ranks once one has failed or gone): no line either (rank 0, or
    torchrun's summary of it, says why), its code. Else its own line, naming it, its code."""
    report = result["report"]
    if delivered or report["status"] == "ok":
        return RolloutReport(status=report["status"], error=None, exit_code=0,
                             is_primary=False)
    if report["status"] == "interrupted":
        return RolloutReport(status=report["status"], error=None,
                             exit_code=report["exit_code"], is_primary=False)
    return RolloutReport(status=report["status"], error=f"rank {rank}: {report['error']}",
                         exit_code=report["exit_code"], is_primary=False)


def record_for_torchrun(error: str, environ: Mapping[str, str]) -> None:
    """Write the job's one error line where torchrun's agent reads a failed rank's reason
    (TORCHELASTIC_ERROR_FILE), so its failure summary quotes it rather than pointing at a
    traceback there is none of. Nothing when torchrun set no such file."""
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    line = " ".join(error.split())  # shown as the failure's "traceback": there is none
    record = {"message": line, "extraInfo": {"py_callstack": line,
                                             "timestamp": str(int(time.time()))}}
    try:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"message": record}, file)
    except OSError:  # torchrun's summary then says less; the job's own report is whole
        pass


def _gather(result: RankResult, world_size: int,
            groups: Groups | None) -> tuple[list[RankResult], bool]:
    """Every rank's result at rank 0 (others get an empty list), and whether this rank's
    result reached rank 0; what rank 0 has when a peer is gone (its own result: merge
    names the ranks whose result never came)."""
    import torch.distributed as dist

    if not dist.is_initialized():  # this rank failed before joining: report alone
        return [result], False
    gathered: list[Any] | None = [None] * world_size if dist.get_rank() == 0 else None
    try:  # over the job's group: the ranks finish their streams far apart
        dist.gather_object(result, gathered, dst=0, group=None if groups is None else groups.job)
    except Exception:  # noqa: BLE001 - a peer gone; torchrun's agent ends the others
        return [result], False
    return list(gathered or []), True
