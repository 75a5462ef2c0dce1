"""`ardiff serve`'s API through a real server on 127.0.0.1 and real clients (httpx,
websockets): a session's frames in order, its status, video and close; bad options (422
with the dotted path, 413); admission (503 + Retry-After, then room after a close); the
token; bad stream messages; the page's files. The default run's share: one small
world-model server for the module (token, 2 sessions, small limits), warmup off."""

from __future__ import annotations

import pytest
from extras import require_extra

require_extra("serve")

import io

import av
import numpy as np
from websockets.exceptions import InvalidStatus

from ardiff.config.run import load_config


def test_a_session_streams_its_frames_in_order_and_closes(shared_app, frames_of):
    server = shared_app
    session = server.create(frames=6, mode="fast", image="png", seed=5)
    with server.stream(session) as ws:
        headers, pictures, end = frames_of(ws)
    assert [h["frame"] for h in headers] == list(range(6))
    assert [h["block"] for h in headers] == list(range(6))  # one frame per block
    script = load_config(None).rollout.actions               # the config's actions, repeating
    assert [h["actions"] for h in headers] == [[script[i % len(script)]] for i in range(6)]
    assert all(p.shape == (32, 32, 3) for p in pictures)
    assert end == {"event": "done", "frames": 6, "error": None}

    status = server.http.get(f"/v1/sessions/{session}").json()
    assert (status["status"], status["frames"], status["blocks"]) == ("done", 6, 6)
    assert status["latency_ms"]["p50"] > 0 and status["kv_pages"] == 0  # done: pages back

    video = server.http.get(f"/v1/sessions/{session}/video")
    assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(video.content)) as container:
        assert len(list(container.decode(video=0))) == 6

    closed = server.http.delete(f"/v1/sessions/{session}")
    assert closed.status_code == 200 and closed.json()["status"] == "closed"
    assert server.http.get(f"/v1/sessions/{session}").status_code == 404
    assert server.pages_in_use() == 0


BAD_BODIES = [
    ({"seed": "x"}, "seed: expected an integer, got 'x' (str)"),
    ({"frames": 0}, "frames: "),
    ({"prompt": [{"frame": 3, "prompt": "a"}]}, "prompt: a schedule must start at frame 0"),
    ({"prompt": [{"frame": 0, "prompt": "a"}, {"frames": 4, "prompt": "b"}]},
     "prompt[1].frames: unknown key; did you mean 'frame'?"),
    ({"actions": ["jump"]}, "actions[0]: "),
    ({"actions": "moves.yaml"}, "actions: "),            # a list, never a file
    ({"mode": "slow"}, "mode: "),
    ({"seeds": 1}, "seeds: unknown key; did you mean 'seed'?"),
    ({"prompt": "x" * 201}, "prompt: 201 characters, more than this server's "
                            "serve.max_prompt_chars of 200"),
    ({"frames": 1001}, "frames: 1001 is more than this server's serve.max_frames of 1000"),
]


def test_bad_bodies_are_refused_422_naming_the_dotted_path_or_413(shared_app):
    server = shared_app
    created = server.manager.stats.created
    for body, message in BAD_BODIES:
        response = server.http.post("/v1/sessions", json=body)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error.startswith(message), error
        assert response.json()["field"] == message.split(":")[0]
        assert "\n" not in error
    bad = server.http.post("/v1/sessions", content=b"{frames: 3",
                           headers={"content-type": "application/json"})
    assert bad.status_code == 422 and bad.json()["error"].startswith("body: not JSON")
    large = server.http.post("/v1/sessions", json={"prompt": "x" * 2000})
    assert large.status_code == 413 and "serve.max_body_bytes" in large.json()["error"]
    assert server.manager.live_sessions == 0 and server.manager.stats.created == created


def test_the_session_past_capacity_is_refused_then_admitted_after_a_close(shared_app):
    server = shared_app
    slow = {"frames": None, "mode": "paced", "fps": 0.5}  # a block every 2 s: nearly idle
    first, second = server.create(**slow), server.create(**slow)
    refused = server.http.post("/v1/sessions", json=slow)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "7"
    assert "all 2 session slots are in use" in refused.json()["error"]
    assert server.http.get(f"/v1/sessions/{first}").json()["status"] == "active"  # not evicted

    server.http.delete(f"/v1/sessions/{first}")
    third = server.create(**slow)
    metrics = server.http.get("/metrics").text
    assert "ardiff_serve_sessions_refused_total 1.0" in metrics
    assert "ardiff_serve_sessions_active 2.0" in metrics
    for session in (second, third):
        server.http.delete(f"/v1/sessions/{session}")
    assert server.pages_in_use() == 0


