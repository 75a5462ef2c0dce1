"""`ardiff serve --workers 2`, a real front process and its two worker processes (heavy):
sessions spread over both workers and every call about a session (GET, its stream, its
video, DELETE) is answered by its own worker; a SIGKILLed worker fails only its sessions
(the other's stream goes on, frame after frame) and is started again (new sessions are
placed on it); SIGTERM of the front closes every session on every worker and exits 0.
The tests share one server, in file order; the last one stops it."""

from __future__ import annotations

import pytest
from extras import require_extra

require_extra("serve")

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from ardiff.serve.frames import parse_frame_message

pytestmark = pytest.mark.heavy
ARDIFF = str(Path(sys.executable).parent / "ardiff")
WORKER = "x-ardiff-worker"
TOKEN = "t0k"


class Front:
    """`ardiff serve --workers 2` in a process; its stderr lines collected by a thread."""

    def __init__(self, folder: Path, own_group: bool = False) -> None:
        self.folder = folder
        self.proc = subprocess.Popen(
            [ARDIFF, "serve", "--workers", "2", "--port", "0", "--token", TOKEN,
             "--set", "warmup.enabled=false",
             "--set", "serve.max_sessions=2", "--set", f"serve.output_dir={folder / 'videos'}"],
            cwd=folder, stderr=subprocess.PIPE, text=True, start_new_session=own_group)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        line = self.wait_for_line("listening on", 180)
        self.port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"})

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for_line(self, text: str, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            assert self.proc.poll() is None or self.lines, "the server ended without a word"
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} in {self.lines}")

    def create(self, **body: Any) -> tuple[str, str]:
        """A new session: (id, the worker that answered)."""
        response = self.http.post("/v1/sessions", json=body)
        assert response.status_code == 201, response.text
        return response.json()["id"], response.headers[WORKER]

    def stream(self, session_id: str, token: str = TOKEN):
        return connect(f"ws://127.0.0.1:{self.port}/v1/sessions/{session_id}/stream"
                       f"?token={token}",
                       open_timeout=30, max_size=2**24)

    def workers(self) -> list[dict[str, Any]]:
        return self.http.get("/health").json()["workers"]


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> Iterator[Front]:
    server = Front(tmp_path_factory.mktemp("workers"))
    try:
        yield server
    finally:
        if server.proc.poll() is None:  # the SIGTERM test did not run: end it
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(60)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


class Reader:
    """Reads a session's stream on a thread: frame numbers, the end message, the close."""

    def __init__(self, front: Front, session_id: str, unpause: bool = False) -> None:
        self.frames: list[int] = []
        self.end: dict[str, Any] | None = None
        self.close: tuple[int | None, str | None] = (None, None)
        self.worker: str | None = None
        self.thread = threading.Thread(target=self._read, args=(front, session_id, unpause),
                                       daemon=True)
        self.thread.start()

    def _read(self, front: Front, session_id: str, unpause: bool) -> None:
        with front.stream(session_id) as ws:
            self.worker = ws.response.headers[WORKER]
            if unpause:
                ws.send(json.dumps({"pause": False}))
            try:
                while True:
                    message = ws.recv(timeout=60)
                    if isinstance(message, str):
                        self.end = json.loads(message)
                    else:
                        self.frames.append(parse_frame_message(message)[0]["frame"])
            except ConnectionClosed:
                self.close = (ws.close_code, ws.close_reason)

    def wait_frames(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.frames) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.frames) >= count, (count, self.frames, self.end, self.close)


def test_sessions_spread_over_both_workers_and_every_call_reaches_its_own(front):
    unauthorized = httpx.post(f"http://127.0.0.1:{front.port}/v1/sessions", json={})
    assert unauthorized.status_code == 401  # the front checks the token
    made = [front.create(frames=6, mode="fast", paused=True) for _ in range(2)]
    with pytest.raises(InvalidStatus, match="403"):  # and a stream's, before any worker
        front.stream(made[0][0], token="wrong")
    assert {worker for _, worker in made} == {"0", "1"}  # the emptier worker each time
    for session_id, worker in made:
        got = front.http.get(f"/v1/sessions/{session_id}")
        assert got.headers[WORKER] == worker and got.json()["worker"] == int(worker)
        reader = Reader(front, session_id, unpause=True)
        reader.thread.join(60)
        assert reader.worker == worker  # the stream's handshake came from its worker
        assert reader.frames == list(range(6)) and reader.end["event"] == "done", reader.end
        assert reader.close[0] == 1000
        done = front.http.get(f"/v1/sessions/{session_id}")
        assert done.headers[WORKER] == worker and done.json()["status"] == "done"
        video = front.http.get(f"/v1/sessions/{session_id}/video")
        assert video.status_code == 200 and video.headers[WORKER] == worker
        assert video.content[4:8] == b"ftyp"  # an mp4
        closed = front.http.delete(f"/v1/sessions/{session_id}")
        assert closed.status_code == 200 and closed.headers[WORKER] == worker
        assert front.http.get(f"/v1/sessions/{session_id}").status_code == 404
    metrics = front.http.get("/metrics").text
    for worker in ("0", "1"):
        assert f'ardiff_serve_sessions_created_total{{worker="{worker}"}} 1.0' in metrics
        assert f'ardiff_serve_worker_up{{worker="{worker}"}} 1.0' in metrics
    health = front.http.get("/health").json()
    assert health["status"] == "ok" and [w["status"] for w in health["workers"]] == ["ok", "ok"]


