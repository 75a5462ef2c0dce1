"""The scheduler of `SessionManager`: the one thread that calls the runner.

    turn:  close what was asked to close (or idled out) -> roll the videos asked for
           -> one block of every due session, oldest-served first, `batch` per forward
           -> frames to each session's recording and client queue -> done / failed

A session is due when it is active and (paced) its tick came, or (fast) always. With a
pipeline that has `generate_blocks` a turn's sessions share forwards (`execute_rows`: a
forward that raises before committing runs each session again alone, so a failing row
fails its own session only); without, one `execute` each. The thread sleeps until the next paced tick, a change, or MAX_WAIT_S (so
idle timeouts are seen). It never raises: an unexpected error is kept in
`scheduler_error`, every session is closed and the thread ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ardiff.config.run import RunConfig
from ardiff.engine.runner import BlockResult, Runner
from ardiff.errors import ArdiffError
from ardiff.serve.frames import Frame
from ardiff.serve.session import ServeSession, State

MAX_WAIT_S = 0.25  # the scheduler's longest sleep: idle timeouts are checked this often


@dataclass
class ServeStats:
    """Counters since start; what /metrics and /health read."""

    created: int = 0
    refused: int = 0
    done: int = 0
    failed: int = 0
    closed: int = 0
    blocks: int = 0
    frames: int = 0
    frames_dropped_closed: int = 0  # dropped for clients of sessions since closed
    block_times_s: list[float] = field(default_factory=list)  # when recent blocks ended


class BlockScheduler:
    """The scheduling half of `SessionManager` (which sets these attributes)."""

    config: RunConfig
    runner: Runner
    batch: int
    sessions: dict[str, ServeSession]
    stats: ServeStats
    on_block: Callable[[float], None] | None
    scheduler_error: BaseException | None
    _cond: threading.Condition
    _thread: threading.Thread
    _stopping: bool
    _files: threading.Lock    # held while this thread touches a recording
    abandoned: bool           # the stop took the files over: touch none

    @property
    def _thread_gone(self) -> bool:
        return not self._thread.is_alive()

    def _loop(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as exc:  # noqa: BLE001 - kept for shutdown to report
            self.scheduler_error = exc
        finally:
            with self._files:
                if not self.abandoned:
                    self._close_everything()
            if self.abandoned:  # the stuck forward returned after the stop: its pages back
                with contextlib.suppress(Exception):
                    self.runner.close()

    def _turn(self) -> bool:
        """One turn: closes and rolls, then one block of each due session (up to `batch`).
        False once stopping and every session is closed."""
        with self._cond:
            now = time.monotonic()
            closing = [s for s in self.sessions.values() if self._should_close(s, now)]
            rolling = [s for s in self.sessions.values() if s.roll_requested]
            due = [] if self._stopping else sorted(
                (s for s in self.sessions.values() if s.is_due(now) and s not in closing),
                key=lambda s: s.last_run_s)
            if self._stopping and not closing and not self.sessions:
                return False
            if not (closing or rolling or due):
                self._cond.wait(self._wait_s(now))
                return True
            work = [(s, s.walker.next_request()) for s in due]
        with self._files:
            if self.abandoned:
                return False
            self._finish(closing, rolling)
            for s, request in work:
                if request is None:
                    self._done(s)
        work = [(s, r) for s, r in work if r is not None]
        while work and not self.abandoned:
            self._run(work[:self.batch])
            work = work[self.batch:]
        return True

    def _should_close(self, session: ServeSession, now_s: float) -> bool:
        if session.state is State.CLOSED:
            return False
        idle = session.clients == 0 and now_s - session.idle_since_s >= \
            self.config.serve.idle_timeout_s
        return session.close_requested or idle or self._stopping

    def _wait_s(self, now_s: float) -> float:
        ticks = [s.next_tick_s - now_s for s in self.sessions.values() if s.is_runnable]
        return max(0.0, min([MAX_WAIT_S, *ticks]))

    def _run(self, work: list[tuple[ServeSession, Any]]) -> None:
        requests = [r for _, r in work]
        started = time.monotonic()
        try:
            results: list[BlockResult | BaseException] = self._execute(requests)
        except Exception as exc:  # noqa: BLE001 - the batch's sessions fail, not the server
            results = [exc] * len(requests)
        with self._files:
            if not self.abandoned:  # else the stop failed these sessions already
                self._take(work, results, started)

    def _take(self, work: list[tuple[ServeSession, Any]],
              results: list[BlockResult | BaseException], started: float) -> None:
        """A forward's results to their sessions: frames delivered, or the session failed."""
        for (session, request), result in zip(work, results):
            if isinstance(result, BaseException):
                self._fail(session, result)
                continue
            try:  # a device error surfaces here on CUDA; a full disk in the recording
                self._deliver(session, request, result, started, len(work))
            except Exception as exc:  # noqa: BLE001 - that session fails, not the server
                self._fail(session, exc)

    def _execute(self, requests: list[Any]) -> list[BlockResult | BaseException]:
        if self.batch > 1:
            return list(self.runner.execute_rows(requests))
        results: list[BlockResult | BaseException] = []
        for request in requests:  # one by one: a failure is that session's alone
            try:
                results.append(self.runner.execute(request))
            except Exception as exc:  # noqa: BLE001 - reported on its session
                results.append(exc)
        return results

    def _deliver(self, session: ServeSession, request: Any, result: BlockResult,
                 started_s: float, rows: int) -> None:
        latency = result.latency_s
        pages = self.runner.session_pages(session.session_id)  # this thread alone asks
        wanted = session.walker.frames - session.frames_made
        frames = result.output.frames[:max(0, wanted)].detach().to("cpu").numpy()
        if frames.shape[0]:
            session.recording.write(frames)
        for offset in range(frames.shape[0]):
            session.queue.put(Frame(session.frames_made + offset, request.block_index, latency,
                                    request.actions, request.prompt, frames[offset]))
        with self._cond:
            session.frames_made += int(frames.shape[0])
            session.blocks += 1
            session.latencies_s.append(latency)
            session.last_run_s = time.monotonic()
            session.add_timing(request.block_index, started_s, session.last_run_s, latency,
                               rows, result.output.extra.get("stage_times_s"))
            session.kv_pages = pages
            if session.options.mode == "paced":
                period = frames.shape[0] / session.options.fps
                session.next_tick_s = max(session.next_tick_s + period, started_s)
            self.stats.blocks += 1
            self.stats.frames += int(frames.shape[0])
            self.stats.block_times_s.append(session.last_run_s)
            del self.stats.block_times_s[:-4096]
        if self.on_block is not None:
            self.on_block(latency)
        if session.walker.is_done:
            self._done(session)

    def _done(self, session: ServeSession) -> None:
        """Every frame made: the KV pages go back now, the video is finished."""
        self._release(session)
        try:
            session.recording.close()
        except Exception as exc:  # noqa: BLE001 - the frames reached the client; say so
            session.error = f"recording: {type(exc).__name__}: {exc}"
        with self._cond:
            if not session.state.is_final:
                session.state = State.DONE
                self.stats.done += 1
            self._cond.notify_all()
        session.queue.wake()

    def _fail(self, session: ServeSession, exc: BaseException) -> None:
        self._release(session)  # the runner released it already; a batch's others too
        self._fail_files(session, " ".join(str(exc).split()) or type(exc).__name__)

    def _fail_files(self, session: ServeSession, error: str) -> None:
        """The session failed with `error` (one line): its video finished, its client told.
        A session already ended keeps its state."""
        try:
            session.recording.close()
        except Exception:  # noqa: BLE001 - the session's end goes on without its video
            pass
        with self._cond:
            if not session.state.is_final:
                session.state = State.FAILED
                session.error = error
                self.stats.failed += 1
            self._cond.notify_all()
        session.queue.wake()

    def _release(self, session: ServeSession) -> None:
        session.kv_pages = 0
        if session.session_id in self.runner.sessions:
            try:
                self.runner.close_session(session.session_id)
            except ArdiffError as exc:
                session.error = session.error or f"closing: {exc}"

    def _finish(self, closing: list[ServeSession], rolling: list[ServeSession]) -> None:
        for session in rolling:
            if not session.state.is_final:
                session.recording.roll()
            with self._cond:
                session.roll_requested = False
                self._cond.notify_all()
        for session in closing:
            self._close_now(session)

    def _close_now(self, session: ServeSession) -> None:
        self._release(session)
        try:
            session.recording.close()
        except Exception:  # noqa: BLE001 - the session's end goes on without its video
            pass
        if not self.config.serve.keep_videos:
            session.recording.remove()
        with self._cond:
            session.state = State.CLOSED
            self.sessions.pop(session.public_id, None)
            self.stats.closed += 1
            self.stats.frames_dropped_closed += session.queue.dropped
            self._cond.notify_all()
        session.queue.wake()

    def _close_everything(self) -> None:
        with self._cond:
            left = list(self.sessions.values())
        for session in left:
            try:
                self._close_now(session)
            except BaseException:  # noqa: BLE001 - the others still close
                pass
