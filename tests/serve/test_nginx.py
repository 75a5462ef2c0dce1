"""`ardiff serve` past one machine: three real servers behind Debian's nginx on loopback,
with the shipped `deploy/nginx.conf` (only its upstream addresses and listen port changed):
12 clients create sessions with ids of their own (`PUT /v1/sessions/{id}`, a new id after
a 503) and stream every frame in order through nginx; each session lives on exactly one
host and all its requests reach it; a SIGKILLed host fails only its own sessions, and new
ids go to the others. nginx runs in the foreground with its own config, ports and files
(heavy; skipped without nginx)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.heavy, pytest.mark.extra("serve")]
NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
pytestmark.append(pytest.mark.skipif(NGINX is None, reason="no nginx (apt-get install nginx)"))
ARDIFF = str(Path(sys.executable).parent / "ardiff")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"
TOKEN = "nginx-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_hosts(tmp_path: Path, count: int) -> list[tuple[subprocess.Popen, int]]:
    import os

    hosts = [subprocess.Popen(
        [ARDIFF, "serve", "--port", "0", "--set", "warmup.enabled=false",
         "--set", "serve.max_sessions=6", "--set", f"serve.output_dir={tmp_path / f'h{i}'}"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ARDIFF_SERVE_TOKEN": TOKEN}) for i in range(count)]
    started = []
    for host in hosts:
        line = host.stderr.readline()
        assert "listening on" in line, line
        started.append((host, int(re.search(r":(\d+) \(", line).group(1))))
    return started


def _nginx_config(tmp_path: Path, ports: list[int], listen: int) -> Path:
    """The shipped config, its three upstream servers and its listen port made local."""
    text = DEPLOY.read_text()
    for index, port in enumerate(ports, start=1):
        text = text.replace(f"server 10.0.0.{index}:8000", f"server 127.0.0.1:{port}")
    assert "server 10.0.0." not in text
    text = text.replace("listen 80;", f"listen 127.0.0.1:{listen};")
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / f"{name}_temp").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"daemon off;\nworker_processes 1;\npid {tmp_path / 'nginx.pid'};\n"
        f"error_log {tmp_path / 'error.log'} warn;\nevents {{ worker_connections 256; }}\n"
        f"http {{\naccess_log off;\n"
        + "".join(f"{name}_temp_path {tmp_path / f'{name}_temp'};\n"
                  for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        + text + "\n}\n")
    return conf


def _create(http, body: dict, tries: int = 30) -> str:
    """A session under a new random id; a full host (503): again with another id."""
    for _ in range(tries):
        sid = uuid.uuid4().hex
        response = http.put(f"/v1/sessions/{sid}", json=body)
        if response.status_code == 201:
            assert response.json()["id"] == sid
            return sid
        assert response.status_code == 503 and "retry-after" in response.headers, response.text
    raise AssertionError(f"no host took a session in {tries} tries")


def _stream_all(port: int, sid: str) -> list[int]:
    from websockets.sync.client import connect

    from ardiff.serve.frames import parse_frame_message

    frames = []
    with connect(f"ws://127.0.0.1:{port}/v1/sessions/{sid}/stream?token={TOKEN}",
                 open_timeout=60) as ws:
        ws.send(json.dumps({"pause": False}))
        for _ in range(1000):
            message = ws.recv(timeout=120)
            if isinstance(message, str):
                assert json.loads(message)["event"] == "done", message
                return frames
            frames.append(parse_frame_message(message)[0]["frame"])
    raise AssertionError("no end")


def _where(hosts, sid: str, http_of) -> list[int]:
    return [i for i, (_, port) in enumerate(hosts)
            if sid in {s["id"] for s in http_of(port).get("/v1/sessions").json()["sessions"]}]


def test_three_hosts_behind_nginx_hash_every_session_to_its_host(tmp_path):
    import httpx

    hosts = _start_hosts(tmp_path, 3)
    listen = _free_port()
    nginx = subprocess.Popen([NGINX, "-c", str(_nginx_config(tmp_path, [p for _, p in hosts],
                                                              listen)), "-p", str(tmp_path)],
                             stderr=subprocess.PIPE, text=True)
    direct = {port: httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=60)
              for _, port in hosts}
    try:
        http = httpx.Client(base_url=f"http://127.0.0.1:{listen}", headers=AUTH, timeout=60)
        deadline = time.monotonic() + 30
        while True:  # nginx up
            try:
                http.get("/health")
                break
            except httpx.HTTPError:
                assert nginx.poll() is None and time.monotonic() < deadline, nginx.stderr.read()
                time.sleep(0.1)

        results: dict[str, list[int]] = {}
        errors: list[BaseException] = []

        def client() -> None:
            try:
                with httpx.Client(base_url=http.base_url, headers=AUTH, timeout=60) as mine:
                    sid = _create(mine, {"frames": 6, "mode": "fast", "paused": True})
                    results[sid] = _stream_all(listen, sid)
                    assert mine.get(f"/v1/sessions/{sid}").json()["frames"] == 6
                    assert mine.get(f"/v1/sessions/{sid}/video").status_code == 200
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        clients = [threading.Thread(target=client) for _ in range(12)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(600)
        assert errors == [] and len(results) == 12, errors
        assert all(frames == list(range(6)) for frames in results.values()), results
        places = {sid: _where(hosts, sid, direct.get) for sid in results}
        assert all(len(where) == 1 for where in places.values()), places  # one host each
        assert len({where[0] for where in places.values()}) >= 2  # spread by the hash

        live = [_create(http, {"frames": None, "mode": "paced", "fps": 2}) for _ in range(6)]
        live_at = {sid: _where(hosts, sid, direct.get)[0] for sid in live}
        victim = max(set(live_at.values()), key=list(live_at.values()).count)
        hosts[victim][0].send_signal(signal.SIGKILL)
        hosts[victim][0].wait(30)
        for sid, at in live_at.items():
            status = http.get(f"/v1/sessions/{sid}")
            if at == victim:  # gone with its host
                assert status.status_code in (404, 502), status.text
            else:
                assert status.status_code == 200 and status.json()["status"] == "active"
        fresh = [_create(http, {"frames": 3, "mode": "fast"}) for _ in range(4)]
        for sid in fresh:
            assert _where([h for i, h in enumerate(hosts) if i != victim], sid, direct.get)
    finally:
        nginx.send_signal(signal.SIGQUIT)
        try:
            nginx.wait(30)
        except subprocess.TimeoutExpired:
            nginx.kill()
        for host, _port in hosts:
            if host.poll() is None:
                host.send_signal(signal.SIGTERM)
        for host, _port in hosts:
            try:
                host.wait(60)
            except subprocess.TimeoutExpired:
                host.kill()