def test_a_sigkilled_worker_fails_only_its_sessions_and_comes_back(front):
    (doomed, worker), (kept, other) = (front.create(frames=None, mode="paced", fps=16)
                                       for _ in range(2))
    assert {worker, other} == {"0", "1"}
    pid = front.workers()[int(worker)]["pid"]
    lost, going = Reader(front, doomed), Reader(front, kept)
    lost.wait_frames(3)
    going.wait_frames(3)
    os.kill(pid, signal.SIGKILL)
    lost.thread.join(30)
    error = f"worker {worker} died (killed by SIGKILL); the session was lost with it"
    assert lost.end is not None and lost.end["event"] == "failed", lost.end
    assert lost.end["error"].startswith(error) and lost.end["frames"] == len(lost.frames)
    assert lost.close[0] == 1011 and lost.close[1].startswith(f"worker {worker} died")
    at_kill = len(going.frames)
    going.wait_frames(at_kill + 9)  # three more blocks after the kill, none lost
    assert going.frames == list(range(len(going.frames))) and going.end is None
    described = front.http.get(f"/v1/sessions/{doomed}").json()
    assert described["status"] == "failed" and described["error"].startswith(error)
    assert front.http.get(f"/v1/sessions/{kept}").json()["status"] == "active"
    front.wait_for_line(f"worker {worker}: killed by SIGKILL; 1 session(s) failed")
    front.wait_for_line(f"worker {worker}: serving again", 120)
    again = front.workers()[int(worker)]
    assert again["status"] == "ok" and again["pid"] != pid and again["restarts"] == 1
    new, placed = front.create(frames=6, mode="fast", paused=True)
    assert placed == worker  # the emptier one: the restarted worker takes sessions again
    reader = Reader(front, new, unpause=True)
    reader.thread.join(60)
    assert reader.worker == worker and reader.frames == list(range(6))
    metrics = front.http.get("/metrics").text
    assert f'ardiff_serve_worker_restarts_total{{worker="{worker}"}} 1.0' in metrics
    assert f'ardiff_serve_sessions_lost_total{{worker="{worker}"}} 1.0' in metrics
    for session_id in (doomed, new):
        assert front.http.delete(f"/v1/sessions/{session_id}").status_code == 200
    assert front.http.get(f"/v1/sessions/{doomed}").status_code == 404
    assert going.end is None  # still streaming: the last test stops the server under it


def test_a_stopped_worker_is_found_in_seconds_and_only_its_sessions_are_lost(front):
    made = [front.create(frames=None, mode="paced", fps=4) for _ in range(2)]
    if made[0][1] == made[1][1]:  # that worker is full now: the next goes to the other
        made.append(front.create(frames=None, mode="paced", fps=4))
    (doomed, worker), (kept, _other) = made[0], made[-1]
    assert worker != _other
    pid = front.workers()[int(worker)]["pid"]
    again = f"worker {worker}: serving again"
    served_before = sum(again in line for line in front.lines)
    os.kill(pid, signal.SIGSTOP)  # alive, but it answers nothing
    try:
        deadline = time.monotonic() + 60
        while front.http.get(f"/v1/sessions/{doomed}").json()["status"] != "failed":
            asked = time.monotonic()
            assert front.http.get(f"/v1/sessions/{kept}").json()["status"] == "active"
            assert time.monotonic() - asked < 3  # the other worker's calls stay fast
            assert time.monotonic() < deadline, "the stopped worker was never found"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    error = front.http.get(f"/v1/sessions/{doomed}").json()["error"]
    assert error.startswith(f"worker {worker} died (did not answer for 3 s (stopped or hung); "
                            f"killed)"), error
    front.wait_for_line(f"worker {worker}: did not answer for 3 s")
    deadline = time.monotonic() + 120
    while sum(again in line for line in front.lines) == served_before:
        assert time.monotonic() < deadline, "the killed worker never served again"
        time.sleep(0.1)
    for session_id, _worker in made:
        assert front.http.delete(f"/v1/sessions/{session_id}").status_code == 200


