"""A worker process of `ardiff serve --workers N` (its supervisor: ardiff.serve.workers).

    worker_main(job, conn)     # in the process the pool started: load, serve, stop, report

It loads the pipeline (a SessionManager), serves the one-process app (ardiff.serve.app) on
a private loopback port with a token only the front knows, and talks to the front over its
pipe: `ready {port, pid, capacity}` or `error {line, exit code}`, then a `beat` every
BEAT_S (a worker that falls silent, stopped or hung, is killed by the front), and
`stopped {stats}` at the end. The front's "stop", or the pipe's end (the front is gone),
stops it; SIGTERM too; SIGINT/SIGHUP are the front's to decide (ignored).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from ardiff.config.run import RunConfig
from ardiff.errors import EXIT_FAILED, ArdiffError

BEAT_S = 0.5             # a worker tells the front it is alive this often
BLOCKED_AT_START = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM}


@dataclass(frozen=True)
class WorkerJob:
    """What the front hands a worker process (picklable)."""

    config: RunConfig   # this worker's: its device, memory share and output folder
    index: int
    secret: str         # the worker app's token; only the front has it
    threads: int
    max_message_bytes: int



def worker_main(job: WorkerJob, conn: Connection) -> None:
    """A worker process: load, serve the app on a private loopback port until the front
    says stop (or is gone, or SIGTERM), close every session, send the stats, exit."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED_AT_START)
    try:
        import torch

        torch.set_num_threads(job.threads)
        from ardiff.serve.app import create_app
        from ardiff.serve.http import Guard
        from ardiff.serve.manager import SessionManager

        manager = SessionManager.build(job.config)
    except BaseException as exc:  # noqa: BLE001 - the front decides what a failed load means
        code = exc.exit_code if isinstance(exc, ArdiffError) else EXIT_FAILED
        line = str(exc) if isinstance(exc, ArdiffError) else f"{type(exc).__name__}: {exc}"
        _send(conn, "error", {"error": line, "exit_code": code})
        return
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    app = create_app(manager, Guard(token=job.secret), worker=job.index)
    server = _worker_server(app, manager, job.max_message_bytes,
                            job.config.serve.stop_timeout_s)
    threading.Thread(target=_follow_front, args=(conn, server, manager), daemon=True).start()
    _send(conn, "ready", {"port": listener.getsockname()[1], "pid": os.getpid(),
                          "capacity": manager.capacity})
    threading.Thread(target=_beat, args=(conn, manager), daemon=True,
                     name="ardiff-serve-beat").start()
    try:
        server.run(sockets=[listener])
    finally:
        manager.shutdown()
        in_use, total = manager.kv_pages()
        error: Any = manager.scheduler_error
        if manager.abandoned:
            error = ("a forward still ran serve.stop_timeout_s after the stop; its sessions "
                     "failed")
        _send(conn, "stopped", {
            "closed": manager.stats.closed, "failed": manager.stats.failed,
            "kv_pages_in_use": in_use, "kv_pages_total": total,
            "scheduler_error": None if error is None else error if isinstance(error, str) else
            f"{type(error).__name__}: {error}"})
        listener.close()


_SEND_LOCK = threading.Lock()  # a worker's beats and its other messages share one pipe


def _send(conn: Connection, kind: str, payload: dict[str, Any]) -> bool:
    try:
        with _SEND_LOCK:
            conn.send((kind, payload))
    except (OSError, ValueError):
        return False  # the front is gone: nobody to tell
    return True


def _beat(conn: Connection, manager: Any) -> None:
    """Tell the front this worker is alive and its load (sessions holding a slot, capacity,
    KV pages), every BEAT_S, until the pipe closes: the front places sessions with it (no
    call to every worker per create), and kills a worker that falls silent."""
    while _send(conn, "beat", manager.load()):
        time.sleep(BEAT_S)


def _follow_front(conn: Connection, server: Any, manager: Any) -> None:
    """The front's "stop", or its end (a front killed outright): stop serving."""
    try:
        conn.recv()
    except (EOFError, OSError):
        pass
    manager.begin_shutdown()
    server.should_exit = True


def _worker_server(app: Any, manager: Any, max_message_bytes: int,
                   stop_timeout_s: float) -> Any:
    import uvicorn

    class WorkerServer(uvicorn.Server):
        """SIGTERM: stop taking sessions, then uvicorn's graceful stop; SIGINT is the
        front's to decide (ignored); neither is raised again once stopped (exit 0)."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if sig == signal.SIGINT:
                return
            manager.begin_shutdown()
            self.should_exit = True

    return WorkerServer(uvicorn.Config(app, log_level="warning", lifespan="on",
                                       ws_max_size=max_message_bytes,
                                       timeout_graceful_shutdown=int(stop_timeout_s) + 5))