def test_every_endpoint_but_health_needs_the_token(shared_app, frames_of):
    server = shared_app
    anonymous = server.http.__class__(base_url=server.url, timeout=30)
    with anonymous:
        assert anonymous.get("/health").status_code == 200
        for method, path in (("POST", "/v1/sessions"), ("GET", "/v1/sessions"),
                             ("GET", "/metrics"), ("GET", "/v1/sessions/x/video")):
            response = anonymous.request(method, path)
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"] == "Bearer"
        wrong = anonymous.get("/metrics", headers={"Authorization": "Bearer s3cre"})
        assert wrong.status_code == 401
    session = server.create(frames=2, mode="fast", image="png")
    with pytest.raises(InvalidStatus):
        with server.stream(session, token="nope"):
            pass
    with server.stream(session) as ws:  # ?token=
        headers, _, end = frames_of(ws)
    assert len(headers) == 2 and end["event"] == "done"
    assert np.all([h["format"] == "png" for h in headers])
    server.http.delete(f"/v1/sessions/{session}")


def test_the_page_is_served_whole_from_the_package_and_info_gives_the_play_keys(shared_app):
    import re
    import shutil
    import subprocess

    server = shared_app
    anonymous = server.http.__class__(base_url=server.url, timeout=30)
    with anonymous:  # the page holds no data: it loads without the token, then asks for it
        page = anonymous.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assets = [asset for asset in re.findall(r'(?:src|href)="([^"]+)"', page.text)
                  if asset != "data:,"]  # the empty icon: no /favicon.ico fetch
        assert sorted(assets) == ["/static/page.css", "/static/page.js"]
        texts = [page.text] + [anonymous.get(asset).text for asset in assets]
        for text in texts:
            assert not re.search(r"https?://|//cdn|@import", text)  # nothing from elsewhere
        assert anonymous.get("/v1/info").status_code == 401
    for other in ("/static/app.py", "/static/..%2Fapp.py", "/static/__init__.py"):
        assert server.http.get(other).status_code == 404  # the page's three files, no others
    info = server.http.get("/v1/info").json()
    assert info["actions"] == ["none", "left", "right", "up", "down"]
    assert info["keys"]["left"] == "left" and info["keys"]["w"] == "up"  # play's keys
    assert info["defaults"]["mode"] == "paced" and info["idle"] == "none"
    node = shutil.which("node")
    if node is not None:  # the page's script at least parses
        script = server.http.get("/static/page.js").text
        check = subprocess.run([node, "--check", "-"], input=script, capture_output=True,
                               text=True, timeout=60)
        assert check.returncode == 0, check.stderr


def test_a_bad_client_message_is_one_line_back_and_changes_nothing(shared_app, frames_of):
    import json

    server = shared_app
    session = server.create(frames=2, mode="fast", image="png", paused=True)
    assert server.http.get(f"/v1/sessions/{session}").json()["status"] == "paused"
    with server.stream(session) as ws:  # paused: nothing runs, each answer is the next message
        for message, error in (
                ({"action": "jump"}, "action: 'jump' is not an action of this pipeline; use "
                                     "one of none, left, right, up, down"),
                ({"prompt": "b"}, "prompt: this pipeline ignores prompts (its PipelineInputs "
                                  "say prompt: ignored); leave the prompt out, or serve a "
                                  "text-conditioned pipeline"),
                ({"pause": "no"}, "pause: expected true or false"),
                ({"jump": 1}, "message: expected an object with action, prompt (and "
                              "on_switch) or pause; got {\"jump\": 1}")):
            ws.send(json.dumps(message))
            assert json.loads(ws.recv(timeout=30)) == {"event": "error", "error": error}
        ws.send(json.dumps({"action": "up"}))
        ws.send(json.dumps({"pause": False}))
        headers, _, end = frames_of(ws)
    script = load_config(None).rollout.actions
    assert [h["actions"] for h in headers] == [["up"], [script[1 % len(script)]]]  # then the config's
    assert end["event"] == "done"
    server.http.delete(f"/v1/sessions/{session}")
