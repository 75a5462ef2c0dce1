"""The parent of a spawned parallel job: check, spawn the ranks, supervise them, merge.

    report = run_parallel_rollout(config, on_event, stop)

What a one-process run checks, plus the parallel knobs (workers per prompt, devices per
rank, backend), is checked first: bad input exits 2 before any process starts. The
`workers * cfg` ranks start from a forkserver that imported torch once and meet over TCP
on this host. Every `POLL_S` the parent sums their progress into `on_event`; a failed or
ended rank, or a stop request, makes it ask every other rank to stop after its block in
flight (a CFG peer blocked on a lost rank raises at once); a rank silent for `timeout_s`
(`START_S` while it starts) is failed and killed. No rank outlives the parent.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable

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
from ardiff.errors import EXIT_FAILED
from ardiff.launch.merge import JobOutcome, merge
from ardiff.launch.worker import START_S, RankJob, rank_result, spawned_rank_main
from ardiff.rollout.job import prepare_rollout
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.report import RolloutReport
from ardiff.rollout.stop import RolloutStop
from ardiff.rollout.streams import RolloutPlan

POLL_S = 0.25          # how often the parent looks at its ranks
KILL_GRACE_S = 3.0     # a rank asked to end (SIGTERM) has this long before SIGKILL
PRELOAD = ["torch", "ardiff.rollout.job", "ardiff.launch.worker"]  # the forkserver imports them once


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


class Supervisor:
    """Starts the ranks and watches them until each has sent its result or ended."""

    def __init__(self, jobs: list[RankJob], emit: Callable[[ProgressEvent], None],
                 stop: RolloutStop, frames_total: int) -> None:
        self.jobs = {job.rank.rank: job for job in jobs}
        self.emit, self.stop, self.frames_total = emit, stop, frames_total
        self.outcome = JobOutcome()
        self.procs: dict[int, BaseProcess] = {}
        self.conns: dict[int, Connection] = {}
        self.heard: dict[int, float] = {}
        self.running: set[int] = set()  # ranks past loading: warming up or rolling out
        self.frames: dict[int, int] = {}
        self.phase = "warmup"
        self.stop_sent = False

    def run(self) -> JobOutcome:
        try:
            self._start()
            while self._pending():
                wait([*self._live_conns(), *(self.procs[r].sentinel for r in self._pending())],
                     timeout=POLL_S)
                self._step()
        finally:
            self._end_all()
        return self.outcome

    def _start(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("forkserver")
        # A fresh interpreter (not a fork of this process and its threads) that imported
        # torch and the rollout once, so no rank pays torch's import again (measured in
        # docs/several-devices.md).
        context.set_forkserver_preload(PRELOAD)
        # Started with SIGINT/SIGHUP blocked (a spawned interpreter inherits the mask), so a
        # Ctrl-C while a rank imports cannot kill it before it ignores them.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGHUP})
        try:
            for rank, job in self.jobs.items():
                parent_end, child_end = context.Pipe()
                proc = context.Process(target=spawned_rank_main, args=(job, child_end),
                                       name=f"ardiff-rank-{rank}", daemon=True)
                proc.start()
                child_end.close()
                self.procs[rank], self.conns[rank] = proc, parent_end
                self.heard[rank] = time.monotonic()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _pending(self) -> list[int]:
        return [r for r in self.jobs if r not in self.outcome.results]

    def _live_conns(self) -> list[Connection]:
        return [self.conns[r] for r in self._pending() if not self.conns[r].closed]

    def _step(self) -> None:
        for rank in self._pending():
            self._read(rank)
        for rank in self._pending():
            if not self.procs[rank].is_alive():
                self._read(rank)  # what it sent before it ended
                if rank in self._pending():
                    self._fail(rank, f"its process ended without a result (exit code "
                                     f"{self.procs[rank].exitcode})")
        self._check_silence()
        self._pass_on_stops()

    def _read(self, rank: int) -> None:
        conn = self.conns[rank]
        try:
            while not conn.closed and conn.poll():
                kind, payload = conn.recv()
                self.heard[rank] = time.monotonic()
                if kind == "progress":
                    self._progress(rank, payload)
                else:
                    self.outcome.add_result(payload)
        except (EOFError, OSError):
            conn.close()

    def _progress(self, rank: int, message: dict[str, Any]) -> None:
        self.running.add(rank)
        if message["phase"] == "done" or not self.jobs[rank].rank.writes:
            return
        if message["phase"] == "rollout":
            self.phase = "rollout"
            self.frames[rank] = message["frames_written"]
        self.emit(ProgressEvent(self.phase, sum(self.frames.values()), self.frames_total))

    def _check_silence(self) -> None:
        timeout_s = next(iter(self.jobs.values())).timeout_s
        now = time.monotonic()
        for rank in self._pending():
            limit = timeout_s if rank in self.running else max(timeout_s, START_S)
            if now - self.heard[rank] > limit:
                self._fail(rank, f"no progress for {timeout_s:g} s (runtime.parallel.timeout_s); "
                                 f"it was stopped")
                _end(self.procs[rank])

    def _fail(self, rank: int, message: str) -> None:
        """A rank that will send no result (it ended, or is stuck): the parent writes it."""
        report = {"status": "failed", "error": message, "exit_code": EXIT_FAILED}
        self.outcome.add_result(rank_result(self.jobs[rank], report, pid=self.procs[rank].pid))

    def _pass_on_stops(self) -> None:
        if self.stop_sent:
            return
        reason = self.stop.reason
        if reason is not None:
            self.outcome.stop_reason = reason
        elif self.outcome.failures:
            reason = f"rank {self.outcome.failures[0].rank} failed"
        if reason is None:
            return
        self.stop_sent = True
        for rank in self._pending():
            try:
                self.conns[rank].send(reason)
            except (OSError, ValueError):
                pass  # it is ending; its sentinel says so

    def _end_all(self) -> None:
        for proc in self.procs.values():
            proc.join(timeout=KILL_GRACE_S)
            _end(proc)
        for conn in self.conns.values():
            conn.close()


def _end(proc: BaseProcess) -> None:
    """SIGTERM, then SIGKILL after a grace period: no rank outlives the job."""
    if proc.is_alive():
        proc.terminate()
        proc.join(KILL_GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()