def test_the_front_takes_client_ids_and_refuses_hostile_input_as_a_worker_does(front):
    sid = "front-chosen-0123456789"
    made = front.http.put(f"/v1/sessions/{sid}", json={"frames": 2, "mode": "fast"})
    assert made.status_code == 201 and made.json()["id"] == sid
    assert front.http.get(f"/v1/sessions/{sid}").headers[WORKER] == made.headers[WORKER]
    assert front.http.put(f"/v1/sessions/{sid}", json={}).status_code == 409
    assert front.http.put("/v1/sessions/bad.id", json={}).json()["field"] == "id"
    deep = front.http.post("/v1/sessions", content=b"[" * 60_000,
                           headers={"content-type": "application/json"})
    assert deep.status_code == 422 and deep.json()["error"].startswith("body: JSON nested")
    assert front.http.get("/v1/sessions", headers={"host": "evil.example"}).status_code == 421
    assert front.http.post("/v1/sessions", json={},
                           headers={"origin": "http://evil.example"}).status_code == 403
    assert front.http.delete(f"/v1/sessions/{sid}").status_code == 200


def test_sigterm_of_the_front_closes_every_session_and_exits_0(front):
    session_id, _ = front.create(frames=None, mode="paced", fps=16)
    reader = Reader(front, session_id)
    reader.wait_frames(3)
    pids = [w["pid"] for w in front.workers()]
    front.proc.send_signal(signal.SIGTERM)
    assert front.proc.wait(120) == 0
    front.reader.join(10)
    reader.thread.join(30)
    assert reader.close[0] is not None  # the server ended the stream
    text = "".join(front.lines)
    assert re.search(r"stopped; 2 workers, \d+ sessions served, \d+ closed, 0 failed, \d+ "
                     r"lost with a worker \(\d+ restarts\); KV pages in use: 0 of \d+", text), text
    assert "Traceback" not in text and "ERROR" not in text, text
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()  # every worker ended (and was reaped)
    assert list((front.folder / "videos").glob("*")) == []  # keep_videos: false


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_stops_it_cleanly(tmp_path, signum):
    """A terminal's Ctrl-C (SIGINT) or systemd's stop (SIGTERM) reaches every process of the
    group: the workers ignore SIGINT (the front stops them) or stop by themselves on SIGTERM;
    either way no session reads as lost, no worker is started again, and the exit is 0."""
    front = Front(tmp_path, own_group=True)
    try:
        session_id, _ = front.create(frames=None, mode="paced", fps=16)
        reader = Reader(front, session_id)
        reader.wait_frames(3)
        os.killpg(front.proc.pid, signum)
        assert front.proc.wait(120) == 0
        front.reader.join(10)
        reader.thread.join(30)
        text = "".join(front.lines)
        assert re.search(r"stopped; 2 workers, 1 sessions served, 1 closed, 0 failed, 0 lost "
                         r"with a worker \(0 restarts\); KV pages in use: 0 of \d+", text), text
        assert "Traceback" not in text and "error" not in text, text
    finally:
        if front.proc.poll() is None:
            os.killpg(front.proc.pid, signal.SIGKILL)
            front.proc.wait()


def test_sigterm_with_a_stopped_worker_ends_in_seconds(tmp_path):
    """A worker that is SIGSTOPped when the front is told to stop is killed once it has been
    silent HUNG_AFTER_S, not waited for: the front ends in seconds, exit 1 naming it."""
    front = Front(tmp_path)
    try:
        _session, worker = front.create(frames=None, mode="paced", fps=4)
        pid = front.workers()[int(worker)]["pid"]
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        front.proc.send_signal(signal.SIGTERM)
        assert front.proc.wait(60) == 1
        assert time.monotonic() - started < 30  # stop_timeout_s (30) + 10 without the beats
        front.reader.join(10)
        assert f"error: worker {worker}: did not stop" in "".join(front.lines)
        assert not Path(f"/proc/{pid}").exists()
    finally:
        if front.proc.poll() is None:
            front.proc.kill()
            front.proc.wait()
