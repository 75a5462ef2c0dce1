"""Live sessions through a real server: steering a paced world model makes the frames
`ardiff rollout --actions` makes with the actions the blocks took; a prompt switch makes
the frames of the same schedule; a slow or absent reader costs only its own frames; a
client that leaves is closed at the idle timeout with every page back; a pipeline error
fails its session only. Each test runs a model for some blocks: heavy."""

from __future__ import annotations

import pytest
from extras import require_extra

require_extra("serve")

import json
from pathlib import Path

import numpy as np
from websockets.exceptions import ConnectionClosedError

from ardiff.serve.frames import parse_frame_message

pytestmark = pytest.mark.heavy
FAULTS = Path(__file__).resolve().parents[1] / "support" / "fault_pipelines.py"


def test_steering_in_paced_mode_makes_the_frames_rollout_makes_with_those_actions(
        serve_app, decode_image, rollout_frames):
    server = serve_app()
    session = server.create(frames=24, mode="paced", fps=16, image="png", seed=5, paused=True)
    steering = {2: "up", 6: "right", 11: ["down"], 15: "up"}  # after frame k arrives, send
    headers, pictures = [], []
    with server.stream(session) as ws:
        ws.send(json.dumps({"pause": False}))  # connected first: no block runs unseen
        while True:
            message = ws.recv(timeout=60)
            if isinstance(message, str):
                assert json.loads(message)["event"] == "done"
                break
            header, image = parse_frame_message(message)
            headers.append(header)
            pictures.append(decode_image(image))
            if header["frame"] in steering:
                ws.send(json.dumps({"action": steering[header["frame"]]}))
    log = [h["actions"] for h in headers]
    assert [h["frame"] for h in headers] == list(range(24))
    assert {"up", "right", "down"} <= {actions[0] for actions in log}, log  # each steered
    expected = rollout_frames(["rollout.frames=24", "rollout.seed=5",
                               f"rollout.actions={json.dumps(log)}"])
    np.testing.assert_array_equal(np.stack(pictures), expected)


def test_a_prompt_switch_makes_the_frames_of_the_same_schedule(serve_app, decode_image,
                                                               rollout_frames, tiny_dit):
    server = serve_app(base=tiny_dit)
    session = server.create(frames=18, mode="paced", fps=12, image="png", prompt="a red ball",
                            paused=True)
    headers, pictures = [], []
    with server.stream(session) as ws:
        ws.send(json.dumps({"pause": False}))
        while True:
            message = ws.recv(timeout=60)
            if isinstance(message, str):
                break
            header, image = parse_frame_message(message)
            headers.append(header)
            pictures.append(decode_image(image))
            if header["frame"] == 0:
                ws.send(json.dumps({"prompt": "a blue cube", "on_switch": "recache"}))
    prompts = [h["prompt"] for h in headers]
    switch = prompts.index("a blue cube")
    assert 0 < switch < 18 and switch % 3 == 0  # at a block boundary
    assert set(prompts[switch:]) == {"a blue cube"}
    schedule = [{"frame": 0, "prompt": "a red ball"},
                {"frame": switch, "prompt": "a blue cube", "on_switch": "recache"}]
    expected = rollout_frames([f"{key}={value}" for key, value in tiny_dit.items()]
                              + ["rollout.frames=18", f"rollout.prompt={json.dumps(schedule)}"])
    np.testing.assert_array_equal(np.stack(pictures), expected)


def test_a_reader_that_never_reads_does_not_stall_the_others(serve_app, frames_of):
    server = serve_app(["serve.queue_frames=4"])
    idle = server.create(frames=12, mode="fast", image="png")   # nobody ever streams it
    stalled = server.create(frames=None, mode="fast")           # streamed, never read
    with server.stream(stalled):
        reader = server.create(frames=16, mode="fast", image="png")
        with server.stream(reader) as ws:
            headers, _, end = frames_of(ws)
        assert [h["frame"] for h in headers] == list(range(16)) and end["event"] == "done"
    status = server.http.get(f"/v1/sessions/{idle}").json()
    assert (status["frames"], status["frames_dropped"], status["queued_frames"]) == (12, 8, 4)
    with server.stream(idle) as ws:  # what is left: the newest 4, in order, counted
        headers, _, _ = frames_of(ws)
    assert [h["frame"] for h in headers] == [8, 9, 10, 11]
    assert {h["dropped"] for h in headers} == {8}
    assert "ardiff_serve_frames_dropped_total" in server.http.get("/metrics").text
    for session in (idle, stalled, reader):
        server.http.delete(f"/v1/sessions/{session}")


def test_a_client_that_leaves_is_closed_at_the_idle_timeout_with_its_pages(
        serve_app, wait_until, tmp_path):
    server = serve_app(["serve.idle_timeout_s=0.5"])
    session = server.create(frames=None, mode="paced", fps=16)
    with server.stream(session) as ws:
        for _ in range(3):
            assert isinstance(ws.recv(timeout=60), bytes)
    assert server.pages_in_use() > 0
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").status_code == 404, 30,
               "the idle session to close")
    assert server.pages_in_use() == 0 and server.manager.stats.closed == 1
    assert list((tmp_path / "videos").glob("session-*")) == []  # keep_videos: false


def test_a_pipeline_error_fails_its_session_only(serve_app, frames_of):
    fault = {"pipeline.entry": f"{FAULTS}:FaultPipeline",
             "pipeline.args": "{fault: forward, at_block: 3}", "rollout.actions": "null",
             "runtime.memory_budget": "16MiB", "output.scale": "1"}
    server = serve_app(base=fault)
    short, long = server.create(frames=4, mode="fast"), server.create(frames=20, mode="fast")
    with server.stream(long) as ws:
        headers, _, end = frames_of(ws)
        with pytest.raises(ConnectionClosedError):
            ws.recv(timeout=30)
        assert ws.close_code == 1011 and "forward of block 3" in ws.close_reason
    assert end["event"] == "failed" and "forward of block 3" in end["error"]
    assert [h["frame"] for h in headers] == list(range(6))  # blocks 0-2, 2 frames each
    assert server.http.get(f"/v1/sessions/{short}").json()["status"] == "done"
    again = server.create(frames=4, mode="fast")
    with server.stream(again) as ws:
        assert frames_of(ws)[2]["event"] == "done"
    assert "ardiff_serve_sessions_failed_total 1.0" in server.http.get("/metrics").text
    assert server.pages_in_use() == 0


def test_the_video_of_a_live_session_holds_its_frames_so_far(serve_app, wait_until):
    import io

    import av

    server = serve_app()
    session = server.create(frames=None, mode="fast")

    def frames_so_far() -> tuple[int, int]:
        made = server.http.get(f"/v1/sessions/{session}").json()["frames"]
        response = server.http.get(f"/v1/sessions/{session}/video")
        assert response.status_code == 200
        with av.open(io.BytesIO(response.content)) as container:
            return made, len(list(container.decode(video=0)))

    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["frames"] >= 4, 60,
               "a few frames")
    made, first = frames_so_far()
    assert 4 <= made <= first  # every frame made before the request, none lost
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["frames"] >= first + 4,
               60, "more frames")
    _, second = frames_so_far()
    assert second >= first + 4
    final = server.http.delete(f"/v1/sessions/{session}").json()
    assert final["status"] == "closed" and final["frames"] >= second
