"""The HTTP pieces every app of `ardiff serve` shares: who may call, what a body may be, errors.

    guard = Guard(token="s3cret", allowed_hosts={"serve.example"}, allowed_origins=set())
    add_guard(app, guard)                      # every HTTP request: Host, Origin, JSON, token
    problem = guard.websocket_problem(ws)      # the same for a WebSocket handshake
    body = await read_json_body(request, max_bytes)   # JSON or the 413/415/422 Response

Browsers are the threat model (docs/serve.md, "Security"): a page of another site may send
requests to a server on the user's machine. So:
- `Host` must be an IP address, `localhost`, or a name given with `--allowed-host`: a
  DNS-rebinding page (its own name resolving to 127.0.0.1) is refused (421).
- `Origin`, when a browser sends one, must be the server's own (the page) or one given with
  `--allowed-origin`, on every state-changing request and every WebSocket handshake (403).
- A request with a body must say `Content-Type: application/json` (415): a cross-site form
  or `text/plain` fetch cannot create a session without a CORS preflight, which is refused.
- JSON nested deeper than MAX_JSON_DEPTH is a 422 one-line error, never a RecursionError.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from ardiff.errors import ConfigError

MAX_JSON_DEPTH = 32          # objects and lists in a body or a message: no option needs more
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
WS_POLICY_VIOLATION = 1008   # a bad token, Host or Origin
WS_TOO_BIG = 1009            # a client message over serve.max_message_bytes
WS_FAILED = 1011             # the session's pipeline failed: the reason is its error line
WS_UNKNOWN = 4404            # no such session
WS_BUSY = 4409               # another client streams it
MAX_REASON_BYTES = 123       # what a WebSocket close reason may hold
PAGE_PATHS = ("/", "/static/index.html", "/static/page.js", "/static/page.css")
OPEN_PATHS = ("/health", *PAGE_PATHS)  # no token needed (the page holds no data)


@dataclass(frozen=True)
class Guard:
    """Who may call a server: its token (None: anyone who passes the Host and Origin checks),
    the host names beyond IP addresses and localhost, the origins beyond its own ("*": any)."""

    token: str | None = None
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    allowed_origins: frozenset[str] = field(default_factory=frozenset)

    def host_problem(self, host_header: str | None) -> str | None:
        """Why the `Host` header is refused, or None."""
        name = _host_name(host_header or "")
        if "*" in self.allowed_hosts or _is_ip(name) or name == "localhost" \
                or name in self.allowed_hosts:
            return None
        return (f"Host: {name[:64]!r} is not this server's; a page of another site cannot "
                f"call it (start the server with --allowed-host {name[:64]} to allow it)")

    def origin_problem(self, origin: str | None, host_header: str | None) -> str | None:
        """Why a browser's `Origin` is refused (none sent: not a browser, allowed), or None."""
        if origin is None or "*" in self.allowed_origins or origin in self.allowed_origins:
            return None
        own = urlsplit(origin).netloc.lower() == (host_header or "").lower()
        if own and origin.lower().startswith(("http://", "https://")):
            return None
        return (f"Origin: {origin[:64]!r} is not this server's own; a page of another site "
                f"cannot change its sessions (start it with --allowed-origin to allow one)")

    def has_token(self, header: str | None, query: str | None = None) -> bool:
        """The request carries the token (`Authorization: Bearer T`, or `?token=T`)."""
        if self.token is None:
            return True
        given = query
        if header is not None and header.lower().startswith("bearer "):
            given = header[len("bearer "):].strip()
        return given is not None and secrets.compare_digest(given.encode(),
                                                            self.token.encode())

    def websocket_problem(self, websocket: WebSocket) -> str | None:
        """Why a WebSocket handshake is refused (closed 1008 with it), or None."""
        headers = websocket.headers
        problem = self.host_problem(headers.get("host")) or self.origin_problem(
            headers.get("origin"), headers.get("host"))
        if problem is None and not self.has_token(headers.get("authorization"),
                                                  websocket.query_params.get("token")):
            problem = "missing or wrong token"
        return problem


def add_guard(app: FastAPI, guard: Guard, worker: int | None = None) -> None:
    """Every HTTP request passes the Host check, a state-changing one the Origin and JSON
    checks, and every one but `OPEN_PATHS` the token; a worker of a pool names itself in
    `x-ardiff-worker` on every answer."""

    @app.middleware("http")
    async def check(request: Request, call_next: Any) -> Response:
        refused = request_problem(guard, request)
        if refused is not None:
            return refused
        response: Response = await call_next(request)
        if worker is not None:
            response.headers["x-ardiff-worker"] = str(worker)
        return response


def request_problem(guard: Guard, request: Request) -> Response | None:
    """The error response for a request the guard refuses, or None."""
    headers = request.headers
    problem = guard.host_problem(headers.get("host"))
    if problem is not None:
        return error_response(problem, 421)
    if request.method in STATE_CHANGING:
        problem = guard.origin_problem(headers.get("origin"), headers.get("host"))
        if problem is not None:
            return error_response(problem, 403)
        if _has_body(request) and not _is_json(headers.get("content-type")):
            return error_response(f"Content-Type: {headers.get('content-type', '')[:64]!r}; "
                                  f"send the body as application/json", 415)
    if request.url.path not in OPEN_PATHS and not guard.has_token(headers.get("authorization")):
        return JSONResponse({"error": "missing or wrong token; send Authorization: Bearer "
                                      "<token>"}, 401, {"WWW-Authenticate": "Bearer"})
    return None


async def read_json_body(request: Request, max_bytes: int) -> Any:
    """The request's JSON (None when empty), or the error Response (413, 422)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        return _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            return _too_large(max_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return None
    try:
        return parse_json(raw, "body")
    except ConfigError as exc:
        return unprocessable(exc)


def parse_json(raw: str | bytes, what: str) -> Any:
    """JSON text as values; ConfigError (one line, naming `what`) when it is not JSON or is
    nested deeper than MAX_JSON_DEPTH (checked before parsing: no recursion on hostile input)."""
    depth = _nesting_depth(raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))
    if depth > MAX_JSON_DEPTH:
        raise ConfigError(f"{what}: JSON nested {depth} levels deep, more than "
                          f"{MAX_JSON_DEPTH}; send a flatter object")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ConfigError(f"{what}: not JSON ({detail}); send a JSON object") from None


def _nesting_depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status, headers)


def unprocessable(exc: ConfigError) -> Response:
    """422 with the message and the field it names (the text before the first colon)."""
    message = str(exc)
    return JSONResponse({"error": message, "field": message.split(":", 1)[0]}, 422)


def close_reason(text: str) -> str:
    """A WebSocket close reason: at most MAX_REASON_BYTES of UTF-8, cut at a character."""
    data = text.encode("utf-8")[:MAX_REASON_BYTES]
    return data.decode("utf-8", "ignore")


def _too_large(max_bytes: int) -> Response:
    return error_response(f"body: larger than serve.max_body_bytes ({max_bytes} bytes); send "
                          f"a smaller one", 413)


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return request.headers.get("transfer-encoding") is not None or (
        length is not None and length.strip() not in ("", "0"))


def _is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() == "application/json"


def _host_name(host: str) -> str:
    """The name of a `Host` header, without its port (`[::1]:80` -> `::1`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
