"""What `ardiff serve` does to files, through a real server: a `serve.output_dir` holding the
user's own files keeps them all (names the server would use included); a restart with
`keep_videos: true` never overwrites the first run's videos; `GET /video` asked for again
and again while frames come reuses its segments (a bounded number of files) and leaves no
temporary file; one racing the session's close is a 404, never a 500; a killed server's
work folder is swept by the next server on the same folder, a live one's is not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.extra("serve")

USERS = {"session-1.mp4": b"the user's own video", "session-1.mp4.part0.mp4": b"also theirs",
         "notes.txt": b"keep me", ".hidden": b"mine"}


def _fill(folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in USERS.items():
        (folder / name).write_bytes(data)


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _run_one(server, frames_of, frames: int = 3) -> str:
    session = server.create(frames=frames, mode="fast")
    with server.stream(session) as ws:
        frames_of(ws)
    return session


def test_the_user_s_files_in_output_dir_are_never_touched(serve_app, frames_of, tmp_path):
    folder = tmp_path / "videos"
    _fill(folder)
    server = serve_app()  # serve.output_dir: tmp_path/videos, keep_videos: false
    session = _run_one(server, frames_of)
    assert server.http.get(f"/v1/sessions/{session}/video").status_code == 200
    server.http.delete(f"/v1/sessions/{session}")
    server.stop()
    assert _files(folder) == USERS
    assert sorted(p.name for p in folder.iterdir()) == sorted(USERS)  # its own folder gone


def test_a_restart_keeping_videos_never_overwrites_a_kept_one(serve_app, frames_of, tmp_path):
    folder = tmp_path / "videos"
    _fill(folder)
    first = serve_app(["serve.keep_videos=true"])
    _run_one(first, frames_of)
    first.stop()
    kept = _files(folder)
    assert set(kept) == {*USERS, "session-2.mp4"}  # session-1.mp4 is the user's
    second = serve_app(["serve.keep_videos=true"])
    _run_one(second, frames_of, frames=2)
    second.stop()
    now = _files(folder)
    assert {name: now[name] for name in kept} == kept  # the first run's, byte for byte
    assert set(now) == {*USERS, "session-2.mp4", "session-3.mp4"}


def test_asking_for_the_video_again_and_again_reuses_its_segments(serve_app, tmp_path,
                                                                 wait_until):
    server = serve_app(["serve.max_sessions=1"])
    session = server.create(frames=None, mode="paced", fps=20)
    work = server.manager.folder.work
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["frames"] >= 2, 60,
               "the first frames")
    most = 0
    for _ in range(30):
        assert server.http.get(f"/v1/sessions/{session}/video").status_code == 200
        most = max(most, len([p for p in work.iterdir() if p.name.startswith("session-")]))
    assert most <= 3, most  # one joined segment, one being written (and its work file)
    wait_until(lambda: not [p for p in work.iterdir() if p.name.startswith("video-")], 30,
               "each answer's file to go once sent")
    server.http.delete(f"/v1/sessions/{session}")


@pytest.mark.heavy  # seconds of end-to-end waiting: keeps pytest -q under 90 s
def test_a_video_request_racing_the_close_is_a_404_never_a_500(serve_app, wait_until):
    server = serve_app()
    for _ in range(3):
        session = server.create(frames=None, mode="fast")
        wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["frames"] >= 2,
                   60, "the first frames")
        codes: list[int] = []

        def ask(session=session, codes=codes) -> None:
            for _ in range(20):
                codes.append(server.http.get(f"/v1/sessions/{session}/video").status_code)

        asking = threading.Thread(target=ask)
        asking.start()
        server.http.delete(f"/v1/sessions/{session}")
        asking.join(60)
        assert set(codes) <= {200, 404}, codes
    work = server.manager.folder.work
    wait_until(lambda: not list(work.iterdir()), 30, "no temporary video, no segment")


def test_a_killed_server_s_folder_is_swept_by_the_next_one(serve_app, tmp_path):
    folder = tmp_path / "videos"
    _fill(folder)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = folder / f".ardiff-serve-{gone.stdout.strip()}-0badc0de"
    live = folder / f".ardiff-serve-{os.getpid()}-0badc0de"  # this process: running
    for work in (dead, live):
        work.mkdir()
        (work / "session-1.mp4.part0.mp4").write_bytes(b"half a video")
    serve_app()
    assert not dead.exists() and live.exists()
    assert _files(folder) == USERS


@pytest.mark.heavy
def test_a_sigkilled_server_s_files_are_swept_by_the_next_start(tmp_path):
    import re
    import signal
    import time
    from pathlib import Path

    import httpx

    ardiff = str(Path(sys.executable).parent / "ardiff")
    folder = tmp_path / "videos"
    _fill(folder)

    def start() -> tuple[subprocess.Popen, str]:
        server = subprocess.Popen([ardiff, "serve", "--port", "0", "--set", "warmup.enabled=false",
                                   "--set", f"serve.output_dir={folder}"],
                                  cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        line = server.stderr.readline()
        return server, "http://127.0.0.1:" + re.search(r":(\d+) \(", line).group(1)

    server, url = start()
    try:
        session = httpx.post(f"{url}/v1/sessions", json={"frames": None, "mode": "paced",
                                                          "fps": 8}).json()["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/sessions/{session}").json()["frames"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        left = [p for p in folder.iterdir() if p.name.startswith(".ardiff-serve-")]
        assert len(left) == 1  # its own folder (its segments go there)
        server.send_signal(signal.SIGKILL)
        server.wait(30)
        assert left[0].exists()  # killed outright: nothing could clean up
        again, _url = start()  # the next server on the same folder sweeps it
        again.send_signal(signal.SIGTERM)
        assert again.wait(60) == 0
        assert not left[0].exists() and _files(folder) == USERS
        assert sorted(p.name for p in folder.iterdir()) == sorted(USERS)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
