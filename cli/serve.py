"""`ardiff serve [CONFIG]`: run a pipeline live for many sessions over HTTP and WebSocket.

    ardiff serve --port 8000                        # the embedded default world model
    curl -X POST localhost:8000/v1/sessions -d '{"frames": 48}'   -> {id, stream, ...}

Binds the port first (taken: exit 2, one line), loads the pipeline once, plans the KV
cache, warms up, then serves (uvicorn) until SIGINT/SIGTERM/SIGHUP: it stops taking
sessions, finishes the blocks in flight, closes every session (hooks run, every page back)
and exits 0. A second Ctrl-C ends the open connections at once (the sessions are still
closed). The token comes from --token, --token-file or $ARDIFF_SERVE_TOKEN; a host other
than loopback without one is refused unless --no-token says so. The API: docs/serve.md
(and /docs, FastAPI's page).
`--workers N`: N worker processes (ardiff.serve.workers), one per device, behind a front
(ardiff.serve.front) that owns the port and routes each session to its worker.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Iterator, List, Optional

import typer

from ardiff.errors import EXIT_FAILED, ConfigError
from ardiff_cli import _options as options
from ardiff_cli import _signals as signals
from ardiff_cli._errors import handle_errors

LISTEN_BACKLOG = 128
TOKEN_ENV = "ARDIFF_SERVE_TOKEN"   # the token, out of the process list (as --token-file)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def serve_command(
    config: options.OptionalPath = options.OptionalConfigArg,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by "
                             "default; another needs --token)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535,
                             help="TCP port (0: a free one, printed at start)."),
    token: Optional[str] = typer.Option(None, "--token", metavar="T", help="Every endpoint but "
                                        "/health needs `Authorization: Bearer T` (a WebSocket: "
                                        "that header or ?token=T). Other local users can read "
                                        "it in the process list: prefer --token-file or "
                                        f"${TOKEN_ENV}."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", metavar="FILE",
                                              help="Read the token from FILE (its first line)."),
    no_token: bool = typer.Option(False, "--no-token", help="Serve a host beyond loopback "
                                  "without a token (anyone who reaches it can use it)."),
    allowed_hosts: Optional[List[str]] = typer.Option(None, "--allowed-host", metavar="NAME",
                                                      help="A host name clients use besides "
                                                      "IP addresses and localhost (repeat; "
                                                      "'*': any)."),
    allowed_origins: Optional[List[str]] = typer.Option(None, "--allowed-origin",
                                                        metavar="ORIGIN", help="A web origin "
                                                        "(https://app.example) whose pages may "
                                                        "call the server besides its own page "
                                                        "(repeat)."),
    workers: Optional[int] = typer.Option(None, "--workers", metavar="N", min=1, help="Worker "
                                          "processes, one per device; each session lives on "
                                          "one, a front process routes to it."),
    device: str = options.DeviceOpt,
    dtype: str = options.DtypeOpt,
    overrides: options.OverrideList = options.SetOpt,
    debug: bool = options.DebugOpt,
) -> None:
    r"""Serve live sessions of a pipeline over HTTP and WebSocket (no CONFIG: the default).

    SIGINT, SIGTERM or SIGHUP: no new sessions, the blocks in flight finish, every session is
    closed (its pages back), exit 0. Needs the serve extra: pip install 'ardiff\[serve]'.
    """
    with signals.StopSignals(), handle_errors(debug):  # while loading, a signal ends it: 130
        token = _read_token(token, token_file, os.environ.get(TOKEN_ENV))
        _check_exposure(host, token, no_token)
        run_config = options.load_run_config(config, overrides, {
            "runtime.device": device, "runtime.dtype": dtype,
            "runtime.parallel.workers": workers})
        from ardiff.serve.http import Guard
        from ardiff.serve.manager import SessionManager, check_serve_config  # imports torch

        guard = Guard(token, frozenset(name.lower() for name in allowed_hosts or ()),
                      frozenset(allowed_origins or ()))

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
        _serve_workers(pool, listener, host, guard)
        return
    app = create_app(manager, guard)
    bound = listener.getsockname()[1]
    server = _server(app, manager, run_config.serve.max_message_bytes,
                     run_config.serve.stop_timeout_s)
    _warn_if_open(host, token)
    print(f"ardiff serve: listening on http://{_url_host(host)}:{bound} ({manager.capacity} "
          f"sessions, batch {manager.batch}); Ctrl-C stops", file=sys.stderr, flush=True)
    server.run(sockets=[listener])
    manager.shutdown()  # done by the app's shutdown, unless a second Ctrl-C skipped it
    if manager.abandoned:
        print(f"error: a forward was still running serve.stop_timeout_s "
              f"({run_config.serve.stop_timeout_s:g} s) after the stop; its sessions failed",
              file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)
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


def _serve_workers(pool: Any, listener: socket.socket, host: str, guard: Any) -> None:
    """The front serves until SIGINT/SIGTERM, when every worker closes its sessions; exit 0
    (1 if a worker did not stop cleanly)."""
    from ardiff.serve.front import create_front_app

    say = _say
    try:
        app = create_front_app(pool, guard)
        server = _server(app, pool, pool.config.serve.max_message_bytes,
                         pool.config.serve.stop_timeout_s)
        _warn_if_open(host, guard.token)
        capacity = sum(slot.capacity for slot in pool.slots)
        devices = ", ".join(slot.device for slot in pool.slots)
        say(f"listening on http://{_url_host(host)}:{listener.getsockname()[1]} ({pool.size} "
            f"workers on {devices}, {capacity} sessions); Ctrl-C stops")
        server.run(sockets=[listener])
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


def _read_token(flag: str | None, file: Path | None, env: str | None) -> str | None:
    """The token: --token, else --token-file's first line, else $ARDIFF_SERVE_TOKEN."""
    if flag is not None and file is not None:
        raise ConfigError("--token-file: given with --token; give the token one way")
    if file is not None:
        try:
            lines = file.read_text("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--token-file: cannot read {str(file)!r} ({type(exc).__name__})"
                              f"; give a readable file holding the token") from exc
        token, where = (lines[0] if lines else ""), "--token-file"
    elif flag is not None:
        token, where = flag, "--token"
    elif env is not None:
        token, where = env, f"${TOKEN_ENV}"
    else:
        return None
    if not token.strip():
        raise ConfigError(f"{where}: empty; give a secret, or no token at all")
    return token.strip()


