"""What a session and the server report, through a real server: each block's timings in the
session's status; a prompt to a pipeline that ignores prompts is a one-line error (422 at
create, an error event on the stream) and /v1/info says so (the page disables its prompt
controls); /metrics counts sessions that ended normally, and its queue gauge drops once a
session has ended and nobody streams it."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.extra("serve")

IGNORED = ("prompt: this pipeline ignores prompts (its PipelineInputs say prompt: ignored); "
           "leave the prompt out, or serve a text-conditioned pipeline")


def _metric(server, name: str) -> float:
    for line in server.http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def test_a_session_s_status_gives_each_block_s_timings(local_app, frames_of):
    server = local_app
    session = server.create(frames=3, mode="fast")
    with server.stream(session) as ws:
        frames_of(ws)
    timings = server.http.get(f"/v1/sessions/{session}").json()["timings"]
    assert [t["block"] for t in timings] == [0, 1, 2]
    for timing in timings:
        assert 0 <= timing["start_s"] <= timing["end_s"] and timing["forward_s"] >= 0
        assert timing["rows"] >= 1 and "stages_s" not in timing  # the pipeline gives none
    assert [t["start_s"] for t in timings] == sorted(t["start_s"] for t in timings)
    server.http.delete(f"/v1/sessions/{session}")


def test_a_prompt_to_a_pipeline_that_ignores_prompts_is_an_error(local_app):
    server = local_app
    info = server.http.get("/v1/info").json()
    assert info["inputs"] == {"prompt": "ignored", "image": "ignored", "actions": "accepted"}
    created = server.http.post("/v1/sessions", json={"prompt": "a cat"})
    assert created.status_code == 422 and created.json() == {"error": IGNORED,
                                                             "field": "prompt"}
    session = server.create(frames=1, mode="fast", paused=True)
    with server.stream(session) as ws:
        ws.send(json.dumps({"prompt": "a cat", "on_switch": "keep"}))
        assert json.loads(ws.recv(timeout=30)) == {"event": "error", "error": IGNORED}
    server.http.delete(f"/v1/sessions/{session}")


def test_a_pipeline_that_reads_prompts_takes_them(serve_app, tiny_dit, frames_of):
    server = serve_app(base=tiny_dit)
    assert server.http.get("/v1/info").json()["inputs"]["prompt"] == "accepted"
    session = server.create(prompt="a cat", frames=3, mode="fast", paused=True)
    with server.stream(session) as ws:
        ws.send(json.dumps({"prompt": "a dog"}))
        ws.send(json.dumps({"pause": False}))
        headers, _, end = frames_of(ws)
    assert end["event"] == "done" and headers[-1]["prompt"] == "a dog"
    server.http.delete(f"/v1/sessions/{session}")


def test_metrics_count_normal_ends_and_the_queue_gauge_drops(local_app, wait_until):
    server = local_app
    done_before = _metric(server, "ardiff_serve_sessions_done_total")
    session = server.create(frames=2, mode="fast")  # nobody streams it: its frames wait
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["status"] == "done",
               60, "the session to end")
    assert _metric(server, "ardiff_serve_sessions_done_total") == done_before + 1
    assert server.http.get(f"/v1/sessions/{session}").json()["queued_frames"] == 2
    assert _metric(server, "ardiff_serve_queue_frames") == 0  # ended, nobody streams it
    server.http.delete(f"/v1/sessions/{session}")


def test_a_live_session_reports_the_pages_it_holds_and_none_once_done(local_app, wait_until):
    server = local_app
    session = server.create(frames=None, mode="paced", fps=4)
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["blocks"] >= 1, 60,
               "a block")
    assert server.http.get(f"/v1/sessions/{session}").json()["kv_pages"] > 0
    server.http.delete(f"/v1/sessions/{session}")
