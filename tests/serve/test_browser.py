"""`ardiff serve` against a hostile web page, through a real server on 127.0.0.1 (no token,
as a user runs it locally): a page of another site cannot start sessions (text/plain or
form POSTs: 415; a foreign Origin: 403), open a session's stream (foreign Origin: refused
handshake) or read session ids by DNS rebinding (Host: evil.example: 421); the server's
own page (same Origin and Host) works; --allowed-host / --allowed-origin let named ones in.
Hostile JSON (60 KB of `[`, over HTTP and the WebSocket) is a one-line 4xx; the value the
server once used as an internal "left out" marker is refused as any bad value is."""

from __future__ import annotations

import json

import pytest
from extras import require_extra

require_extra("serve")

from websockets.exceptions import InvalidStatus  # noqa: E402

EVIL = "http://evil.example"
DEEP = b"[" * 60_000  # under the body limit below; json.loads would recurse past Python's


@pytest.fixture
def local(local_app):
    return local_app


def _created(server) -> int:
    return server.manager.stats.created


def test_a_cross_site_post_without_json_is_refused_415_and_makes_no_session(local):
    before = _created(local)
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x"):
        response = local.http.post("/v1/sessions", content=b'{"frames": 2}',
                                   headers={"content-type": content_type})
        assert response.status_code == 415, response.text
        assert response.json() == {"error": f"Content-Type: {content_type!r}; send the body "
                                            f"as application/json"}
    assert _created(local) == before


def test_a_foreign_origin_cannot_create_or_delete_and_the_page_s_own_can(local):
    before = _created(local)
    refused = local.http.post("/v1/sessions", json={"frames": 1},
                              headers={"origin": EVIL})
    assert refused.status_code == 403
    assert refused.json()["error"] == ("Origin: 'http://evil.example' is not this server's "
                                       "own; a page of another site cannot change its sessions "
                                       "(start it with --allowed-origin to allow one)")
    assert local.http.post("/v1/sessions", json={}, headers={"origin": "null"}).status_code \
        == 403  # a sandboxed frame's origin
    assert _created(local) == before
    own = local.http.post("/v1/sessions", json={"frames": 1, "mode": "fast"},
                          headers={"origin": local.url})
    assert own.status_code == 201, own.text
    session = own.json()["id"]
    gone = local.http.delete(f"/v1/sessions/{session}", headers={"origin": EVIL})
    assert gone.status_code == 403
    assert local.http.delete(f"/v1/sessions/{session}",
                             headers={"origin": local.url}).status_code == 200


def test_a_foreign_origin_cannot_open_a_stream(local, frames_of):
    from websockets.sync.client import connect

    session = local.create(frames=2, mode="fast")
    url = f"ws://127.0.0.1:{local.port}/v1/sessions/{session}/stream"
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, origin=EVIL, open_timeout=30):
            pass
    assert refused.value.response.status_code == 403
    with connect(url, origin=local.url, open_timeout=30) as ws:  # the page's own origin
        headers, _, end = frames_of(ws)
    assert len(headers) == 2 and end["event"] == "done"
    local.http.delete(f"/v1/sessions/{session}")


def test_dns_rebinding_cannot_read_the_session_ids(local):
    session = local.create(frames=None, mode="paced", fps=0.5, paused=True)
    rebound = local.http.get("/v1/sessions", headers={"host": "evil.example"})
    assert rebound.status_code == 421 and session not in rebound.text
    assert rebound.json()["error"] == ("Host: 'evil.example' is not this server's; a page of "
                                       "another site cannot call it (start the server with "
                                       "--allowed-host evil.example to allow it)")
    assert local.http.get("/", headers={"host": "evil.example:80"}).status_code == 421
    for host in (f"localhost:{local.port}", f"127.0.0.1:{local.port}", "[::1]"):
        assert local.http.get("/v1/sessions", headers={"host": host}).status_code == 200, host
    local.http.delete(f"/v1/sessions/{session}")


def test_allowed_hosts_and_origins_let_the_named_ones_in(serve_app):
    from ardiff.serve.http import Guard

    server = serve_app(guard=Guard(allowed_hosts=frozenset({"serve.example"}),
                                   allowed_origins=frozenset({"https://app.example"})))
    assert server.http.get("/health", headers={"host": "serve.example"}).status_code == 200
    assert server.http.get("/health", headers={"host": "other.example"}).status_code == 421
    made = server.http.post("/v1/sessions", json={"frames": 1, "mode": "fast"},
                            headers={"origin": "https://app.example"})
    assert made.status_code == 201
    server.http.delete(f"/v1/sessions/{made.json()['id']}")


def test_deeply_nested_json_is_a_one_line_422_over_http_and_the_socket(local):
    before = _created(local)
    response = local.http.post("/v1/sessions", content=DEEP,
                               headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"] == ("body: JSON nested 60000 levels deep, more than 32; "
                                        "send a flatter object")
    assert _created(local) == before
    session = local.create(frames=1, mode="fast", paused=True)
    with local.stream(session) as ws:
        ws.send(DEEP.decode())
        error = json.loads(ws.recv(timeout=30))
        assert error == {"event": "error", "error": (
            "message: JSON nested 60000 levels deep, more than 32; send a flatter object "
            "({\"action\": ...}, {\"prompt\": ...} or {\"pause\": ...})")}
        ws.send(json.dumps({"pause": False}))  # the stream goes on
        assert isinstance(ws.recv(timeout=30), bytes)
    local.http.delete(f"/v1/sessions/{session}")


def test_the_old_internal_marker_is_refused_as_a_value(local):
    response = local.http.post("/v1/sessions", json={"frames": "__config__"})
    assert response.status_code == 422 and response.json()["field"] == "frames"
    assert "'__config__'" in response.json()["error"]
