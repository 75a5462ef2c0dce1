"""The front of `ardiff serve --workers N`: the public port, routing every session to its worker.

    app = create_front_app(pool, token="s3cret")    # uvicorn runs it (ardiff_cli.serve)

    client --HTTP/WS--> front (public port, --token) --httpx / websockets--> worker i

    POST /v1/sessions       placed on the ready worker with the most free session slots (then
                            the most free KV pages); its answer passed on; the id -> worker
    /v1/sessions/{id}...    GET, DELETE, /video, WS /stream: proxied to the session's worker
    GET /v1/sessions        every worker's sessions (each with `worker`), and lost ones
    GET /health, /metrics   per worker (`workers[]`; a `worker` label on every sample)

The API is the one-worker API (ardiff.serve.app) plus `worker` where it helps; every worker
response carries `X-Ardiff-Worker`. A session whose worker died reads `failed` with the one
line saying why (GET), and its stream ends with `{"event": "failed", ...}` and close 1011.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ardiff.errors import ConfigError
from ardiff.serve.app import add_page_routes
from ardiff.serve.http import (
    WS_POLICY_VIOLATION,
    Guard,
    add_guard,
    close_reason,
    read_json_body,
    unprocessable,
)
from ardiff.serve.metrics import FrontCollector, metrics_of
from ardiff.serve.options import check_session_id
from ardiff.serve.proxy import hear_death, proxy_stream
from ardiff.serve.workers import WORKER_HEADER, WorkerPool, WorkerSlot

PASSED_HEADERS = ("content-type", "content-disposition", "retry-after", WORKER_HEADER)
WORKER_TIMEOUT = httpx.Timeout(120.0, connect=5.0)  # a DELETE waits for a block boundary


def create_front_app(pool: WorkerPool, guard: Guard | None = None) -> FastAPI:
    """The front's app; its shutdown (uvicorn's, on SIGINT/SIGTERM) stops every worker.
    `guard`: who may call (ardiff.serve.http; the workers trust only the front)."""
    guard = guard or Guard()
    clients: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        clients["http"] = httpx.AsyncClient(timeout=WORKER_TIMEOUT, headers=pool.auth_headers)
        try:
            yield
        finally:
            await clients["http"].aclose()
            await run_in_threadpool(pool.shutdown)

    app = FastAPI(title="ardiff serve", lifespan=lifespan,
                  description="Live sessions of an ardiff pipeline over several workers "
                              "(docs/serve.md).")
    limits = pool.config.serve

    def http() -> httpx.AsyncClient:
        return clients["http"]

    add_guard(app, guard)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        workers = await _worker_health(http(), pool)
        ready = [w for w in workers if w["status"] == "ok"]
        status = ("stopping" if not pool.accepting else
                  "ok" if len(ready) == len(workers) else "degraded" if ready else "failed")
        return {"status": status, "sessions": sum(w.get("sessions") or 0 for w in workers),
                "capacity": sum(w.get("capacity") or 0 for w in workers), "workers": workers}

    add_page_routes(app)

    @app.get("/v1/info")
    async def server_info() -> Response:
        for slot in pool.ready():
            with contextlib.suppress(httpx.HTTPError, ValueError):
                info = (await http().get(f"{slot.url}/v1/info")).json()
                info["capacity"] = sum(s.capacity for s in pool.slots)
                info["workers"] = pool.size
                return JSONResponse(info)
        return JSONResponse({"error": "no worker is serving now; retry later"}, 503,
                            {"Retry-After": str(limits.retry_after_s)})

    @app.get("/metrics")
    async def metrics_text() -> Response:
        texts = await asyncio.gather(*(metrics_of(http(), slot) for slot in pool.ready()))
        registry = CollectorRegistry()
        registry.register(FrontCollector(pool, dict(t for t in texts if t is not None)))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/sessions", status_code=201)
    async def create_session(request: Request) -> Response:
        body = await read_json_body(request, limits.max_body_bytes)
        if isinstance(body, Response):
            return body
        return await _place(http(), pool, json.dumps(body).encode())

    @app.put("/v1/sessions/{session_id}", status_code=201)
    async def create_named_session(request: Request, session_id: str) -> Response:
        body = await read_json_body(request, limits.max_body_bytes)
        if isinstance(body, Response):
            return body
        try:
            check_session_id(session_id)
        except ConfigError as exc:
            return unprocessable(exc)
        if pool.route(session_id) is not None:
            return JSONResponse({"error": f"id: a session {session_id[:64]!r} exists; choose "
                                          f"another id, or DELETE it first"}, 409)
        return await _place(http(), pool, json.dumps(body).encode(), session_id)

    @app.get("/v1/sessions")
    async def list_sessions() -> dict[str, Any]:
        listings = await asyncio.gather(*(_listing(http(), slot) for slot in pool.ready()))
        sessions: list[dict[str, Any]] = []
        in_use = total = 0
        for slot, listing in listings:
            if listing is None:
                continue
            sessions += [{**s, "worker": slot.index} for s in listing["sessions"]]
            in_use += listing.get("kv_pages_in_use") or 0
            total += listing.get("kv_pages_total") or 0
        sessions += [_lost_view(sid, worker, error) for sid, worker, error in pool.lost_sessions()]
        return {"sessions": sessions, "capacity": sum(s.capacity for s in pool.slots),
                "kv_pages_in_use": in_use, "kv_pages_total": total,
                "workers": await _worker_health(http(), pool)}

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str) -> Response:
        return await _session_call(http(), pool, "GET", session_id, "")

    @app.delete("/v1/sessions/{session_id}")
    async def delete_session(session_id: str) -> Response:
        return await _session_call(http(), pool, "DELETE", session_id, "")

    @app.get("/v1/sessions/{session_id}/video")
    async def session_video(session_id: str) -> Response:
        return await _session_call(http(), pool, "GET", session_id, "/video", stream=True)

    @app.websocket("/v1/sessions/{session_id}/stream")
    async def stream(websocket: WebSocket, session_id: str) -> None:
        problem = guard.websocket_problem(websocket)
        if problem is not None:
            await websocket.close(WS_POLICY_VIOLATION, close_reason(problem))
            return
        await proxy_stream(websocket, pool, session_id)

    return app


# -- placing and routing -------------------------------------------------------------------
async def _place(client: httpx.AsyncClient, pool: WorkerPool, body: bytes,
                 session_id: str | None = None) -> Response:
    """Create the session (with the client's id: `PUT`) on the worker with the most free
    room; the next one if it refuses (503); 503 when none can take it."""
    retry = {"Retry-After": str(pool.config.serve.retry_after_s)}
    if not pool.accepting:
        return JSONResponse({"error": "the server is shutting down; it takes no new "
                                      "sessions"}, 503, retry)
    candidates = []
    for slot, load in pool.loads():  # what each worker last told (its beats): no HTTP call
        free = load["capacity"] - load["sessions"] - pool.placing[slot.index]
        pages_total = load.get("kv_pages_total") or 0
        pages_free = pages_total - (load.get("kv_pages_in_use") or 0)
        candidates.append((-free, -(pages_free / pages_total if pages_total else 0.0),
                           slot.index, slot, slot.generation))
    last: httpx.Response | None = None
    for minus_free, _pages, _index, slot, generation in sorted(candidates,
                                                               key=lambda c: c[:3]):
        if minus_free >= 0:
            break
        pool.placing[slot.index] += 1
        try:
            response = await client.request(
                "POST" if session_id is None else "PUT",
                f"{slot.url}/v1/sessions" + ("" if session_id is None else f"/{session_id}"),
                content=body, headers={"content-type": "application/json"})
        except httpx.HTTPError:
            continue  # it died under us: the next one
        finally:
            pool.placing[slot.index] -= 1
        if response.status_code == 201:
            pool.add_route(response.json()["id"], slot, generation)  # counts it till a beat
            return _passed(response)
        if response.status_code != 503:
            return _passed(response)  # 422, 413: the body's fault, the same on every worker
        last = response
    if last is not None:
        return _passed(last)
    capacity = sum(s.capacity for s in pool.slots)
    serving = len(pool.ready())
    return JSONResponse({"error": f"all {capacity} session slots of the {pool.size} workers "
                                  f"are in use ({serving} serving now); retry later"}, 503,
                        retry)


async def _session_call(client: httpx.AsyncClient, pool: WorkerPool, method: str,
                        session_id: str, tail: str, stream: bool = False) -> Response:
    """A request about one session, answered by its worker."""
    slot = pool.route(session_id)
    if slot is None:
        return _not_routed(pool, method, session_id, tail)
    url = f"{slot.url}/v1/sessions/{session_id}{tail}"
    try:
        if stream:
            request = client.build_request(method, url)
            upstream = await client.send(request, stream=True)
            if upstream.status_code != 200:
                await upstream.aread()
                await upstream.aclose()
                return _passed(upstream)
            headers = _headers(upstream)
            if "content-length" in upstream.headers:
                headers["content-length"] = upstream.headers["content-length"]
            return StreamingResponse(upstream.aiter_raw(), upstream.status_code, headers,
                                     background=BackgroundTask(upstream.aclose))
        response = await client.request(method, url)
    except httpx.HTTPError as exc:
        await hear_death(pool, session_id)
        if pool.route(session_id) is None:
            return _not_routed(pool, method, session_id, tail)
        return JSONResponse({"error": f"worker {slot.index} did not answer "
                                      f"({type(exc).__name__}); retry later"}, 502)
    if (response.status_code == 404 and not tail) or (method == "DELETE"
                                                       and response.status_code == 200):
        pool.forget(session_id)  # closed: its worker no longer has it
    return _passed(response)


def _not_routed(pool: WorkerPool, method: str, session_id: str, tail: str) -> Response:
    """A session no worker holds: lost with its worker (failed, and why), or unknown."""
    lost = pool.lost_error(session_id)
    if lost is None:
        return JSONResponse({"error": f"no session {session_id[:64]!r}; it was closed or "
                                      f"never existed"}, 404)
    worker, error = lost
    if tail:  # its video went with its worker
        return JSONResponse({"error": error}, 404)
    if method == "DELETE":
        pool.forget(session_id)
    return JSONResponse(_lost_view(session_id, worker, error))


def _lost_view(session_id: str, worker: int, error: str) -> dict[str, Any]:
    return {"id": session_id, "status": "failed", "error": error, "worker": worker}


def _passed(response: httpx.Response) -> Response:
    """A worker's answer, as the front's."""
    return Response(response.content, response.status_code, _headers(response))


def _headers(response: httpx.Response) -> dict[str, str]:
    return {name: response.headers[name] for name in PASSED_HEADERS if name in response.headers}


async def _listing(client: httpx.AsyncClient, slot: WorkerSlot
                   ) -> tuple[WorkerSlot, dict[str, Any] | None]:
    """A worker's GET /v1/sessions (None: it did not answer)."""
    try:
        response = await client.get(f"{slot.url}/v1/sessions", timeout=5.0)
        return slot, response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return slot, None


async def _worker_health(client: httpx.AsyncClient, pool: WorkerPool) -> list[dict[str, Any]]:
    async def one(slot: WorkerSlot) -> dict[str, Any]:
        described: dict[str, Any] = {
            "worker": slot.index, "device": slot.device, "pid": slot.pid,
            "status": slot.state, "restarts": slot.restarts, "sessions_lost": slot.lost,
            "sessions": None, "capacity": slot.capacity or None, "error": slot.error}
        if slot.state != "ready":
            return described
        try:
            answer = (await client.get(f"{slot.url}/health", timeout=5.0)).json()
        except (httpx.HTTPError, ValueError):
            return {**described, "status": "not answering"}
        return {**described, "status": answer["status"], "sessions": answer["sessions"],
                "capacity": answer["capacity"]}

    return list(await asyncio.gather(*(one(slot) for slot in pool.slots)))
