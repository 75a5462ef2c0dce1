"""The front's side of a session's stream (`ardiff serve --workers N`): the client's
WebSocket joined to the one on the session's worker, both ways.

    await proxy_stream(websocket, pool, session_id)   # front.py's stream route

Frames, steering and close codes pass unchanged. A worker that closes the stream: its code
and reason; one whose process died (no close frame): `{"event": "failed", ...}` and 1011
with the one line saying why; a session no worker holds: 4404.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from fastapi import WebSocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from ardiff.serve.frames import parse_frame_message
from ardiff.serve.http import WS_FAILED, WS_UNKNOWN, close_reason
from ardiff.serve.workers import WORKER_HEADER, WorkerPool

DEATH_WAIT_S = 5.0      # a worker that stopped answering: how long to wait to hear it died


async def proxy_stream(websocket: WebSocket, pool: WorkerPool, session_id: str) -> None:
    """The client's stream, joined to the session's stream on its worker both ways; the
    worker's close (code and reason) passed on; a worker that died: `failed`, 1011."""
    slot = pool.route(session_id)
    if slot is None:
        await websocket.accept()
        await _end_unrouted(websocket, pool, session_id, 0)
        return
    url = f"ws://127.0.0.1:{slot.port}/v1/sessions/{session_id}/stream"
    try:
        upstream = await connect(url, additional_headers=pool.auth_headers, max_size=None,
                                 compression=None, open_timeout=30)
    except (OSError, InvalidHandshake, TimeoutError):
        await websocket.accept()
        await hear_death(pool, session_id)
        await _end_unrouted(websocket, pool, session_id, 0)
        return
    worker = (upstream.response.headers.get(WORKER_HEADER) if upstream.response is not None
              else None) or str(slot.index)
    await websocket.accept(headers=[(WORKER_HEADER.encode(), worker.encode())])
    frames = [0]
    down = asyncio.create_task(_downstream(upstream, websocket, frames))
    up = asyncio.create_task(_upstream(websocket, upstream))
    done, pending = await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
    # The worker ended the stream (down returned, or a send to it failed: up raised), or
    # the client left (up returned, or a send to it failed: down raised).
    worker_ended = (down in done and down.exception() is None) or (
        up in done and up.exception() is not None)
    for task in pending:
        task.cancel()
    for task in (*done, *pending):
        with contextlib.suppress(BaseException):  # its end is read above; nothing to add
            await task
    if worker_ended:
        with contextlib.suppress(Exception):  # the client may be gone too
            await _end_like_worker(websocket, upstream, pool, session_id, frames[0])
    await upstream.close()


async def _downstream(upstream: ClientConnection, websocket: WebSocket,
                      frames: list[int]) -> None:
    """The worker's messages to the client, in order, until the worker closes; `frames[0]`:
    the session's frames made up to the last one passed on."""
    with contextlib.suppress(ConnectionClosed):
        async for message in upstream:
            if isinstance(message, bytes):
                await websocket.send_bytes(message)
                frame = parse_frame_message(message)[0].get("frame")
                frames[0] = frame + 1 if isinstance(frame, int) else frames[0]
            else:
                await websocket.send_text(message)


async def _upstream(websocket: WebSocket, upstream: ClientConnection) -> None:
    """The client's messages to the worker, until the client leaves."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") is not None:
            await upstream.send(message["text"])
        elif message.get("bytes") is not None:
            await upstream.send(message["bytes"])


async def _end_like_worker(websocket: WebSocket, upstream: ClientConnection, pool: WorkerPool,
                           session_id: str, frames: int) -> None:
    """The worker closed the stream: its code and reason; no close frame (its process is
    gone): the session failed with its worker."""
    close = upstream.protocol.close_rcvd
    if close is not None:
        await websocket.close(close.code if close.code not in (1005, 1006) else 1000,
                              close.reason)
        return
    await hear_death(pool, session_id)
    await _end_unrouted(websocket, pool, session_id, frames)


async def _end_unrouted(websocket: WebSocket, pool: WorkerPool, session_id: str,
                        frames: int) -> None:
    """End a stream no worker holds: `failed` with its worker's death, else unknown."""
    lost = pool.lost_error(session_id)
    if lost is None:
        if pool.route(session_id) is not None:  # alive, but its worker did not answer
            await websocket.close(WS_FAILED, "its worker did not answer; reconnect")
            return
        await websocket.close(WS_UNKNOWN, close_reason(f"no session {session_id[:64]!r}; it "
                                                       f"was closed or never existed"))
        return
    _worker, error = lost
    await websocket.send_text(json.dumps({"event": "failed", "frames": frames,
                                          "error": error}))
    await websocket.close(WS_FAILED, close_reason(error))


async def hear_death(pool: WorkerPool, session_id: str) -> None:
    """Wait (a little) until the pool knows whether the session's worker died."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEATH_WAIT_S
    while pool.route(session_id) is not None and loop.time() < deadline:
        await asyncio.sleep(0.05)
