"""The page of `ardiff serve` (ardiff/serve/static/) driven in a real headless Chromium.

    browser (Playwright, Debian's chromium) --HTTP + WebSocket--> real server on 127.0.0.1
      clicks Start, reads the canvas twice,      the runner's requests are recorded:
      presses arrows / WASD, switches the prompt  the actions and prompts it received

It opens the page, starts a session with the page's own controls, checks that the canvas
changes, steers it with the keys of `play` and checks the server's blocks took those
actions (the world model ignores prompts: its prompt controls are disabled), pauses,
downloads the video, closes; with a pipeline that reads prompts it switches the prompt
through the prompt box; with a `--token` server, the page asks for it once. Every request the page makes goes to
the server (nothing from elsewhere) and the page raises no script error. It saves
`serve.png` (ARDIFF_SERVE_SCREENSHOT=path copies it there: docs/make_screenshots.py serve).
Heavy (a browser start); skipped without `playwright` (the `browser` extra) or chromium.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from extras import require_extra

require_extra("serve")
require_extra("browser")
from playwright import sync_api  # noqa: E402

CHROMIUM = (os.environ.get("ARDIFF_CHROMIUM") or shutil.which("chromium")
            or shutil.which("chromium-browser"))
pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get "
                                 "install chromium, or set ARDIFF_CHROMIUM)")]
VIEWPORT = {"width": 1000, "height": 720}
WAIT_MS = 30_000
# A block without a key pressed takes the idle action ("none"), so each steered block shows.
WORLD = ["rollout.actions=null"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


class Watched:
    """A page of a fresh browser context, its requests and script errors recorded."""

    def __init__(self, browser: Any, url: str) -> None:
        self.url = url
        self.context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("response", lambda response: response.status >= 400 and self.errors.append(
            f"{response.status} {response.url}"))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", lambda message: message.type == "error"
                     and self.errors.append(message.text))

    def check_clean(self, allowed_errors: tuple[str, ...] = ()) -> None:
        outside = [url for url in self.requests if not url.startswith(
            (self.url + "/", self.url.replace("http:", "ws:") + "/", "blob:", "data:"))]
        assert outside == [], f"the page fetched from elsewhere: {outside}"
        errors = [e for e in self.errors if not any(a in e for a in allowed_errors)]
        assert errors == [], f"script errors: {errors}"

    def canvas(self) -> list[int]:
        return self.page.evaluate("""() => { const c = document.getElementById('screen');
            return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }""")

    def frame_shown(self) -> int:
        text = self.page.inner_text("#stats")
        return int(text.split()[1]) if text.split()[1].isdigit() else -1

    def wait_for_frame(self, at_least: int) -> None:
        self.page.wait_for_function(
            """(n) => { const m = /^frame (\\d+)/.exec(document.getElementById('stats')
                         .textContent); return m !== null && Number(m[1]) >= n; }""",
            arg=at_least)

    def close(self) -> None:
        self.context.close()


def record_requests(server: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every request the server's runner executes from now on (what its blocks took)."""
    runner, seen = server.manager.runner, []
    execute, execute_batch = runner.execute, runner.execute_batch

    def one(request: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(request)
        return execute(request, *args, **kwargs)

    def batch(requests: Any, *args: Any, **kwargs: Any) -> Any:
        seen.extend(requests)
        return execute_batch(requests, *args, **kwargs)

    monkeypatch.setattr(runner, "execute", one)
    monkeypatch.setattr(runner, "execute_batch", batch)
    return seen


def test_the_page_starts_watches_steers_and_switches_a_session(
        serve_app, browser, monkeypatch, wait_until, tmp_path):
    server = serve_app(WORLD)
    seen = record_requests(server, monkeypatch)
    watched = Watched(browser, server.url)
    page = watched.page
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('server').textContent !== ''")
    assert "bouncing" in page.inner_text("#server").lower()
    assert "left ← a" in page.inner_text("#keys")      # the key map of `play`, from /v1/info
    page.fill("#frames", "")                           # open-ended: until closed
    for control in ("#prompt", "#new-prompt", "#on-switch", "#switch"):  # it ignores prompts
        assert page.is_disabled(control), control
    page.click("#start-form button[type=submit]")
    page.wait_for_selector("#live", state="visible")
    session = page.get_attribute("#session-id", "title")
    assert server.http.get(f"/v1/sessions/{session}").json()["mode"] == "paced"

    watched.wait_for_frame(2)
    before, frame_before = watched.canvas(), watched.frame_shown()
    watched.wait_for_frame(frame_before + 6)
    assert watched.canvas() != before, "the canvas did not change as frames came"
    assert page.evaluate("document.activeElement.id") == "screen"  # focused for the keys

    for key, action in (("ArrowUp", "up"), ("ArrowLeft", "left"), ("d", "right")):
        page.keyboard.press(key)
        wait_until(lambda: any(r.actions == (action,) for r in seen), 30,
                   f"a block with the action {action!r} after pressing {key}")
    assert {r.actions for r in seen} <= {("none",), ("up",), ("left",), ("right",)}

    page.keyboard.press("ArrowDown")
    wait_until(lambda: any(r.actions == ("down",) for r in seen), 30, "a steered block")

    page.wait_for_function("""() => { const rows = document.querySelectorAll('#session-rows tr');
        return rows.length === 1 && Number(rows[0].cells[3].textContent) > 20; }""")  # refreshed
    assert "active" in page.inner_text("#session-rows")
    assert page.inner_text("#kv").startswith("KV pages in use: ")
    screenshot = tmp_path / "serve.png"
    page.screenshot(path=str(screenshot))
    if os.environ.get("ARDIFF_SERVE_SCREENSHOT"):
        shutil.copyfile(screenshot, os.environ["ARDIFF_SERVE_SCREENSHOT"])

    page.click("#pause")
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["status"] == "paused",
               30, "the session to pause")
    assert page.inner_text("#pause") == "Resume"
    page.click("#pause")
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").json()["status"] == "active",
               30, "the session to resume")

    with page.expect_download() as download_info:
        page.click("#video")
    video = Path(download_info.value.path())
    assert download_info.value.suggested_filename.endswith(".mp4")
    assert video.stat().st_size > 0 and video.read_bytes()[4:8] == b"ftyp"

    page.click("#close")
    page.wait_for_selector("#live", state="hidden")
    wait_until(lambda: server.http.get(f"/v1/sessions/{session}").status_code == 404, 30,
               "the session to close")
    assert server.pages_in_use() == 0
    watched.check_clean()
    watched.close()


