"""One rank of a parallel job: join the groups, run its share, report to the parent.

    parent  --(pipe: "stop <reason>" | closed)-->  rank
    rank    --(pipe: progress, then one result)-->  parent

A spawned rank ignores SIGINT and SIGHUP (a terminal's Ctrl-C reaches the whole process
group; the parent alone decides) and stops after its block in flight when the parent asks
or its pipe closes, so no rank outlives its parent. SIGTERM, sent to a stuck rank, raises
KeyboardInterrupt where it is stuck, so it still finalises its files and gives its pages
back before the parent's SIGKILL. A torchrun rank (launcher: env) runs `run_rank` too,
without a pipe.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Sequence

from ardiff.config.run import RunConfig, with_base_dir
from ardiff.distributed.context import ParallelContext, PeerLostError
from ardiff.distributed.group import Groups, join_groups, leave_groups
from ardiff.distributed.topology import RankInfo, rank_budget, rank_device
from ardiff.engine.device import resolve_device
from ardiff.errors import EXIT_FAILED, ArdiffError
from ardiff.launch.merge import RankResult
from ardiff.launch.stop import RankStop
from ardiff.rollout.job import run_rollout
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.share import JobShare

START_S = 300.0  # a rank may take this long to start, load and build (timeout_s counts after)


@dataclass(frozen=True)
class RankJob:
    """What the parent hands a rank (picklable)."""

    config: RunConfig
    rank: RankInfo
    backend: str
    init_method: str
    threads: int
    timeout_s: float


def spawned_rank_main(job: RankJob, conn: Connection) -> None:
    """The target of a spawned rank process: run the share, send its result, leave."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _interrupt)
    # Blocked while we started (the forkserver was started with them blocked, and a fork
    # inherits the mask), so a Ctrl-C before the lines above could not end this rank.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGHUP})
    lock = threading.Lock()

    def send(message: tuple[str, object]) -> None:
        with lock:
            conn.send(message)

    stop = RankStop()
    threading.Thread(target=_follow_parent, args=(conn, stop), daemon=True).start()
    try:
        result = run_rank(job, stop, lambda event: send(("progress", progress_message(event))))
        send(("result", result))
    finally:
        leave_groups()  # after the result: a peer blocked on this rank raises now
        conn.close()


def _interrupt(signum: int, frame: object) -> None:
    signal.signal(signum, signal.SIG_DFL)  # once: a second SIGTERM ends the process
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _follow_parent(conn: Connection, stop: RankStop) -> None:
    """Turn the parent's "stop" message, or its end, into a stop request."""
    try:
        reason = conn.recv()
    except (EOFError, OSError):
        reason = "its parent process ended"
    stop.request(str(reason))


def run_rank(job: RankJob, stop: RankStop,
             on_event: Callable[[ProgressEvent], None]) -> RankResult:
    """Join the groups and run this rank's share of the rollout (the caller leaves the
    groups); return its result (plain data). Errors before the rollout starts (loading,
    capacity) become a failed result too: the parent decides what the job reports."""
    import torch  # the rank's threads are set from the job, right after

    torch.set_num_threads(job.threads)
    rank = job.rank
    config = _rank_config(job.config, rank)
    start = time.perf_counter()
    try:
        groups = join_groups(rank, job.backend, job.init_method, job.timeout_s,
                             config.runtime.device, start_timeout_s=max(job.timeout_s, START_S))
        stop.groups = groups
        share = JobShare(rank.replica, rank.workers, rank.writes, _context(rank, groups),
                         groups.agree_min)
        report = run_rollout(config, on_event=on_event, stop=stop, share=share)
        result = rank_result(job, report.to_dict(), report.block_latencies_s,
                             isinstance(report.exception, PeerLostError))
    except BaseException as exc:  # noqa: BLE001 - a rank's failure is data for the parent
        result = _failure(job, exc)
    result["wall_s"] = time.perf_counter() - start
    return result


def _rank_config(config: RunConfig, rank: RankInfo) -> RunConfig:
    """The config a rank runs: its own device, its share of a host's memory budget."""
    runtime = config.runtime
    device = rank_device(_resolved_device(runtime.device), rank.local_rank)
    budget = rank_budget(runtime.memory_budget, device, rank.local_world_size)
    runtime = dataclasses.replace(runtime, device=device, memory_budget=budget)
    return with_base_dir(dataclasses.replace(config, runtime=runtime), config.base_dir)


def _resolved_device(device: str) -> str:
    return resolve_device(device)


def _context(rank: RankInfo, groups: Groups) -> ParallelContext | None:
    if rank.cfg == 1:
        return None
    return ParallelContext(rank.cfg_rank, rank.cfg, groups.cfg, rank.rank)


def progress_message(event: ProgressEvent) -> dict[str, Any]:
    """A ProgressEvent as plain data (no frames: they stay with the rank that writes them)."""
    block = event.block
    return {"phase": event.phase, "frames_written": event.frames_written,
            "frames_total": event.frames_total,
            "stream": None if block is None else block.stream.index,
            "block_index": None if block is None else block.block_index,
            "latency_s": None if block is None else block.latency_s}


def rank_result(job: RankJob, report: dict[str, Any], latencies: Sequence[float] = (),
                peer_lost: bool = False, pid: int | None = None) -> RankResult:
    """A rank's result as plain data: who it was, its report (`to_dict()`, or only status,
    error and exit_code when it never got to a rollout), its block latencies."""
    rank = job.rank
    return {"rank": rank.rank, "replica": rank.replica, "cfg_rank": rank.cfg_rank,
            "writes": rank.writes, "pid": os.getpid() if pid is None else pid,
            "threads": job.threads,
            "device": rank_device(_resolved_device(job.config.runtime.device), rank.local_rank),
            "report": report, "block_latencies_s": list(latencies), "peer_lost": peer_lost}


def _failure(job: RankJob, exc: BaseException) -> RankResult:
    """A rank that raised before its rollout started (or outside it)."""
    if isinstance(exc, KeyboardInterrupt):
        status, code, error = "interrupted", 130, "interrupted"
    else:
        status = "failed"
        code = exc.exit_code if isinstance(exc, ArdiffError) else EXIT_FAILED
        error = str(exc) if isinstance(exc, ArdiffError) else f"{type(exc).__name__}: {exc}"
    return rank_result(job, {"status": status, "error": error, "exit_code": code},
                       peer_lost=isinstance(exc, PeerLostError))
