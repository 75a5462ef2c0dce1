"""The supervision of a spawned job's ranks: start them, follow them, stop them, end them.

    outcome = Supervisor(jobs, emit, stop, frames_total).run()

The `workers * cfg` ranks start from a forkserver that imported torch once and meet over
TCP on this host. Every `POLL_S` the supervisor reads what each rank said (its phase, its
progress, its result) and sums their frames into `emit`. A failed or interrupted rank, or
a stop request, makes it ask every other rank to stop after its block in flight (a CFG
peer blocked on a lost rank raises at once); a rank still loading or warming up stops at
once, and is killed if it has not `KILL_GRACE_S` later (it has nothing on disk). A second
stop request (a second signal to the command) sends SIGTERM to every rank still running, which
abandons the block it is stuck in and finalises its files; one still there `KILL_GRACE_S`
later (stuck in native code) is killed. A rank
silent for `timeout_s` (meeting the others, loading, warming up or in a block) is failed,
named with what it was doing, and ended; a rank that ends without a result is recorded by
what ended it (a stop signal: interrupted; another signal or an exit: failed). No rank
outlives the job.
"""

from __future__ import annotations

import signal
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable

from ardiff.errors import EXIT_FAILED, EXIT_INTERRUPTED
from ardiff.launch.merge import JobOutcome
from ardiff.launch.worker import (
    KILL_GRACE_S,
    MEETING,
    RankJob,
    rank_result,
    spawned_rank_main,
)
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.stop import INTERRUPTIBLE_PHASES, RolloutStop

POLL_S = 0.25          # how often the supervisor looks at its ranks
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # a rank they end was interrupted, not failed
SILENT_PHASES = {"loading": " while it loaded its pipeline", "warmup": " while it warmed up",
                 "rollout": " in its rollout", "finalising": " while it finalised its files",
                 "closing": " while its pipeline closed its sessions"}  # what a stuck rank did