def test_the_page_switches_the_prompt_of_a_pipeline_that_reads_prompts(
        serve_app, browser, monkeypatch, wait_until, tiny_dit):
    server = serve_app(base=tiny_dit)
    seen = record_requests(server, monkeypatch)
    watched = Watched(browser, server.url)
    page = watched.page
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('server').textContent !== ''")
    assert not page.is_disabled("#prompt") and not page.is_disabled("#new-prompt")
    page.fill("#frames", "")
    page.fill("#prompt", "a ball")
    page.click("#start-form button[type=submit]")
    page.wait_for_selector("#live", state="visible")
    wait_until(lambda: any(r.prompt == "a ball" for r in seen), 30, "the first prompt")
    page.fill("#new-prompt", "a red ball")
    page.select_option("#on-switch", "recache")
    page.click("#switch-form button[type=submit]")
    wait_until(lambda: any(r.prompt == "a red ball" for r in seen), 30, "the switched prompt")
    switched = next(r for r in seen if r.prompt == "a red ball")
    assert switched.extra == {"recache": True} and switched.clear_cross_kv
    page.wait_for_function("document.getElementById('now-prompt').textContent"
                           " === 'prompt: a red ball'")          # the frames' own header
    page.click("#close")
    page.wait_for_selector("#live", state="hidden")
    watched.check_clean()
    watched.close()


