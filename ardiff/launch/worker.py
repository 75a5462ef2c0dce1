"""One rank of a parallel job: join the groups, run its share, report to the parent.

    parent  --(pipe: "stop <reason>" | closed)-->  rank
    rank    --(pipe: phases, progress, then one result)-->  parent

A spawned rank ignores SIGINT and SIGHUP (a terminal's Ctrl-C reaches the whole process
group; the parent alone decides). It stops after its block in flight when the parent asks,
at once while it still loads or warms up (nothing on disk yet), and on its own when its
parent is gone (a rank that then cannot end is ended `timeout_s` later). SIGTERM, from
outside or from the parent to a stuck rank, raises KeyboardInterrupt where the rank is, so
it still finalises its files and gives its pages back; its result names a SIGTERM from
outside (`signal`), which makes the job `interrupted`. Nothing a rank sends can fail it: a
parent that is gone has no one to tell. A torchrun rank (launcher: env) runs `run_rank`
too, without a pipe.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any, Callable, Sequence

from ardiff.config.run import RunConfig, with_base_dir
from ardiff.distributed.context import ParallelContext, PeerLostError
from ardiff.distributed.group import Groups, join_groups, leave_groups
from ardiff.distributed.topology import RankInfo, rank_budget, rank_device
from ardiff.engine.device import resolve_device
from ardiff.errors import EXIT_FAILED, EXIT_INTERRUPTED, ArdiffError
from ardiff.launch.merge import RankResult
from ardiff.launch.stop import RankStop
from ardiff.rollout.interrupts import in_ardiffs_own_code
from ardiff.rollout.job import run_rollout
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.share import JobShare

KILL_GRACE_S = 3.0  # a rank asked to end has this long before it is killed
RETRY_S = 0.01  # a SIGTERM that found the rank in ardiff's code: raised again after this
STOP_NOW = signal.SIGUSR1  # sent by a rank to itself: the parent's stop, while it loads
MEETING = "meeting"  # told to the parent: waiting for every rank to load (no phase of its own)


@dataclass(frozen=True)
class RankJob:
    """What the parent hands a rank (picklable)."""

    config: RunConfig
    rank: RankInfo
    backend: str
    init_method: str
    threads: int
    timeout_s: float


class Outbox:
    """The rank's end of the pipe, for two threads; a send to a parent that is gone does
    nothing (the rank stops on its own: `_follow_parent`). A message is never cut: a
    SIGTERM that comes while the main thread writes one (`is_sending`) is `deferred` and
    raised once the message is whole (a half-written message would leave the parent
    waiting for the rest of it)."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock = conn, threading.Lock()
        self.is_sending = False  # the main thread is inside conn.send
        self.deferred: str | None = None  # a signal to raise once the send is done

    def send(self, kind: str, payload: object) -> None:
        main = threading.current_thread() is threading.main_thread()
        with self.lock:
            self.is_sending = main
            try:
                self.conn.send((kind, payload))
            except (OSError, ValueError):  # BrokenPipeError; closed
                pass
            finally:
                self.is_sending = False
        deferred, self.deferred = (self.deferred, None) if main else (None, self.deferred)
        if deferred is not None:
            raise KeyboardInterrupt(deferred)


