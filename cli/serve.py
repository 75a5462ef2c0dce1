"""`ardiff serve [CONFIG]`: run a pipeline live for many sessions over HTTP and WebSocket.

    ardiff serve --port 8000                        # the embedded default world model
    curl -X POST localhost:8000/v1/sessions -d '{"frames": 48}'   -> {id, stream, ...}

Binds the port first (taken: exit 2, one line), loads the pipeline once, plans the KV
cache, warms up, then serves (uvicorn) until SIGINT/SIGTERM: it stops taking sessions,
finishes the blocks in flight, closes every session (hooks run, every page back) and exits
0. A second Ctrl-C ends the open connections at once (the sessions are still closed). A
host other than loopback without --token gets a warning. The API: docs/serve.md (and /docs, FastAPI's page).
`--workers N`: N worker processes (ardiff.serve.workers), one per device, behind a front
(ardiff.serve.front) that owns the port and routes each session to its worker.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
from typing import Any, Optional

import typer

from ardiff.errors import EXIT_FAILED, ConfigError
from ardiff_cli import _options as options
from ardiff_cli import _signals as signals
from ardiff_cli._errors import handle_errors

LISTEN_BACKLOG = 128


def serve_command(
    config: options.OptionalPath = options.OptionalConfigArg,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by "
                             "default; another needs --token)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535,
                             help="TCP port (0: a free one, printed at start)."),
    token: Optional[str] = typer.Option(None, "--token", metavar="T", help="Every endpoint but "
                                        "/health needs `Authorization: Bearer T` (a WebSocket: "
                                        "that header or ?token=T)."),
    workers: Optional[int] = typer.Option(None, "--workers", metavar="N", min=1, help="Worker "
                                          "processes, one per device; each session lives on "
                                          "one, a front process routes to it."),
    device: str = options.DeviceOpt,
    dtype: str = options.DtypeOpt,
    overrides: options.OverrideList = options.SetOpt,
    debug: bool = options.DebugOpt,
) -> None:
    r"""Serve live sessions of a pipeline over HTTP and WebSocket (no CONFIG: the default).

    SIGINT or SIGTERM: no new sessions, the blocks in flight finish, every session is
    closed (its pages back), exit 0. Needs the serve extra: pip install 'ardiff\[serve]'.
    """
    with signals.StopSignals(), handle_errors(debug):  # while loading, a signal ends it: 130
        if token is not None and not token.strip():
            raise ConfigError("--token: empty; give a secret, or leave --token out")
        run_config = options.load_run_config(config, overrides, {
            "runtime.device": device, "runtime.dtype": dtype,
            "runtime.parallel.workers": workers})
        from ardiff.serve.manager import SessionManager, check_serve_config  # imports torch

        check_serve_config(run_config)
        _check_extra()
        listener = _bind(host, port)
        pool = None
        try:
            from ardiff.serve.app import create_app

            if run_config.runtime.parallel.workers > 1:
                pool = _start_workers(run_config)
            else:
                manager = SessionManager.build(run_config)
        except BaseException:
            listener.close()
            raise
    if pool is not None:
        _serve_workers(pool, listener, host, token)
        return
    app = create_app(manager, token)
    bound = listener.getsockname()[1]
    if token is None and not _is_loopback(host):
        print(f"warning: --host {host} is reachable from other machines and there is no "
              f"--token: anyone who can reach it can start sessions", file=sys.stderr)
    print(f"ardiff serve: listening on http://{_url_host(host)}:{bound} ({manager.capacity} "
          f"sessions, batch {manager.batch}); Ctrl-C stops", file=sys.stderr, flush=True)
    server = _server(app, manager, run_config.serve.max_message_bytes)
    server.run(sockets=[listener])
    manager.shutdown()  # done by the app's shutdown, unless a second Ctrl-C skipped it
    if manager.scheduler_error is not None:
        print(f"error: the scheduler failed: {type(manager.scheduler_error).__name__}: "
              f"{manager.scheduler_error}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)
    stats, (in_use, total) = manager.stats, manager.kv_pages()
    pages = "" if total is None else f"; KV pages in use: {in_use} of {total}"
    print(f"ardiff serve: stopped; {stats.created} sessions served, {stats.closed} closed, "
          f"{stats.failed} failed{pages}", file=sys.stderr)


def _say(line: str) -> None:
    print(f"ardiff serve: {line}", file=sys.stderr, flush=True)


def _start_workers(run_config: Any) -> Any:
    """`--workers N`: start the workers; each loads the pipeline (a failed load: its error,
    its exit code, the others ended)."""
    from ardiff.serve.workers import WorkerPool

    pool = WorkerPool(run_config, on_event=_say)
    pool.start()
    return pool


def _serve_workers(pool: Any, listener: socket.socket, host: str, token: str | None) -> None:
    """The front serves until SIGINT/SIGTERM, when every worker closes its sessions; exit 0
    (1 if a worker did not stop cleanly)."""
    from ardiff.serve.front import create_front_app

    say = _say
    try:
        app = create_front_app(pool, token)
        if token is None and not _is_loopback(host):
            print(f"warning: --host {host} is reachable from other machines and there is no "
                  f"--token: anyone who can reach it can start sessions", file=sys.stderr)
        capacity = sum(slot.capacity for slot in pool.slots)
        devices = ", ".join(slot.device for slot in pool.slots)
        say(f"listening on http://{_url_host(host)}:{listener.getsockname()[1]} ({pool.size} "
            f"workers on {devices}, {capacity} sessions); Ctrl-C stops")
        _server(app, pool, pool.config.serve.max_message_bytes).run(sockets=[listener])
    finally:
        totals = pool.shutdown()  # done by the app's shutdown, unless it never ran
    pages = ("" if totals["kv_pages_total"] is None else
             f"; KV pages in use: {totals['kv_pages_in_use']} of {totals['kv_pages_total']}")
    say(f"stopped; {totals['workers']} workers, {totals['served']} sessions served, "
        f"{totals['closed'] or 0} closed, {totals['failed'] or 0} failed, {totals['lost']} "
        f"lost with a worker ({totals['restarts']} restarts){pages}")
    if totals["errors"]:
        print(f"error: {'; '.join(totals['errors'])}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)


def _check_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"ardiff serve needs the serve extra ({exc.name} is missing); "
                          f"pip install 'ardiff[serve]'") from exc


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); a taken port or a bad host is a ConfigError."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigError(f"--host: {host!r} is not an address of this machine ({exc.strerror}); "
                          f"use 127.0.0.1, 0.0.0.0 or an interface's address") from exc
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(LISTEN_BACKLOG)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"--port: cannot listen on {host}:{port} ({exc.strerror}); choose "
                          f"another port (--port 0 picks a free one)") from exc
    listener.set_inheritable(True)
    return listener


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _server(app: Any, manager: Any, max_message_bytes: int) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server; a stop signal first makes the manager refuse new sessions, and
        is not raised again once the server has stopped (the exit is 0)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            manager.begin_shutdown()
            if self.should_exit and sig == signal.SIGINT:  # Ctrl-C twice, as uvicorn's
                self.force_exit = True
            self.should_exit = True

    return Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                 ws_max_size=max_message_bytes, timeout_graceful_shutdown=30))