def test_the_page_asks_for_the_token_once_and_works_with_it(serve_app, browser, monkeypatch,
                                                            wait_until):
    server = serve_app(WORLD, token="s3cret")
    seen = record_requests(server, monkeypatch)
    watched = Watched(browser, server.url)
    page = watched.page

    def answer(dialog: Any) -> None:
        watched.dialogs.append(dialog.type)
        dialog.accept("s3cret")

    page.on("dialog", answer)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('kv').textContent !== ''")
    page.fill("#frames", "")
    page.click("#start-form button[type=submit]")
    watched.wait_for_frame(3)
    page.keyboard.press("ArrowRight")
    wait_until(lambda: any(r.actions == ("right",) for r in seen), 30, "the steered block")
    page.wait_for_function("""() => { const rows = document.querySelectorAll('#session-rows tr');
        return rows.length === 1 && Number(rows[0].cells[3].textContent) > 10; }""")  # refreshed
    page.reload()                                      # the tab keeps the token
    page.wait_for_function("document.getElementById('kv').textContent !== ''")
    assert watched.dialogs == ["prompt"]
    # The 401s before the token was given are the browser's own console lines, not the page's.
    watched.check_clean(allowed_errors=("401",))
    watched.close()


def test_a_wrong_token_is_said_and_asked_again_on_start(serve_app, browser):
    server = serve_app(WORLD, token="s3cret")
    watched = Watched(browser, server.url)
    page = watched.page
    answers = iter(["wrong", "s3cret"])

    def answer(dialog: Any) -> None:
        watched.dialogs.append(dialog.type)
        dialog.accept(next(answers))

    page.on("dialog", answer)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('start-error').textContent !== ''")
    assert "wrong token" in page.inner_text("#start-error")
    page.wait_for_function("document.getElementById('kv').textContent.includes('token')")
    assert watched.dialogs == ["prompt"]                # the refresh does not ask
    page.fill("#frames", "6")                          # kept when the defaults come
    page.click("#start-form button[type=submit]")      # asks again, then starts
    page.wait_for_function("document.getElementById('live-error').textContent"
                           " === 'session done after 6 frames'")
    assert watched.dialogs == ["prompt", "prompt"]
    assert page.get_attribute("#live-error", "class") == "note"
    assert page.inner_text("#start-error") == ""
    watched.check_clean(allowed_errors=("401",))
    watched.close()


def test_the_page_works_through_the_front_of_two_workers(browser, tmp_path):
    """`ardiff serve --workers 2`: the same page through the front, which routes the session's
    calls and stream to its worker; what the blocks took comes back in the frames' headers."""
    ardiff = str(Path(sys.executable).parent / "ardiff")
    proc = subprocess.Popen(
        [ardiff, "serve", "--workers", "2", "--port", "0", "--token", "t0k",
         "--set", "warmup.enabled=false", "--set", "rollout.actions=null",
         "--set", "serve.max_sessions=2", "--set", f"serve.output_dir={tmp_path / 'videos'}"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True).start()
    try:
        deadline = time.monotonic() + 180
        while not any("listening on" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        listening = re.search(r"http://127\.0\.0\.1:(\d+)", "".join(lines))
        assert listening is not None, "".join(lines)
        port = listening.group(1)
        watched = Watched(browser, f"http://127.0.0.1:{port}")
        page = watched.page
        page.on("dialog", lambda dialog: (watched.dialogs.append(dialog.type),
                                          dialog.accept("t0k")))
        page.goto(watched.url + "/")
        page.wait_for_function("document.getElementById('server').textContent"
                               ".includes('on 2 workers')")
        page.fill("#frames", "")
        page.click("#start-form button[type=submit]")
        watched.wait_for_frame(2)
        before, frame_before = watched.canvas(), watched.frame_shown()
        watched.wait_for_frame(frame_before + 6)
        assert watched.canvas() != before
        page.keyboard.press("ArrowUp")
        page.wait_for_function("document.getElementById('stats').textContent"
                               ".endsWith('actions up')")       # a block took it
        assert page.is_disabled("#new-prompt")  # the world model ignores prompts
        page.wait_for_selector("#worker-column", state="visible")
        page.wait_for_function("document.querySelector('#session-rows tr.mine') !== null")
        page.click("#close")
        page.wait_for_function("document.querySelectorAll('#session-rows tr').length === 0")
        assert watched.dialogs == ["prompt"]
        watched.check_clean(allowed_errors=("401",))
        watched.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, "".join(lines)
