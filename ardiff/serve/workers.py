"""`ardiff serve --workers N`: N worker processes, one per device, and the pool that keeps them.

    pool = WorkerPool(config, on_event=print_line)  # checked; nothing started yet
    pool.start()           # N workers: each loads the pipeline, plans its KV cache, warms up
                           # and serves its own app (ardiff.serve.app) on a private port
    pool.route(id)         # the worker that holds a session, for its whole life
    pool.shutdown()        # each worker closes its sessions (every page back) and exits

    front (public port) --HTTP / WS, Bearer <secret>--> worker i on 127.0.0.1:<private port>
    front <--pipe: ready {port, pid, capacity} | error {line, exit code} | stopped {stats}--
    front --pipe: "stop" (or the pipe's end: the front is gone)--> worker i

Worker i runs on `cuda:i` (CPU: the host's cores and a fractional memory budget split
between the workers), as the data-parallel ranks do (ardiff.distributed.topology); its
token is a random secret only the front holds. A monitor thread follows every worker: one
that dies (SIGKILL, the OOM killer) fails its sessions (`lost_error`: the one line saying
why) and is started again (loads again); the others go on. A worker whose front is gone
stops by itself. Workers ignore SIGINT/SIGHUP: a terminal's Ctrl-C reaches the front, which
decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Callable

from ardiff.config.run import RunConfig, with_base_dir
from ardiff.distributed.topology import check_devices, rank_budget, rank_device, rank_threads
from ardiff.engine.device import resolve_device
from ardiff.errors import ArdiffError, CapacityError, ConfigError, RunError
from ardiff.launch.parent import host_cores
from ardiff.serve.folder import TEMP_PREFIX, sweep, sweep_temp
from ardiff.serve.routing import RouteTable
from ardiff.serve.worker import BLOCKED_AT_START, WorkerJob, worker_main

POLL_S = 0.25            # how often the monitor looks at its workers
SWEEP_S = 2.0            # how often it forgets routes of sessions a worker no longer has
START_TIMEOUT_S = 600.0  # a worker that is not serving this long after its start is failed
STOP_MARGIN_S = 10.0     # a worker asked to stop that has not serve.stop_timeout_s + this
                         # later is killed
RESTART_BACKOFF_S = (1.0, 30.0)  # a worker that dies while it loads: first and longest wait
HUNG_AFTER_S = 3.0       # a ready worker silent this long (SIGSTOPped, hung) is killed
PRELOAD = ["torch", "ardiff.serve.app", "ardiff.serve.worker"]  # the forkserver imports them
WORKER_HEADER = "x-ardiff-worker"  # every worker response names its worker


@dataclass
class WorkerSlot:
    """One worker: its process now (a restart makes a new one) and what the front knows."""

    index: int
    device: str
    state: str = "starting"   # starting -> ready -> (died) restarting -> starting ...; stopped
    proc: BaseProcess | None = None
    conn: Connection | None = None
    port: int | None = None
    pid: int | None = None
    generation: int = -1
    restarts: int = 0
    lost: int = 0             # sessions failed because this worker died
    capacity: int = 0
    error: str | None = None  # why it last died or failed to load
    started_s: float = 0.0
    next_start_s: float = 0.0
    backoff_s: float = RESTART_BACKOFF_S[0]
    output_dir: Path | None = None
    final: dict[str, Any] | None = None  # its stats, sent when it stopped
    beat_s: float = 0.0       # when it last said anything (its beats: every BEAT_S)
    load: dict[str, Any] | None = None  # its last beat: sessions, capacity, KV pages
    hung: bool = False        # killed for its silence

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class WorkerPool:
    """The workers of a front process; thread-safe. `on_event(line)` says what happened to a
    worker (died, restarted) for the command to print."""

    def __init__(self, config: RunConfig, on_event: Callable[[str], None] | None = None) -> None:
        from ardiff.serve.manager import check_serve_config

        check_serve_config(config)
        parallel = config.runtime.parallel
        self.size = parallel.workers
        if self.size < 2:
            raise ConfigError("runtime.parallel.workers: a worker pool needs 2 or more; one "
                              "worker is served in the front process itself")
        device = resolve_device(config.runtime.device)
        if device != "cpu":
            import torch

            check_devices(device, self.size, torch.cuda.device_count())
        self.config, self.device = config, device
        self.on_event = on_event or (lambda line: None)
        self.secret = secrets.token_urlsafe(32)
        self.threads = rank_threads(parallel.threads, host_cores(), self.size)
        self.output_root, self.owns_output_root = output_root(config)  # each worker: its own
                                                                          # RunFolder inside
        self.slots = [WorkerSlot(i, rank_device(device, i)) for i in range(self.size)]
        self.table = RouteTable()  # guarded by self._lock
        self.placing = [0] * self.size  # session creations in flight, per worker
        self.created = 0
        self.accepting = True
        self._lock = threading.RLock()
        self._stopping = False
        self._stopped: dict[str, Any] | None = None
        self._context: Any = None
        self._monitor = threading.Thread(target=self._follow, name="ardiff-serve-workers",
                                         daemon=True)

    # -- starting ------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start every worker and wait until each serves; the first one that fails to load
        raises its error (its exit code kept) after the others are ended."""
        import multiprocessing

        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)
        _start_forkserver()
        try:
            for slot in self.slots:
                self._spawn(slot)
            deadline = time.monotonic() + timeout_s
            while any(slot.state != "ready" for slot in self.slots):
                pending = [s for s in self.slots if s.state != "ready"]
                wait([*(s.conn for s in pending if s.conn is not None),
                      *(s.proc.sentinel for s in pending if s.proc is not None)], POLL_S)
                for slot in pending:
                    self._read(slot, starting=True)
                    if slot.state == "starting" and slot.proc is not None \
                            and not slot.proc.is_alive():
                        self._read(slot, starting=True)
                        if slot.state == "starting":
                            raise RunError(f"worker {slot.index}: {_ended(slot.proc)} while "
                                           f"it loaded its pipeline")
                if time.monotonic() > deadline:
                    raise RunError(f"workers: not all serving {timeout_s:g} s after their "
                                   f"start; a pipeline that loads longer needs more time")
        except BaseException:
            self._end_all()
            self._remove_outputs()
            raise
        self._monitor.start()

    def _spawn(self, slot: WorkerSlot) -> None:
        from ardiff.serve.manager import check_serve_config

        slot.generation += 1
        slot.output_dir = self.output_root
        job = WorkerJob(self._worker_config(slot, slot.output_dir), slot.index, self.secret,
                        self.threads, self.config.serve.max_message_bytes)
        check_serve_config(job.config)
        parent_end, child_end = self._context.Pipe()
        # Started with SIGINT/SIGHUP/SIGTERM blocked (the forkserver and its children inherit
        # the mask): a Ctrl-C while a worker imports cannot end it before it ignores it, and
        # a SIGTERM to the whole process group (systemd's stop) never ends the forkserver
        # (whose children would then read as ended with 255) but reaches each worker.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_AT_START)
        try:
            proc = self._context.Process(target=worker_main, args=(job, child_end),
                                         name=f"ardiff-serve-worker-{slot.index}", daemon=True)
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child_end.close()
        slot.proc, slot.conn, slot.pid = proc, parent_end, proc.pid
        slot.state, slot.port, slot.final, slot.hung = "starting", None, None, False
        slot.load = None
        slot.started_s = time.monotonic()

    def _worker_config(self, slot: WorkerSlot, output_dir: Path) -> RunConfig:
        config = self.config
        runtime = config.runtime
        runtime = dataclasses.replace(
            runtime, device=slot.device,
            memory_budget=rank_budget(runtime.memory_budget, slot.device, self.size),
            parallel=dataclasses.replace(runtime.parallel, workers=1))
        serve = dataclasses.replace(config.serve, output_dir=str(output_dir))
        return with_base_dir(dataclasses.replace(config, runtime=runtime, serve=serve),
                             config.base_dir)

    # -- routing -------------------------------------------------------------------------
    def ready(self) -> list[WorkerSlot]:
        """The workers serving now."""
        with self._lock:
            return [slot for slot in self.slots if slot.state == "ready"]

    def loads(self) -> list[tuple[WorkerSlot, dict[str, Any]]]:
        """Each serving worker with its last told load ({sessions, capacity,
        kv_pages_in_use, kv_pages_total}), pushed with its beats."""
        with self._lock:
            return [(slot, slot.load) for slot in self.slots
                    if slot.state == "ready" and slot.load is not None]

    def route(self, session_id: str) -> WorkerSlot | None:
        """The worker that holds the session (None: not a live session of any worker)."""
        with self._lock:
            route = self.table.get(session_id)
            if route is None:
                return None
            slot = self.slots[route.worker]
            return slot if slot.generation == route.generation else None

    def add_route(self, session_id: str, slot: WorkerSlot, generation: int) -> None:
        with self._lock:
            self.created += 1
            if slot.generation == generation and slot.state == "ready":
                self.table.add(session_id, slot.index, generation)
                if slot.load is not None:  # counted until its next beat says so itself
                    slot.load = {**slot.load, "sessions": slot.load["sessions"] + 1}
            else:  # it died between its answer and now
                self.table.remember_lost(session_id, slot.index,
                                         slot.error or "its worker stopped")

    def forget(self, session_id: str) -> None:
        """The session is closed (or its worker no longer has it)."""
        with self._lock:
            self.table.forget(session_id)

    def lost_error(self, session_id: str) -> tuple[int, str] | None:
        """(worker, why) of a session that was lost with its worker."""
        with self._lock:
            return self.table.lost_error(session_id)

    def lost_sessions(self) -> list[tuple[str, int, str]]:
        """(id, worker, why) of every session lost with its worker, oldest first."""
        with self._lock:
            return self.table.lost_sessions()

    def routed(self) -> list[int]:
        """Sessions routed to each worker now."""
        with self._lock:
            return self.table.counts(self.size)

    def begin_shutdown(self) -> None:
        """Take no new session from now on (503); the running ones go on."""
        with self._lock:
            self.accepting = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- following the workers -----------------------------------------------------------
    def _follow(self) -> None:
        last_sweep = time.monotonic()
        while not self._stopping:
            with self._lock:
                live = [s for s in self.slots if s.proc is not None and s.state != "restarting"]
            wait([*(s.conn for s in live if s.conn is not None and not s.conn.closed),
                  *(s.proc.sentinel for s in live if s.proc is not None)], POLL_S)
            if self._stopping:
                return
            for slot in self.slots:
                self._check(slot)
            if time.monotonic() - last_sweep > SWEEP_S:
                last_sweep = time.monotonic()
                self._sweep()

    def _check(self, slot: WorkerSlot) -> None:
        now = time.monotonic()
        if slot.state == "restarting":
            if now >= slot.next_start_s and self.accepting:  # never while the front stops
                self.on_event(f"worker {slot.index}: starting again")
                slot.restarts += 1
                self._spawn(slot)
            return
        self._read(slot)
        proc = slot.proc
        if proc is None:
            return
        if proc.is_alive():
            if slot.state == "starting" and now - slot.started_s > START_TIMEOUT_S:
                _end(proc)  # stuck while it loads: its death below restarts it
            elif slot.state == "ready" and now - slot.beat_s > HUNG_AFTER_S:
                slot.hung = True  # stopped or hung: its callers would wait for ever
                proc.kill()       # SIGKILL ends a stopped process too; its death restarts it
            return
        self._read(slot)
        if self._stopping:
            return
        self._died(slot, f"did not answer for {HUNG_AFTER_S:g} s (stopped or hung); killed"
                   if slot.hung else _ended(proc))

    def _read(self, slot: WorkerSlot, starting: bool = False) -> None:
        conn = slot.conn
        try:
            while conn is not None and not conn.closed and conn.poll():
                kind, payload = conn.recv()
                slot.beat_s = time.monotonic()
                if kind == "beat":
                    with self._lock:
                        slot.load = payload
                elif kind == "ready":
                    with self._lock:
                        slot.port, slot.capacity = payload["port"], payload["capacity"]
                        slot.load = {"sessions": 0, "capacity": slot.capacity}  # new: empty
                        slot.state, slot.backoff_s = "ready", RESTART_BACKOFF_S[0]
                    if slot.restarts:
                        self.on_event(f"worker {slot.index}: serving again (pid {slot.pid})")
                elif kind == "error":
                    slot.error = payload["error"]
                    if starting:
                        raise _error(payload["error"], payload["exit_code"])
                elif kind == "stopped":
                    slot.final = payload
        except (EOFError, OSError):
            if conn is not None:
                conn.close()

    def _died(self, slot: WorkerSlot, how: str) -> None:
        """A worker that ended on its own: fail its sessions, start it again. One that
        stopped cleanly (a SIGTERM of its own: it closed its sessions and sent its stats)
        lost nothing; it is started again a moment later unless the front stops too (a
        SIGTERM to the whole process group)."""
        was, clean = slot.state, slot.final is not None
        error = (f"worker {slot.index} stopped ({how}); its sessions were closed" if clean else
                 f"worker {slot.index} died ({how}); the session was lost with it, start a "
                 f"new one" if was == "ready" else
                 f"worker {slot.index} failed while it loaded ({slot.error or how})")
        with self._lock:
            lost = self.table.fail_worker(slot.index, None if clean else error)
            slot.lost += 0 if clean else len(lost)
            slot.state, slot.port, slot.error = "restarting", None, error
            wait_s = 0.0 if was == "ready" and not clean else slot.backoff_s
            if was != "ready":
                slot.backoff_s = min(slot.backoff_s * 2, RESTART_BACKOFF_S[1])
            slot.next_start_s = time.monotonic() + wait_s
        if slot.conn is not None:
            slot.conn.close()
        if slot.proc is not None:
            slot.proc.join(0)
        sweep(self.output_root)  # its work folder: unfinished recordings (kept ones stay)
        self.on_event(f"worker {slot.index}: {how}" + (
            f"; it closed its {len(lost)} session(s)" if clean else
            f"; {len(lost)} session(s) failed" if was == "ready" else f"; {slot.error}"))

    def _sweep(self) -> None:
        """Forget the routes of sessions their worker no longer has (closed when idle or
        done and deleted), so the table does not grow over a long run."""
        import httpx

        for slot in self.ready():
            asked_s, generation = time.monotonic(), slot.generation
            try:
                response = httpx.get(f"{slot.url}/v1/sessions", timeout=2.0,
                                     headers=self.auth_headers)
                ids = {s["id"] for s in response.json()["sessions"]}
            except Exception:  # noqa: BLE001 - a worker that does not answer: next time
                continue
            with self._lock:
                self.table.drop_missing(slot.index, generation, asked_s, ids)

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    # -- stopping ------------------------------------------------------------------------
    def shutdown(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Ask every worker to stop (each closes its sessions, its pages back, and exits),
        wait for them, remove what they recorded unless `serve.keep_videos`. Returns the
        totals (sessions served, closed, failed, lost; KV pages in use and in all; workers
        that did not stop cleanly). Safe to call twice."""
        with self._lock:
            if self._stopped is not None:
                return self._stopped
            self.accepting, self._stopping = False, True
        if self._monitor.is_alive():
            self._monitor.join(POLL_S * 8)
        for slot in self.slots:
            if slot.conn is not None and not slot.conn.closed:
                try:
                    slot.conn.send("stop")
                except (OSError, ValueError):
                    pass
        if timeout_s is None:
            timeout_s = self.config.serve.stop_timeout_s + STOP_MARGIN_S
        deadline = time.monotonic() + timeout_s
        for slot in self.slots:
            if slot.proc is not None:
                self._wait_stopped(slot, deadline)
        self._stopped = self._totals()
        self._end_all()
        self._remove_outputs()
        return self._stopped

    def _wait_stopped(self, slot: WorkerSlot, deadline: float) -> None:
        """Wait for a worker asked to stop, reading its pipe (its beats, its stats); one
        silent for HUNG_AFTER_S (stopped, hung) is killed at once, not waited for."""
        proc = slot.proc
        assert proc is not None
        slot.beat_s = max(slot.beat_s, time.monotonic())  # from the "stop" on
        while proc.is_alive() and time.monotonic() < deadline:
            proc.join(POLL_S)
            self._read(slot)
            if proc.is_alive() and time.monotonic() - slot.beat_s > HUNG_AFTER_S:
                slot.error = f"did not answer for {HUNG_AFTER_S:g} s at the stop; killed"
                proc.kill()
                proc.join(5.0)
        self._read(slot)

    def _remove_outputs(self) -> None:
        """What workers that did not stop left (their work folders), and a temporary root
        unless it holds kept videos. Each worker removed its own folder as it stopped."""
        sweep(self.output_root)
        if self.owns_output_root:
            with contextlib.suppress(OSError):
                self.output_root.rmdir()

    def _totals(self) -> dict[str, Any]:
        finals = [slot.final for slot in self.slots if slot.final is not None]
        unclean = [f"worker {slot.index}: " + (
            "did not stop" if slot.final is None else str(slot.final["scheduler_error"]))
            for slot in self.slots
            if slot.final is None or slot.final.get("scheduler_error")]
        totals: dict[str, Any] = {"workers": self.size, "served": self.created,
                                  "lost": sum(slot.lost for slot in self.slots),
                                  "restarts": sum(slot.restarts for slot in self.slots),
                                  "errors": unclean}
        for key in ("closed", "failed", "kv_pages_in_use", "kv_pages_total"):
            values = [final[key] for final in finals if final.get(key) is not None]
            totals[key] = sum(values) if values else None
        return totals

    def _end_all(self) -> None:
        for slot in self.slots:
            if slot.proc is not None:
                _end(slot.proc)
            if slot.conn is not None:
                slot.conn.close()
            slot.state = "stopped"


def output_root(config: RunConfig) -> tuple[Path, bool]:
    """The folder the workers share (each makes its own RunFolder in it): serve.output_dir,
    or a new temporary folder the pool owns (True)."""
    if config.serve.output_dir is not None:
        folder = Path(config.serve.output_dir)
        return (folder if folder.is_absolute() else config.base_dir / folder), False
    sweep_temp()
    return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")), True


def _start_forkserver() -> None:
    """Start the forkserver with SIGINT/SIGHUP/SIGTERM blocked (see `_spawn`). The resource
    tracker is started first: starting it unblocks SIGINT and SIGTERM in this thread (its
    own block and unblock around its start), which would undo ours."""
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_AT_START)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _error(line: str, exit_code: int) -> ArdiffError:
    """A worker's load error, raised in the front with its exit code."""
    kind = {2: ConfigError, 3: CapacityError}.get(exit_code, RunError)
    return kind(line)


def _ended(proc: BaseProcess) -> str:
    """How a worker process ended, in words."""
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _end(proc: BaseProcess) -> None:
    """SIGTERM, then SIGKILL a few seconds later: no worker outlives the front."""
    if proc.is_alive():
        proc.terminate()
        proc.join(3.0)
    if proc.is_alive():
        proc.kill()
        proc.join()
