"""A failing row of a batched forward fails its own session only, through a real server:
two sessions share forwards of the tiny DiT; the one whose prompt makes the pipeline raise
fails with its one-line error, the other makes every frame it asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.extra("serve")
SUPPORT = Path(__file__).resolve().parents[1] / "support" / "row_fault_pipelines.py"


def test_a_failing_row_fails_only_its_own_session(serve_app, tiny_dit, frames_of):
    server = serve_app(["serve.max_sessions=2", "serve.batch=2"],
                       base={**tiny_dit, "pipeline.entry": f"{SUPPORT}:BoomRowDiT",
                             "pipeline.args": "{frames_per_block: 3, window_frames: 9, "
                                              "sink_frames: 1, at_block: 4}"})
    boom = server.create(prompt="boom", frames=30, mode="fast", paused=True)
    fine = server.create(prompt="fine", frames=30, mode="fast", paused=True)
    with server.stream(boom) as bad, server.stream(fine) as good:
        import json

        for ws in (bad, good):  # both due in one turn: their blocks share forwards
            ws.send(json.dumps({"pause": False}))
        bad_headers, _, bad_end = frames_of(bad)
        good_headers, _, good_end = frames_of(good)
    assert bad_end["event"] == "failed" and "boom" in bad_end["error"]
    assert [h["frame"] for h in bad_headers] == list(range(12))  # blocks 0-3; 4 raised
    assert good_end == {"event": "done", "frames": 30, "error": None}
    assert [h["frame"] for h in good_headers] == list(range(30))
    assert server.manager.runner.batch_sizes[2] >= 1  # they did share a forward
    assert server.pages_in_use() == 0
    for session in (boom, fine):
        server.http.delete(f"/v1/sessions/{session}")
