"""A session's WebSocket stream on one server: frames out, steering in, the end message.

    await stream_session(websocket, manager, session, wake)   # app.py's stream route

Two tasks share the socket (one message at a time): one sends each queued frame
(ardiff.serve.frames) and, once the session is final, `{"event": done|failed|closed, ...}`
and the close code; the other reads the client's messages (`{"action": a}`, `{"prompt": p,
"on_switch": k}`, `{"pause": b}`), each applied at the next block boundary or answered with
`{"event": "error", "error": <one line>}`. Either ending ends both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from fastapi import WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from ardiff.errors import ConfigError
from ardiff.serve.frames import frame_message
from ardiff.serve.http import WS_FAILED, WS_TOO_BIG, close_reason, parse_json
from ardiff.serve.manager import SessionManager
from ardiff.serve.session import ServeSession, State, UnknownSession


async def stream_session(websocket: WebSocket, manager: SessionManager, session: ServeSession,
                  wake: asyncio.Event) -> None:
    """Send frames and read steering until the session ends or the client leaves."""
    lock = asyncio.Lock()  # one message at a time on the socket
    sender = asyncio.create_task(_send_frames(websocket, manager, session, wake, lock))
    receiver = asyncio.create_task(_receive(websocket, manager, session, lock))
    done, pending = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in (*done, *pending):
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await task


async def _send_frames(websocket: WebSocket, manager: SessionManager, session: ServeSession,
                       wake: asyncio.Event, lock: asyncio.Lock) -> None:
    image, quality = session.options.image, manager.config.serve.jpeg_quality
    while True:
        wake.clear()
        frame = session.queue.pop()
        if frame is not None:
            message = await run_in_threadpool(frame_message, frame, image, quality,
                                              session.queue.dropped)
            async with lock:
                await websocket.send_bytes(message)
            continue
        if session.state.is_final:
            await _send_end(websocket, session, lock)
            return
        await wake.wait()


async def _send_end(websocket: WebSocket, session: ServeSession, lock: asyncio.Lock) -> None:
    """The last message ({"event": done|failed|closed, ...}), then the close code."""
    state = session.state
    async with lock:
        await websocket.send_text(json.dumps({"event": state.value, "frames": session.frames_made,
                                              "error": session.error}))
        if state is State.FAILED:
            await websocket.close(WS_FAILED, close_reason(session.error or "failed"))
        else:
            await websocket.close(1000, state.value)


async def _receive(websocket: WebSocket, manager: SessionManager, session: ServeSession,
                   lock: asyncio.Lock) -> None:
    limit = manager.config.serve.max_message_bytes
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None and message.get("bytes") is not None:
            text = message["bytes"].decode("utf-8", "replace")
        if text is None:
            continue
        if len(text.encode("utf-8", "surrogatepass")) > limit:
            async with lock:
                await websocket.close(WS_TOO_BIG, f"a message over {limit} bytes")
            return
        error = await run_in_threadpool(_apply, manager, session, text)
        if error is not None:
            async with lock:
                await websocket.send_text(json.dumps({"event": "error", "error": error}))


def _apply(manager: SessionManager, session: ServeSession, text: str) -> str | None:
    """One client message applied to its session; the one-line error, or None."""
    try:
        message = parse_json(text, "message")
    except ConfigError as exc:
        return f"{exc} ({{\"action\": ...}}, {{\"prompt\": ...}} or {{\"pause\": ...}})"
    if not isinstance(message, dict) or not message.keys() & {"action", "prompt", "pause"}:
        return ("message: expected an object with action, prompt (and on_switch) or pause; "
                "got " + text[:80])
    try:
        if "action" in message:
            manager.steer(session.public_id, message["action"])
        if "prompt" in message:
            manager.switch_prompt(session.public_id, message["prompt"],
                                  message.get("on_switch", "keep"))
        if "pause" in message:
            if not isinstance(message["pause"], bool):
                return "pause: expected true or false"
            manager.pause(session.public_id, message["pause"])
    except (ConfigError, UnknownSession) as exc:
        return str(exc)
    return None