def _check_exposure(host: str, token: str | None, no_token: bool) -> None:
    if token is None and not no_token and not _is_loopback(host):
        raise ConfigError(f"--host: {host} is reachable from other machines and there is no "
                          f"token; give --token-file FILE (or ${TOKEN_ENV}), or --no-token to "
                          f"let anyone who can reach it start sessions")


def _warn_if_open(host: str, token: str | None) -> None:
    if token is None and not _is_loopback(host):
        print(f"warning: --host {host} is reachable from other machines and there is no "
              f"token (--no-token): anyone who can reach it can start sessions",
              file=sys.stderr)


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


def _server(app: Any, manager: Any, max_message_bytes: int, stop_timeout_s: float) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server; a stop signal (SIGHUP too: the terminal closed) first makes the
        manager refuse new sessions, and is not raised again once the server has stopped
        (the exit is 0). Its handlers are set as it is made: a signal before uvicorn starts
        is honoured when it does."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            manager.begin_shutdown()
            if self.should_exit and sig == signal.SIGINT:  # Ctrl-C twice, as uvicorn's
                self.force_exit = True
            self.should_exit = True

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                hangup = signal.signal(signal.SIGHUP, self.handle_exit)
                try:
                    yield
                finally:
                    signal.signal(signal.SIGHUP, hangup)

    server = Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                   ws_max_size=max_message_bytes,
                                   timeout_graceful_shutdown=int(stop_timeout_s) + 5))
    for sig in STOP_SIGNALS:
        signal.signal(sig, server.handle_exit)
    return server