PRELOAD = ["torch", "ardiff.rollout.job", "ardiff.launch.worker"]  # the forkserver imports them once


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
        self.phases: dict[int, str] = {}  # what each rank last said it was doing
        self.frames: dict[int, int] = {}
        self.phase = "warmup"
        self.stop_sent: str | None = None  # the reason every rank was asked to stop for
        self.stop_sent_at = 0.0
        self.killed: set[int] = set()  # ranks killed while they loaded (after a stop)
        self.pressed_at: float | None = None  # when a second stop request ended the ranks

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
                    self._ended(rank)
        self._check_silence()
        self._pass_on_stops()
        self._end_loading_ranks()
        self._end_stuck_ranks()

    def _read(self, rank: int) -> None:
        conn = self.conns[rank]
        try:
            while not conn.closed and conn.poll():
                kind, payload = conn.recv()
                self.heard[rank] = time.monotonic()
                if kind == "progress":
                    self._progress(rank, payload)
                elif kind == "phase":
                    self._phase(rank, payload)
                else:
                    self.outcome.add_result(payload)
        except Exception:  # noqa: BLE001 - EOF, or a message cut short by a kill: it ended
            conn.close()

    def _phase(self, rank: int, phase: str) -> None:
        self.phases[rank] = phase
        if phase != "loading":
            self.running.add(rank)

    def _progress(self, rank: int, message: dict[str, Any]) -> None:
        self.running.add(rank)
        if message["phase"] == "done" or not self.jobs[rank].rank.writes:
            return
        if message["phase"] == "rollout":
            self.phase = "rollout"
            self.frames[rank] = message["frames_written"]
        self.emit(ProgressEvent(self.phase, sum(self.frames.values()), self.frames_total))

    def _check_silence(self) -> None:
        """A rank silent for `timeout_s`, whatever it does (meets the others, loads its
        pipeline, warms up, runs a block), is stuck: failed, named with what it was doing,
        and ended."""
        timeout_s = next(iter(self.jobs.values())).timeout_s
        now = time.monotonic()
        for rank in self._pending():
            if self.phases.get(rank) == MEETING:  # waits for a peer: the peer is the stuck one
                continue
            if now - self.heard[rank] > timeout_s:
                doing = SILENT_PHASES.get(self.phases.get(rank, "loading"), "")
                self._record(rank, "failed", f"no progress for {timeout_s:g} s{doing} "
                                             f"(runtime.parallel.timeout_s); it was stopped")
                _end(self.procs[rank])

    def _ended(self, rank: int) -> None:
        """A rank whose process ended without a result: named by what ended it."""
        code = self.procs[rank].exitcode
        name = _signal_name(code)
        if rank in self.killed:
            where = "loaded" if self.pressed_at is None else "ran a block"
            self._record(rank, "interrupted", f"interrupted by {self.stop_sent} while it "
                         f"{where} (killed: it did not stop within {KILL_GRACE_S:g} s)")
        elif name in STOP_SIGNALS:
            self._record(rank, "interrupted", f"interrupted by {name} before it reported",
                         signal_name=name)
        elif name is not None:
            self._record(rank, "failed", f"its process was killed by {name} before it reported")
        elif code == EXIT_INTERRUPTED:
            self._record(rank, "interrupted", "interrupted before it reported")
        else:
            self._record(rank, "failed", f"its process exited with code {code} before it "
                                         f"reported")

    def _record(self, rank: int, status: str, message: str,
                signal_name: str | None = None) -> None:
        """A rank that will send no result (it ended, or is stuck): the parent writes it."""
        code = EXIT_INTERRUPTED if status == "interrupted" else EXIT_FAILED
        report = {"status": status, "error": message, "exit_code": code}
        self.outcome.add_result(rank_result(self.jobs[rank], report, pid=self.procs[rank].pid,
                                            signal_name=signal_name))

    def _pass_on_stops(self) -> None:
        if self.stop_sent is not None:
            return
        reason = self.stop.reason
        cause = self.outcome.cause
        if reason is not None:
            self.outcome.stop_reason = reason
        elif cause is not None:
            reason = (f"rank {cause.rank}'s {cause.signal}" if cause.signal
                      else f"rank {cause.rank} failed")
        if reason is None:
            return
        self.stop_sent, self.stop_sent_at = reason, time.monotonic()
        for rank in self._pending():
            try:
                self.conns[rank].send(reason)
            except (OSError, ValueError):
                pass  # it is ending; its sentinel says so

    def _end_loading_ranks(self) -> None:
        """A rank still loading or warming up when the job stops has nothing on disk and
        stops at once; one that has not `KILL_GRACE_S` later is stuck where no signal
        reaches (a rendezvous, a native call) and is killed."""
        if self.stop_sent is None or time.monotonic() - self.stop_sent_at < KILL_GRACE_S:
            return
        for rank in self._pending():
            loading = self.phases.get(rank, "loading") in (*INTERRUPTIBLE_PHASES, MEETING)
            if loading and rank not in self.killed:
                self.killed.add(rank)
                self.procs[rank].kill()

    def _end_stuck_ranks(self) -> None:
        """A second stop request while ranks still run (a block stuck in the pipeline): SIGTERM
        each, which abandons its block in flight and finalises its files; kill the ones still
        there `KILL_GRACE_S` later (stuck where no signal reaches)."""
        if self.stop_sent is None or self.stop.requests < 2:
            return
        if self.pressed_at is None:
            self.pressed_at = time.monotonic()
            for rank in self._pending():
                if self.procs[rank].is_alive():
                    self.procs[rank].terminate()
            return
        if time.monotonic() - self.pressed_at < KILL_GRACE_S:
            return
        for rank in self._pending():
            if rank not in self.killed and self.procs[rank].is_alive():
                self.killed.add(rank)
                self.procs[rank].kill()

    def _end_all(self) -> None:
        for proc in self.procs.values():
            proc.join(timeout=KILL_GRACE_S)
            _end(proc)
        for conn in self.conns.values():
            conn.close()


def _signal_name(exitcode: int | None) -> str | None:
    """The signal that ended a process (multiprocessing's negative exit code), or None."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _end(proc: BaseProcess) -> None:
    """SIGTERM, then SIGKILL after a grace period: no rank outlives the job."""
    if proc.is_alive():
        proc.terminate()
        proc.join(KILL_GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()

