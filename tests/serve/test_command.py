"""`ardiff serve` the command: a taken port or a bad config is one line, exit 2, before any
model loads; SIGTERM during four active streams stops taking sessions, ends the streams,
gives back every page and exits 0 (a real process, heavy); a non-loopback host without a
token is refused (one line, exit 2) unless --no-token, then warned about; the token from
--token-file or $ARDIFF_SERVE_TOKEN; SIGHUP stops the server as SIGTERM does, and a signal
right after the listening line is honoured (real processes, heavy)."""

from __future__ import annotations

import pytest
from extras import require_extra

require_extra("serve")

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

ARDIFF = str(Path(sys.executable).parent / "ardiff")


def test_a_taken_port_is_one_line_and_exit_2(ardiff_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = ardiff_main("serve", "--port", port)
    assert result.exit_code == 2
    assert result.stderr == (f"error: --port: cannot listen on 127.0.0.1:{port} (Address "
                             f"already in use); choose another port (--port 0 picks a free "
                             f"one)\n")


def test_a_bad_serve_setting_is_one_line_and_exit_2(ardiff_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = ardiff_main("serve", "--port", "0", "--set", "serve.idle_timeout_s=-1")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: serve.idle_timeout_s: ") and \
        result.stderr.count("\n") == 1
    several = ardiff_main("serve", "--port", "0", "--set", "rollout.prompts=[a, b]")
    assert several.exit_code == 2
    assert several.stderr.startswith("error: rollout.prompts: ardiff serve runs one prompt")


def test_the_help_names_the_api(ardiff_main):
    result = ardiff_main("serve", "--help")
    assert result.exit_code == 0 and "--token" in result.stdout and "SIGTERM" in result.stdout
    assert "'ardiff[serve]'" in " ".join(result.stdout.split())  # not eaten as Rich markup


def test_a_host_beyond_loopback_needs_a_token_or_no_token(ardiff_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARDIFF_SERVE_TOKEN", raising=False)
    result = ardiff_main("serve", "--host", "0.0.0.0", "--port", "0")
    assert result.exit_code == 2
    assert result.stderr == ("error: --host: 0.0.0.0 is reachable from other machines and "
                             "there is no token; give --token-file FILE (or "
                             "$ARDIFF_SERVE_TOKEN), or --no-token to let anyone who can reach "
                             "it start sessions\n")


def test_the_token_is_given_one_way_and_never_empty(ardiff_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").write_text("\n")
    for args, message in (
            (("--token", "a", "--token-file", "t"), "error: --token-file: given with --token; "
                                                     "give the token one way\n"),
            (("--token-file", "empty"), "error: --token-file: empty; give a secret, or no "
                                        "token at all\n"),
            (("--token-file", "missing"), "error: --token-file: cannot read 'missing' "
                                          "(FileNotFoundError); give a readable file holding "
                                          "the token\n"),
            (("--token", " "), "error: --token: empty; give a secret, or no token at all\n")):
        result = ardiff_main("serve", "--port", "0", *args)
        assert (result.exit_code, result.stderr) == (2, message), args
    monkeypatch.setenv("ARDIFF_SERVE_TOKEN", "")
    result = ardiff_main("serve", "--port", "0")
    assert result.stderr == ("error: $ARDIFF_SERVE_TOKEN: empty; give a secret, or no token "
                             "at all\n")


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None
           ) -> tuple[subprocess.Popen, int]:
    """`ardiff serve` in a process, once it says it listens: (process, port)."""
    server = subprocess.Popen(
        [ARDIFF, "serve", "--port", "0", "--set", "warmup.enabled=false", *args],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    line = server.stderr.readline()
    assert "listening on" in line, line
    return server, int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))


@pytest.mark.heavy
def test_a_signal_right_after_the_listening_line_stops_the_server(tmp_path):
    server, _port = _start(tmp_path)
    try:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        assert "stopped; 0 sessions served" in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.heavy
def test_the_token_from_a_file_or_the_environment_and_sighup_stops(tmp_path):
    (tmp_path / "token").write_text("from-file\n")
    for args, env, token in ((("--token-file", "token"), {}, "from-file"),
                             ((), {"ARDIFF_SERVE_TOKEN": "from-env"}, "from-env")):
        server, port = _start(tmp_path, *args, env=env)
        try:
            assert token not in " ".join(server.args)  # not in the process list
            url = f"http://127.0.0.1:{port}/v1/sessions"
            assert httpx.get(url).status_code == 401
            assert httpx.get(url, headers={"Authorization": f"Bearer {token}"}).status_code \
                == 200
            server.send_signal(signal.SIGHUP)  # the terminal closed
            assert server.wait(60) == 0
            assert "stopped; 0 sessions served" in server.stderr.read()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


@pytest.mark.heavy
def test_sigterm_during_four_streams_exits_0_with_every_page_back(tmp_path):
    server = subprocess.Popen(
        [ARDIFF, "serve", "--host", "0.0.0.0", "--no-token", "--port", "0",
         "--set", "warmup.enabled=false",
         "--set", "serve.max_sessions=4", "--set", f"serve.output_dir={tmp_path / 'videos'}"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        lines = [server.stderr.readline(), server.stderr.readline()]
        assert lines[0].startswith("warning: --host 0.0.0.0 is reachable"), lines
        port = int(re.search(r"http://0\.0\.0\.0:(\d+)", lines[1]).group(1))
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        ids = [http.post("/v1/sessions", json={"frames": None, "mode": "fast"}).json()["id"]
               for _ in range(4)]
        received = {sid: 0 for sid in ids}
        ends: dict[str, object] = {}

        def read(sid: str) -> None:
            with connect(f"ws://127.0.0.1:{port}/v1/sessions/{sid}/stream") as ws:
                try:
                    while True:
                        message = ws.recv(timeout=60)
                        if isinstance(message, bytes):
                            received[sid] += 1
                        else:
                            ends[sid] = json.loads(message)
                except ConnectionClosed:
                    ends.setdefault(sid, ws.close_code)

        readers = [threading.Thread(target=read, args=(sid,)) for sid in ids]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 60
        while min(received.values()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert min(received.values()) >= 3, received
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        rest = server.stderr.read()
        for reader in readers:
            reader.join(30)
        assert len(ends) == 4  # every stream was ended by the server
        assert re.search(r"stopped; 4 sessions served, 4 closed, 0 failed; KV pages in use: "
                         r"0 of \d+", rest), rest
        assert "Traceback" not in rest and "ERROR" not in rest, rest
        assert list((tmp_path / "videos").glob("*")) == []  # keep_videos: false
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
