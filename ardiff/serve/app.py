"""The HTTP and WebSocket API of `ardiff serve` (FastAPI), over one `SessionManager`.

    app = create_app(manager, token="s3cret")   # uvicorn runs it (ardiff_cli.serve)

    POST   /v1/sessions               body: session options (ardiff.serve.options) -> 201
                                      {id, stream, video, status}; 422 {error, field};
                                      503 + Retry-After when no slot is free; 413 too large
    PUT    /v1/sessions/{id}          the same with the client's id (a balancer hashes it);
                                      409 when it exists
    GET    /v1/sessions               every live session, capacity, KV pages
    GET    /v1/sessions/{id}          status, frames, latency percentiles, KV pages
    DELETE /v1/sessions/{id}          close it (hooks run, pages back)
    GET    /v1/sessions/{id}/video    the frames so far as one mp4
    WS     /v1/sessions/{id}/stream   binary frames (ardiff.serve.frames); client messages
                                      {"action": a}, {"prompt": p, "on_switch": k}, {"pause": b}
    GET    /v1/info                   the pipeline, its actions and keys, the session defaults
    GET    /health                    no token needed;   GET /metrics  Prometheus text
    GET    /                          the page (static/: no token needed, it holds no data)

Who may call (token, Host, Origin, JSON bodies) is `ardiff.serve.http.Guard`'s: with a
token, every endpoint but /health and the page needs `Authorization: Bearer <token>`; a
WebSocket may give it as that header or as `?token=<token>` (browsers cannot set its headers).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ardiff.errors import ConfigError
from ardiff.serve.http import (
    WS_BUSY,
    WS_POLICY_VIOLATION,
    WS_UNKNOWN,
    Guard,
    add_guard,
    close_reason,
    error_response,
    read_json_body,
    unprocessable,
)
from ardiff.serve.manager import SessionManager
from ardiff.serve.metrics import ServeMetrics
from ardiff.serve.session import SessionBusy, SessionExists, SessionRefused, UnknownSession
from ardiff.serve.stream import stream_session

PAGE_FILES = {"index.html": "text/html", "page.js": "text/javascript", "page.css": "text/css"}


def create_app(manager: SessionManager, guard: Guard | None = None,
               worker: int | None = None) -> FastAPI:
    """The app; its shutdown (uvicorn's, on SIGINT/SIGTERM) shuts the manager down.
    `guard`: who may call (None: no token, IP-address hosts, its own origin).
    `worker`: the app is worker `worker` of `--workers N` (ardiff.serve.workers): every
    response names it (header X-Ardiff-Worker; GET of a session: `worker`)."""
    guard = guard or Guard()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(manager.shutdown)

    app = FastAPI(title="ardiff serve", lifespan=lifespan,
                  description="Live sessions of an ardiff pipeline (docs/serve.md).")
    metrics = ServeMetrics(manager)
    limits = manager.config.serve

    add_guard(app, guard, worker)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        status = ("failed" if manager.scheduler_error is not None else
                  "ok" if manager.accepting else "stopping")
        return {"status": status,
                "sessions": manager.live_sessions, "capacity": manager.capacity}

    add_page_routes(app)

    @app.get("/v1/info")
    async def server_info() -> dict[str, Any]:
        return describe_server(manager)

    @app.get("/metrics")
    async def metrics_text() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/v1/sessions", status_code=201)
    async def create_session(request: Request) -> Response:
        return await _create(request, None)

    @app.put("/v1/sessions/{session_id}", status_code=201)
    async def create_named_session(request: Request, session_id: str) -> Response:
        return await _create(request, session_id)

    async def _create(request: Request, session_id: str | None) -> Response:
        body = await read_json_body(request, limits.max_body_bytes)
        if isinstance(body, Response):
            return body
        try:
            session = await run_in_threadpool(manager.create, body, session_id)
        except SessionRefused as exc:
            return error_response(str(exc), 503, {"Retry-After": str(exc.retry_after_s)})
        except SessionExists as exc:
            return error_response(str(exc), 409)
        except ConfigError as exc:
            return unprocessable(exc)
        sid = session.public_id
        return JSONResponse({"id": sid, "stream": f"/v1/sessions/{sid}/stream",
                             "video": f"/v1/sessions/{sid}/video",
                             "status": session.state.value}, 201)

    @app.get("/v1/sessions")
    async def list_sessions() -> dict[str, Any]:
        in_use, total = manager.kv_pages()
        ids = list(manager.sessions)
        described = []
        for sid in ids:
            with contextlib.suppress(UnknownSession):
                described.append(manager.describe(sid))
        return {"sessions": described, "capacity": manager.capacity,
                "kv_pages_in_use": in_use, "kv_pages_total": total}

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str) -> Response:
        try:
            described = manager.describe(session_id)
            return JSONResponse(described if worker is None else {**described, "worker": worker})
        except UnknownSession as exc:
            return JSONResponse({"error": str(exc)}, 404)

    @app.delete("/v1/sessions/{session_id}")
    async def delete_session(session_id: str) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(manager.close, session_id))
        except UnknownSession as exc:
            return JSONResponse({"error": str(exc)}, 404)

    @app.get("/v1/sessions/{session_id}/video")
    async def session_video(session_id: str) -> Response:
        handle, name = tempfile.mkstemp(suffix=".mp4", prefix="video-", dir=manager.folder.work)
        os.close(handle)  # in the server's own folder: swept if it is killed mid-answer
        target = Path(name)
        try:
            frames = await run_in_threadpool(manager.video, session_id, target)
        except UnknownSession as exc:
            target.unlink(missing_ok=True)
            return error_response(str(exc), 404)
        except Exception as exc:  # noqa: BLE001 - closed under us: its files went with it
            target.unlink(missing_ok=True)
            return error_response(f"video: the session's video is gone ({type(exc).__name__}); "
                                  f"it was closed while this request read it", 404)
        if frames == 0:
            target.unlink(missing_ok=True)
            return error_response("no frame was made yet; try again after the first block", 404)
        return FileResponse(target, media_type="video/mp4", filename="session.mp4",
                            background=BackgroundTask(target.unlink, missing_ok=True))

    @app.websocket("/v1/sessions/{session_id}/stream")
    async def stream(websocket: WebSocket, session_id: str) -> None:
        problem = guard.websocket_problem(websocket)
        if problem is not None:
            await websocket.close(WS_POLICY_VIOLATION, close_reason(problem))
            return
        await websocket.accept(headers=None if worker is None else
                               [(b"x-ardiff-worker", str(worker).encode())])
        loop, wake = asyncio.get_running_loop(), asyncio.Event()
        try:
            session = manager.connect(session_id, lambda: _call_soon(loop, wake))
        except UnknownSession as exc:
            await websocket.close(WS_UNKNOWN, close_reason(str(exc)))
            return
        except SessionBusy as exc:
            await websocket.close(WS_BUSY, close_reason(str(exc)))
            return
        try:
            await stream_session(websocket, manager, session, wake)
        finally:
            manager.disconnect(session)

    return app


def describe_server(manager: SessionManager) -> dict[str, Any]:
    """What a client needs to start and steer sessions: the pipeline, its actions and the
    keys of `play` (key -> action), the session defaults, the capacity."""
    from ardiff.config.play import key_map

    config, names = manager.config, manager.action_names
    keys = {} if names is None else dict(key_map(config.play, names).keys)
    prompt = config.rollout.prompt
    inputs = manager.inputs
    return {"pipeline": config.pipeline.entry, "actions": None if names is None else list(names),
            "inputs": None if inputs is None else dataclasses.asdict(inputs),
            "keys": keys, "idle": manager.idle_action, "capacity": manager.capacity,
            "defaults": {"prompt": prompt if isinstance(prompt, str) else None,
                         "seed": config.rollout.seed, "frames": config.rollout.frames,
                         "fps": config.output.fps,
                         "mode": "paced" if names is not None else "fast"}}


def add_page_routes(app: FastAPI) -> None:
    """The page at `/` and its files at `/static/NAME` (served by one server or the front)."""

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return _page_file("index.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def page_file(name: str) -> Response:
        return _page_file(name)


def _page_file(name: str) -> Response:
    """One of the page's files (a fixed list: a client's value never names a path)."""
    from importlib import resources

    media_type = PAGE_FILES.get(name)
    if media_type is None:
        return JSONResponse({"error": "not found"}, 404)
    text = resources.files("ardiff.serve").joinpath("static").joinpath(name).read_text("utf-8")
    return Response(text, media_type=media_type)


def _call_soon(loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
    """Set `wake` on its loop, from any thread (a loop already closed: nobody waits)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(wake.set)
