"""Stopping `ardiff serve` while a pipeline is stuck in a forward (FaultPipeline's `hang`):
the stop ends within serve.stop_timeout_s plus a few seconds, the stuck sessions fail with
a one-line reason their clients read, and every video made so far is finished and kept;
as a real process, SIGTERM exits 1 saying so (heavy)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extras import require_extra

require_extra("serve")

import httpx  # noqa: E402

FAULTS = Path(__file__).resolve().parents[1] / "support" / "fault_pipelines.py"
ARDIFF = str(Path(sys.executable).parent / "ardiff")
STUCK = {"pipeline.entry": f"{FAULTS}:FaultPipeline",
         "pipeline.args": "{fault: hang, at_block: 2, hang_s: 4}", "rollout.actions": "null",
         "runtime.memory_budget": "16MiB", "output.scale": "1"}
REASON = ("stopped: a forward still ran 1 s after the stop (serve.stop_timeout_s); the "
          "session failed with it")


@pytest.mark.heavy  # seconds of end-to-end waiting: keeps pytest -q under 90 s
def test_a_stuck_forward_fails_its_sessions_and_the_stop_ends(serve_app, frames_of,
                                                              wait_until, tmp_path):
    server = serve_app(["serve.stop_timeout_s=1", "serve.keep_videos=true",
                        "serve.max_sessions=2"], base=STUCK)
    session = server.create(frames=None, mode="fast")
    with server.stream(session) as ws:
        wait_until(lambda: server.manager.stats.frames >= 4, 60, "blocks 0 and 1")
        time.sleep(0.3)  # the scheduler is in block 2's forward: stuck
        started = time.monotonic()
        server.manager.begin_shutdown()  # what a signal does first (then uvicorn stops)
        headers, _, end = frames_of(ws)
        assert end == {"event": "failed", "frames": 4, "error": REASON}
    server.server.should_exit = True
    server.thread.join(30)
    took = time.monotonic() - started
    assert not server.thread.is_alive() and took < 1 + 5, took
    assert server.manager.abandoned and [h["frame"] for h in headers] == [0, 1, 2, 3]
    kept = sorted((tmp_path / "videos").glob("session-*.mp4"))
    assert [p.name for p in kept] == ["session-1.mp4"]  # finished: 4 frames, playable
    import av

    with av.open(str(kept[0])) as container:
        assert len(list(container.decode(video=0))) == 4
    wait_until(lambda: not server.manager._thread.is_alive(), 30, "the forward to return")
    assert server.pages_in_use() == 0  # it returned: the scheduler closed the runner


@pytest.mark.heavy
def test_sigterm_with_a_stuck_forward_exits_within_the_timeout(tmp_path):
    sets = [f"{key}={value}" for key, value in {
        **STUCK, "pipeline.args": "{fault: hang, at_block: 2, hang_s: 600}",
        "warmup.enabled": "false", "serve.stop_timeout_s": "2"}.items()]
    server = subprocess.Popen([ARDIFF, "serve", "--port", "0",
                               *(arg for s in sets for arg in ("--set", s))],
                              cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))
        url = f"http://127.0.0.1:{port}"
        session = httpx.post(f"{url}/v1/sessions", json={"frames": None, "mode": "fast"}).json()
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/sessions/{session['id']}").json()["frames"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(2 + 10)
        assert time.monotonic() - started < 2 + 5
        rest = server.stderr.read()
        assert code == 1 and ("error: a forward was still running serve.stop_timeout_s (2 s) "
                              "after the stop; its sessions failed") in rest, rest
        assert "Traceback" not in rest
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
