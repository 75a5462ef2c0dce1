"""The parent of a spawned parallel job: check, spawn the ranks, supervise them, merge.

    report = run_parallel_rollout(config, on_event, stop)

What a one-process run checks, plus the parallel knobs (workers per prompt, devices per
rank, backend), is checked first: bad input exits 2 before any process starts. Then the
ranks start and are followed until each has a result (ardiff.launch.supervisor), and
their results become one report (ardiff.launch.merge): `ok` only if every rank is. No
rank outlives the parent: a parent killed outright leaves ranks that stop on their own
(ardiff.launch.worker).
"""

from __future__ import annotations

import os
import socket
from typing import Callable

from ardiff.config.run import RunConfig
from ardiff.distributed.topology import (
    RankInfo,
    check_devices,
    check_streams,
    local_ranks,
    pick_backend,
    rank_threads,
)
from ardiff.engine.device import resolve_device, resolve_dtype
from ardiff.launch.merge import merge, no_sessions, unallocated_kv
from ardiff.launch.supervisor import Supervisor
from ardiff.launch.worker import RankJob
from ardiff.rollout.job import prepare_rollout
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.report import RolloutReport
from ardiff.rollout.stop import RolloutStop
from ardiff.rollout.streams import RolloutPlan


def run_parallel_rollout(config: RunConfig, on_event: Callable[[ProgressEvent], None] | None = None,
                         stop: RolloutStop | None = None) -> RolloutReport:
    """Run the job in `runtime.parallel.workers * cfg` processes; return the merged report.
    Raises ardiff errors only before any process starts."""
    if config.runtime.parallel.launcher == "env":
        from ardiff.launch.torchrun import run_torchrun_rank

        return run_torchrun_rank(config, on_event, stop)
    stop = stop or RolloutStop()
    job = prepare_job(config, local_ranks(config.runtime.parallel))
    rendezvous = f"tcp://127.0.0.1:{free_port()}"
    jobs = [RankJob(config, rank, job.backend, rendezvous, job.threads,
                    config.runtime.parallel.timeout_s) for rank in job.ranks]
    stop.phase = "rollout"  # from here a signal is a request that every rank hears
    stop.ranks = len(jobs)
    supervisor = Supervisor(jobs, on_event or (lambda event: None), stop,
                            job.report.frames_requested)
    outcome = supervisor.run()
    stop.phase = "finalising"
    report = merge(outcome, job.report, job.streams, job.outputs)
    stop.phase = "done"
    if on_event is not None:
        on_event(ProgressEvent("done", report.frames_written, report.frames_requested))
    return report


class PreparedJob:
    """A checked parallel job: its ranks, backend, threads per rank, the streams of each
    rank, the planned outputs and the report to fill."""

    def __init__(self, config: RunConfig, ranks: list[RankInfo], plan: RolloutPlan, device: str,
                 threads: int) -> None:
        parallel = config.runtime.parallel
        self.ranks, self.threads = ranks, threads
        self.backend = pick_backend(parallel.backend, device)
        self.streams = {rank.rank: rank.streams(len(plan.streams)) for rank in ranks}
        self.outputs = [stream.output_path for stream in plan.streams]
        self.report = RolloutReport(pipeline=config.pipeline.entry, device=device,
                                    dtype=resolve_dtype(config.runtime.dtype, device),
                                    frames_requested=plan.frames * len(plan.streams),
                                    output_fps=config.output.fps)
        self.report.kv = unallocated_kv(config.runtime.kv.backend)  # until a rank has one
        self.report.sessions = no_sessions()
        self.report.parallel = {"workers": ranks[0].workers, "cfg": parallel.cfg,
                                "world_size": ranks[0].world_size,
                                "launcher": parallel.launcher, "backend": self.backend,
                                "threads_per_rank": threads, "timeout_s": parallel.timeout_s}


def prepare_job(config: RunConfig, ranks: list[RankInfo]) -> PreparedJob:
    """Every check before a process starts (exit 2 / 3 on bad input)."""
    parallel = config.runtime.parallel
    _resolved, plan = prepare_rollout(config)
    check_streams(ranks[0].workers, len(plan.streams))
    device = resolve_device(config.runtime.device)
    if device != "cpu":
        import torch

        check_devices(device, ranks[0].local_world_size, torch.cuda.device_count())
    threads = rank_threads(parallel.threads, host_cores(), ranks[0].local_world_size)
    return PreparedJob(config, ranks, plan, device, threads)


def host_cores() -> int:
    """Cores this process may run on (its affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def free_port() -> int:
    """A TCP port free on this host now, for the ranks' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]  # (host, port) for AF_INET
        return port

