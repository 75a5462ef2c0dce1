"""A real `ardiff serve` app on 127.0.0.1 (a free port) in this process, and its clients.

    server = serve_app(["serve.max_sessions=2"], token="t")   # uvicorn on its own thread
    response = server.http.post("/v1/sessions", json={...})    # httpx, the token sent
    with server.stream(session_id) as ws: ...                  # websockets' sync client
    server.stop()                                              # or at the test's end

The pipeline is the embedded default (the bouncing world model, 32x32 frames) with its
warmup off: the tests time nothing. Every server is stopped at the end of its test and
must give back every KV page.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Iterator

import numpy as np
import pytest

TINY_DIT = {"pipeline.entry": "ardiff.pipelines.tiny_dit:TinyCausalDiT",
            "pipeline.args": "{frames_per_block: 3, window_frames: 9, sink_frames: 1}",
            "runtime.memory_budget": "64MiB", "rollout.actions": "null",
            "rollout.prompt": "a", "output.scale": "1"}


class Server:
    """One app served by uvicorn on a thread; `manager` is its SessionManager."""

    def __init__(self, config: Any, token: str | None = None, guard: Any = None) -> None:
        import httpx
        import uvicorn

        from ardiff.serve.app import create_app
        from ardiff.serve.http import Guard
        from ardiff.serve.manager import SessionManager

        self.manager = SessionManager.build(config)
        self.token = token
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(
            create_app(self.manager, guard or Guard(token=token)), log_level="warning",
            lifespan="on",
            ws_max_size=config.serve.max_message_bytes))
        self.thread = threading.Thread(target=self.server.run, args=([self.listener],),
                                       daemon=True)
        self.thread.start()
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=30)
        _wait_until(lambda: self.server.started, 30, "the server to start")

    def create(self, **body: Any) -> str:
        response = self.http.post("/v1/sessions", json=body)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def stream(self, session_id: str, token: str | None = None):
        from websockets.sync.client import connect

        token = token if token is not None else self.token
        query = "" if token is None else f"?token={token}"
        return connect(f"ws://127.0.0.1:{self.port}/v1/sessions/{session_id}/stream{query}",
                       open_timeout=30, max_size=2**24)

    def pages_in_use(self) -> int:
        return self.manager.kv_pages()[0] or 0

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.http.close()
        self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive(), "the server did not stop"
        self.manager.shutdown()  # the app's shutdown did it already: safe twice
        self.listener.close()


def _starter(folder, servers: list[Server]):
    from ardiff.config.run import load_config

    def start(overrides: list[str] = (), token: str | None = None,
              base: dict[str, str] | None = None, guard: Any = None) -> Server:
        settings = {"warmup.enabled": "false", "serve.output_dir": str(folder / "videos"),
                    **(base or {})}
        config = load_config(None, [f"{key}={value}" for key, value in settings.items()]
                             + list(overrides))
        server = Server(config, token, guard)
        servers.append(server)
        return server

    return start


def _stop_all(servers: list[Server]) -> None:
    for server in servers:
        server.stop()
        assert server.pages_in_use() == 0


@pytest.fixture
def serve_app(tmp_path) -> Iterator[Any]:
    """`serve_app(overrides, token=None, base=None, guard=None) -> Server`; stopped (every
    page back checked) when the test ends."""
    servers: list[Server] = []
    yield _starter(tmp_path, servers)
    _stop_all(servers)


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory) -> Iterator[Server]:
    """One server for a module's tests (each closes its sessions): token `s3cret`, 2
    sessions, small limits (bodies 1000 bytes, prompts 200 characters, 1000 frames)."""
    servers: list[Server] = []
    yield _starter(tmp_path_factory.mktemp("serve"), servers)(
        ["serve.max_sessions=2", "serve.retry_after_s=7", "serve.max_body_bytes=1000",
         "serve.max_prompt_chars=200", "serve.max_frames=1000"], token="s3cret")
    _stop_all(servers)


@pytest.fixture(scope="module")
def local_app(tmp_path_factory) -> Iterator[Server]:
    """One server for a module's tests as a user runs it on their machine: no token, 2
    sessions, bodies and messages up to 100000 bytes."""
    servers: list[Server] = []
    yield _starter(tmp_path_factory.mktemp("local"), servers)(
        ["serve.max_sessions=2", "serve.max_body_bytes=100000",
         "serve.max_message_bytes=100000"])
    _stop_all(servers)


def read_frames(ws, limit: int = 10_000) -> tuple[list[dict[str, Any]], list[np.ndarray], dict]:
    """Every frame message until the end message: (headers, RGB arrays, end message)."""
    from ardiff.serve.frames import parse_frame_message

    headers, pictures = [], []
    for _ in range(limit):
        message = ws.recv(timeout=60)
        if isinstance(message, str):
            return headers, pictures, json.loads(message)
        header, image = parse_frame_message(message)
        headers.append(header)
        pictures.append(decode(image))
    raise AssertionError(f"no end after {limit} frames")


def decode(image: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))


def _wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def wait_until():
    return _wait_until


@pytest.fixture
def frames_of():
    return read_frames


@pytest.fixture
def decode_image():
    return decode


@pytest.fixture
def rollout_frames(tmp_path):
    """`rollout_frames(overrides) -> uint8 [F, H, W, 3]`: what `ardiff rollout` makes for the
    embedded default with `--set` overrides (the same run, in this process, into a .npy)."""
    from ardiff.config.run import load_config
    from ardiff.rollout.job import run_rollout

    def run(overrides: list[str]) -> np.ndarray:
        output = tmp_path / f"rollout-{len(list(tmp_path.glob('rollout-*')))}.npy"
        config = load_config(None, ["warmup.enabled=false", "output.scale=1",
                                    f"output.path={output}", *overrides])
        report = run_rollout(config)
        assert report.status == "ok", report.error
        return np.load(output)

    return run


@pytest.fixture
def tiny_dit() -> dict[str, str]:
    return dict(TINY_DIT)

