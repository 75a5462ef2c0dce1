"""Client-chosen session ids (`PUT /v1/sessions/{id}`, so a balancer can hash them), through
a real server: the session is made under that id and answers to it everywhere; a taken id
is 409; a malformed one is a one-line 422 naming `id`; the Origin and JSON checks apply."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.extra("serve")
SID = "0123456789abcdef-client_chosen"


def test_a_session_under_the_client_s_id(local_app, frames_of):
    server = local_app
    made = server.http.put(f"/v1/sessions/{SID}", json={"frames": 2, "mode": "fast"})
    assert made.status_code == 201
    assert made.json()["id"] == SID and made.json()["stream"] == f"/v1/sessions/{SID}/stream"
    with server.stream(SID) as ws:
        headers, _, end = frames_of(ws)
    assert len(headers) == 2 and end["event"] == "done"
    assert server.http.get(f"/v1/sessions/{SID}").json()["id"] == SID
    again = server.http.put(f"/v1/sessions/{SID}", json={})
    assert again.status_code == 409
    assert again.json()["error"] == (f"id: a session {SID!r} exists; choose another id, or "
                                     f"DELETE it first")
    assert server.http.delete(f"/v1/sessions/{SID}").status_code == 200


@pytest.mark.parametrize("bad", ["short", "x" * 129, "has.a.dot-0123456789", "space%20in-0123456789"])
def test_a_malformed_id_is_refused_naming_id(local_app, bad):
    response = local_app.http.put(f"/v1/sessions/{bad}", json={})
    assert response.status_code == 422 and response.json()["field"] == "id"
    assert response.json()["error"].endswith("is not a session id; use 16 to 128 letters, "
                                             "digits, '-' or '_' (a random one: a UUID4's hex)")


def test_put_is_checked_as_post_is(local_app):
    server = local_app
    assert server.http.put(f"/v1/sessions/{SID}", json={},
                           headers={"origin": "http://evil.example"}).status_code == 403
    assert server.http.put(f"/v1/sessions/{SID}", content=b"{}",
                           headers={"content-type": "text/plain"}).status_code == 415
    assert server.http.get(f"/v1/sessions/{SID}").status_code == 404