class RankSignals:
    """SIGTERM raises KeyboardInterrupt where the rank is, once (a second one ends the
    process), and is remembered (`received`); STOP_NOW raises only while the rank may still
    be interrupted without losing anything (loading, warming up)."""

    def __init__(self, stop: RankStop, outbox: Outbox) -> None:
        self.stop, self.outbox = stop, outbox
        self.received: str | None = None
        signal.signal(signal.SIGTERM, self._terminate)
        signal.signal(STOP_NOW, self._stop_now)

    def _terminate(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.received = self.received or name
        if self.outbox.is_sending:  # mid-message: raised by the send, once it is whole
            signal.signal(signum, signal.SIG_DFL)
            self.outbox.deferred = name
            return
        if in_ardiffs_own_code(frame):  # its pages, sessions or files: not there
            self._again_soon(signum)
            return
        signal.signal(signum, signal.SIG_DFL)  # once: a second SIGTERM ends the process
        raise KeyboardInterrupt(name)

    def _again_soon(self, signum: int) -> None:
        """Send `signum` to the main thread again soon: its handler then finds the
        pipeline's code, or the rank settled (the signal is then ignored)."""
        main = threading.main_thread().ident
        assert main is not None, "the main thread runs"

        def resend() -> None:
            if signal.getsignal(signum) == self._terminate:
                signal.pthread_kill(main, signum)

        timer = threading.Timer(RETRY_S, resend)
        timer.daemon = True
        timer.start()

    def _stop_now(self, signum: int, frame: object) -> None:
        if not self.stop.is_interruptible:
            return
        reason = self.stop.reason or "a stop request"
        if self.outbox.is_sending:
            self.outbox.deferred = self.outbox.deferred or reason
            return
        raise KeyboardInterrupt(reason)

    def settle(self) -> None:
        """The result is made: a signal from now on changes nothing."""
        for signum in (signal.SIGTERM, STOP_NOW):
            signal.signal(signum, signal.SIG_IGN)


def spawned_rank_main(job: RankJob, conn: Connection) -> None:
    """The target of a spawned rank process: run the share, send its result, leave. Ends
    with no traceback whatever happens (exit 130 when interrupted outside the rollout)."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    outbox = Outbox(conn)
    stop = RankStop(on_phase=lambda phase: outbox.send("phase", phase))
    signals = RankSignals(stop, outbox)
    # Blocked while we started (the forkserver was started with them blocked, and a fork
    # inherits the mask), so a Ctrl-C before the lines above could not end this rank.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGHUP})
    follower = threading.Thread(target=_follow_parent, args=(conn, stop, job.timeout_s),
                                daemon=True)
    try:
        try:
            follower.start()  # a stop may come at once: from here it raises in a try
            result = run_rank(job, stop, lambda event: outbox.send("progress",
                                                                   progress_message(event)))
        except KeyboardInterrupt as exc:  # before run_rank could catch it
            result = _failure(job, exc)
        result["signal"] = signals.received
        signals.settle()
        outbox.send("result", result)
    except KeyboardInterrupt:  # between the rollout and the result: no result to send
        sys.exit(EXIT_INTERRUPTED)
    finally:
        _leave(conn)  # after the result: a peer blocked on this rank raises now


def _leave(conn: Connection) -> None:
    try:
        leave_groups()
    except Exception:  # noqa: BLE001 - a group torn down by a lost peer: nothing to leave
        pass
    conn.close()


def _follow_parent(conn: Connection, stop: RankStop, timeout_s: float) -> None:
    """Turn the parent's "stop" message, or its end, into a stop request: at once while
    the rank loads or warms up; and with no parent left, end a rank that does not end."""
    try:
        reason, orphaned = str(conn.recv()), False
    except (EOFError, OSError):
        reason, orphaned = "the end of its parent process", True
    stop.request(reason)
    main = threading.main_thread().ident
    if stop.is_interruptible and main is not None:
        signal.pthread_kill(main, STOP_NOW)
    if orphaned:
        _end_alone(stop, timeout_s)


def _end_alone(stop: RankStop, timeout_s: float) -> None:
    """No parent will end this rank: if it is still loading KILL_GRACE_S from now (stuck
    where no signal reaches: a rendezvous, a native call), or still running `timeout_s`
    from now (stuck in a block), it ends itself. A rank that ends first takes this
    thread with it."""
    start = time.monotonic()
    while True:
        time.sleep(KILL_GRACE_S / 10)
        waited = time.monotonic() - start
        if waited > timeout_s or (waited > KILL_GRACE_S and stop.is_interruptible):
            os._exit(EXIT_INTERRUPTED)


def run_rank(job: RankJob, stop: RankStop,
             on_event: Callable[[ProgressEvent], None]) -> RankResult:
    """Join the groups and run this rank's share of the rollout (the caller leaves the
    groups); return its result (plain data). Errors before the rollout starts (joining,
    loading, capacity) become a failed result too: the parent decides what the job
    reports."""
    start = time.perf_counter()
    rank = job.rank
    try:
        import torch  # the rank's threads are set from the job, right after

        torch.set_num_threads(job.threads)
        config = _rank_config(job.config, rank)
        groups = join_groups(rank, job.backend, job.init_method, job.timeout_s,
                             config.runtime.device, start_timeout_s=job.timeout_s)
        stop.groups = groups
        share = JobShare(rank.replica, rank.workers, rank.writes, _context(rank, groups),
                         _agreeing(groups, stop, job.timeout_s))
        report = run_rollout(config, on_event=on_event, stop=stop, share=share)
        result = rank_result(job, report.to_dict(), report.block_latencies_s,
                             isinstance(report.exception, PeerLostError))
    except BaseException as exc:  # noqa: BLE001 - a rank's failure is data for the parent
        result = _failure(job, exc)
    result["wall_s"] = time.perf_counter() - start
    return result


def _agreeing(groups: Groups, stop: RankStop, timeout_s: float) -> Callable[[int], int]:
    """`groups.agree_min`, said first to the parent (phase `meeting`): a rank waiting there
    for a peer still loading is not stuck (the wait ends within timeout_s by itself)."""
    def agree_min(value: int) -> int:
        if stop.on_phase is not None:
            stop.on_phase(MEETING)
        try:
            return groups.agree_min(value)
        except PeerLostError as exc:
            if not _timed_out(exc):
                raise
            raise PeerLostError(f"the other ranks did not all finish loading within "
                                f"runtime.parallel.timeout_s ({timeout_s:g} s); a pipeline "
                                f"that loads longer needs a larger one") from exc

    return agree_min


def _timed_out(exc: BaseException) -> bool:
    """Whether a collective failed by waiting too long (gloo: 'Timed out waiting ...'),
    not because a peer left."""
    cause = exc.__cause__
    return cause is not None and "timed out" in str(cause).lower()


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
                peer_lost: bool = False, pid: int | None = None,
                signal_name: str | None = None) -> RankResult:
    """A rank's result as plain data: who it was, its report (`to_dict()`, or only status,
    error and exit_code when it never got to a rollout), its block latencies, the signal
    from outside that stopped it (None: none did)."""
    rank = job.rank
    return {"rank": rank.rank, "replica": rank.replica, "cfg_rank": rank.cfg_rank,
            "writes": rank.writes, "pid": os.getpid() if pid is None else pid,
            "threads": job.threads,
            "device": rank_device(_resolved_device(job.config.runtime.device), rank.local_rank),
            "report": report, "block_latencies_s": list(latencies), "peer_lost": peer_lost,
            "signal": signal_name}


def _failure(job: RankJob, exc: BaseException) -> RankResult:
    """A rank that raised before its rollout started (or outside it)."""
    if isinstance(exc, KeyboardInterrupt):
        status, code = "interrupted", EXIT_INTERRUPTED
        error = f"interrupted by {exc}" if str(exc) else "interrupted"
    else:
        status = "failed"
        code = exc.exit_code if isinstance(exc, ArdiffError) else EXIT_FAILED
        error = str(exc) if isinstance(exc, ArdiffError) else f"{type(exc).__name__}: {exc}"
    return rank_result(job, {"status": status, "error": error, "exit_code": code},
                       peer_lost=isinstance(exc, PeerLostError))
