"""Live sessions over one runner: admission, a scheduler thread, steering, idle close, shutdown.

    manager = SessionManager.build(config)       # load, plan the KV cache, warm up, start
    session = manager.create(body)               # SessionRefused when no slot is free
    manager.steer(id, "left"); manager.switch_prompt(id, "a cat", "keep"); manager.pause(id, True)
    manager.close(id)                            # hooks run, pages back
    manager.shutdown()                           # stop taking sessions, finish the blocks in
                                                 # flight, close every session, close the runner

One scheduler thread alone calls the runner (`ardiff.serve.scheduler`); the methods here
only mark a session (steer, switch, pause, close, roll its video) under the lock and, where
they need the result, wait for the scheduler. Steering takes effect at the session's next
block. Admission counts the sessions holding a slot (active or paused), never more than the
KV plan holds resident, so the runner never evicts one.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ardiff.config.run import RunConfig
from ardiff.contract.inputs import get_pipeline_inputs
from ardiff.engine.batching import supports_batches
from ardiff.engine.build import build_runner, resolve
from ardiff.engine.runner import Runner
from ardiff.errors import ConfigError
from ardiff.rollout.inputs import pipeline_actions, read_actions
from ardiff.rollout.job import needs_processes
from ardiff.rollout.streams import latent_frame_map, plan_rollout, video_frames_per_block
from ardiff.serve.blocks import BlockWalker
from ardiff.serve.folder import RunFolder
from ardiff.serve.frames import FrameQueue
from ardiff.serve.options import (
    SessionOptions,
    check_prompt_length,
    check_session_id,
    read_session_options,
)
from ardiff.serve.recording import Recording
from ardiff.serve.scheduler import BlockScheduler, ServeStats
from ardiff.serve.session import (
    ServeSession,
    SessionBusy,
    SessionExists,
    SessionRefused,
    State,
    UnknownSession,
)
from ardiff.text import text_problem

ON_SWITCH = ("keep", "clear-cross", "reset", "recache")


class SessionManager(BlockScheduler):
    """Sessions of one runner; thread-safe. `on_block(latency_s)` is called per block."""

    def __init__(self, config: RunConfig, runner: Runner, folder: RunFolder) -> None:
        _check_one_worker(config)
        self.config, self.runner, self.folder = config, runner, folder
        serve = config.serve
        self.capacity = min(runner.plan.session_capacity, serve.max_sessions or 2**31)
        self.batch = 1 if not supports_batches(runner.pipeline) else max(1, min(
            serve.batch or self.capacity, runner.plan.batch_rows, self.capacity))
        self.action_names = pipeline_actions(runner.pipeline)
        self.inputs = get_pipeline_inputs(runner.pipeline)  # None: it declares nothing
        spec = runner.plan.spec
        self.frames_per_block, self.max_model_len = spec.frames_per_block, spec.max_model_len
        self.video_per_block, self.video_first_block = video_frames_per_block(
            runner.pipeline, spec.frames_per_block)
        self.latent_map = latent_frame_map(runner.pipeline)
        self.stats = ServeStats()
        self.on_block: Callable[[float], None] | None = None
        self.accepting = True
        self.sessions: dict[str, ServeSession] = {}
        self._count = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._stopper: threading.Thread | None = None  # begin_shutdown's, running shutdown
        self._stop_lock = threading.Lock()             # one shutdown at a time
        self._stopped = False
        self._files = threading.Lock()  # the scheduler's hold on recordings (see _abandon)
        self.abandoned = False          # a forward was stuck at the stop: files taken over
        self._thread = threading.Thread(target=self._loop, name="ardiff-serve-scheduler",
                                        daemon=True)
        self.scheduler_error: BaseException | None = None
        self.prepare({})  # the config's own session must be valid: refused at start, not later
        self._thread.start()

    @classmethod
    def build(cls, config: RunConfig) -> SessionManager:
        """Load the config's pipeline, plan its KV cache (a block in flight per batch row),
        warm up, and start serving. Raises ConfigError (bad config) or the build's errors."""
        _check_one_worker(config)
        resolved = resolve(config)
        rows = config.serve.batch or config.serve.max_sessions or resolved.spec.session_capacity
        runner = build_runner(config, resolved,
                              batch_rows=rows if supports_batches(resolved.pipeline) else 1)
        try:
            if config.warmup.enabled:
                runner.warmup()
            return cls(config, runner, RunFolder.open(config))
        except BaseException:
            runner.close()
            raise

    # -- sessions ------------------------------------------------------------------------
    def prepare(self, body: Any) -> tuple[SessionOptions, BlockWalker]:
        """A session's options and walker from a request body; ConfigError names the body's
        dotted path. Changes nothing."""
        options = read_session_options(body, self.config, self.action_names is not None)
        if isinstance(body, dict) and body.get("prompt") is not None:
            self._check_takes_prompts("prompt")
        config = options.config
        planned = options.frames if options.frames is not None else self.video_first_block
        config = dataclasses.replace(config, rollout=dataclasses.replace(
            config.rollout, frames=planned))
        object.__setattr__(config, "base_dir", options.config.base_dir)
        try:
            plan = plan_rollout(config, self.runner.plan.spec, self.video_per_block,
                                self.video_first_block, self.action_names, self.latent_map)
        except ConfigError as exc:
            raise ConfigError(_body_path(str(exc))) from exc
        walker = BlockWalker("", plan, options.frames, self.config.serve.max_frames,
                             self.frames_per_block, self.max_model_len, self._idle_action())
        return options, walker

    def create(self, body: Any, public_id: str | None = None) -> ServeSession:
        """Admit a new session (SessionRefused when none can be) and queue its first block.
        `public_id`: the client's choice (`PUT /v1/sessions/{id}`, so a balancer can hash
        it), else a random one; ConfigError for a malformed one, SessionExists for a taken
        one."""
        if public_id is not None:
            check_session_id(public_id)
        options, walker = self.prepare(body)
        with self._cond:
            if public_id is not None and public_id in self.sessions:
                raise SessionExists(f"id: a session {public_id[:64]!r} exists; choose "
                                    f"another id, or DELETE it first")
            self._check_room()
            self._count += 1
            session_id = f"serve-{self._count}"
            walker.session_id = session_id
            path = self.folder.recording_path(self._count)
            keep = self.folder.keep if self.config.serve.keep_videos else None
            session = ServeSession(
                public_id or secrets.token_urlsafe(24), session_id, options, walker,
                FrameQueue(self.config.serve.queue_frames),
                Recording(path, options.fps, self.config.output.scale, keep),
                state=State.PAUSED if options.paused else State.ACTIVE)
            self.sessions[session.public_id] = session
            self.stats.created += 1
            self._cond.notify_all()
        return session

    def _check_room(self) -> None:
        retry = self.config.serve.retry_after_s
        if not self.accepting or self._thread_gone:
            self.stats.refused += 1
            error = self.scheduler_error
            why = ("the server is shutting down" if error is None else
                   f"the scheduler stopped ({type(error).__name__}: {error})")
            raise SessionRefused(f"{why}; it takes no new sessions", retry)
        if self.live_sessions >= self.capacity:
            self.stats.refused += 1
            raise SessionRefused(f"all {self.capacity} session slots are in use (the KV cache "
                                 f"holds {self.runner.plan.session_capacity}); retry later",
                                 retry)

    @property
    def live_sessions(self) -> int:
        """Sessions that hold a slot: active or paused (a done or failed one gave its pages
        back; its record stays for its client until closed)."""
        return sum(not session.state.is_final for session in self.sessions.values())

    def get(self, public_id: str) -> ServeSession:
        session = self.sessions.get(public_id)
        if session is None:
            raise UnknownSession(f"no session {public_id[:64]!r}; it was closed or never existed")
        return session

    def describe(self, public_id: str) -> dict[str, Any]:
        with self._cond:
            session = self.get(public_id)
            return session.describe(session.kv_pages)

    def steer(self, public_id: str, action: Any) -> tuple[str, ...]:
        """The session's next block takes `action` (one action, or one per frame)."""
        if self.action_names is None:
            raise ConfigError("action: this pipeline declares no actions (no action_names); "
                              "steer an action-conditioned pipeline")
        try:
            (checked,) = read_actions([action], self.config.base_dir, self.action_names,
                                      self.frames_per_block) or ((),)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("rollout.actions[0]", "action", 1)) from exc
        with self._cond:
            self.get(public_id).walker.steer(checked)
        return checked

    def switch_prompt(self, public_id: str, prompt: Any, on_switch: Any = "keep") -> None:
        """From the session's next block on, `prompt` (as a schedule's switch does)."""
        self._check_takes_prompts("prompt")
        if not isinstance(prompt, str):
            raise ConfigError(f"prompt: expected a string, got {type(prompt).__name__}")
        problem = text_problem(prompt)
        if problem:
            raise ConfigError(f"prompt: the text {problem}")
        check_prompt_length("prompt", prompt, self.config.serve.max_prompt_chars)
        if on_switch not in ON_SWITCH:
            raise ConfigError(f"on_switch: {str(on_switch)[:40]!r} is not allowed; use one of "
                              f"{', '.join(ON_SWITCH)}")
        with self._cond:
            self.get(public_id).walker.switch_prompt(prompt, on_switch)

    @property
    def takes_prompts(self) -> bool:
        """The pipeline reads prompts (it declares `accepted`/`required`, or nothing)."""
        return self.inputs is None or self.inputs.takes("prompt")

    def _check_takes_prompts(self, where: str) -> None:
        if not self.takes_prompts:
            raise ConfigError(f"{where}: this pipeline ignores prompts (its PipelineInputs say "
                              f"prompt: ignored); leave the prompt out, or serve a "
                              f"text-conditioned pipeline")

    def pause(self, public_id: str, paused: bool) -> None:
        """Pause (from the next block boundary) or resume a session."""
        with self._cond:
            session = self.get(public_id)
            if session.state is State.ACTIVE and paused:
                session.state = State.PAUSED
            elif session.state is State.PAUSED and not paused:
                session.state = State.ACTIVE
                session.next_tick_s = time.monotonic()
            self._cond.notify_all()

    def connect(self, public_id: str, wake: Callable[[], None]) -> ServeSession:
        """A client streams the session (one at a time; a second gets SessionBusy);
        `wake` is called from any thread when a frame or the end comes."""
        with self._cond:
            session = self.get(public_id)
            if session.clients:
                raise SessionBusy("stream: another client is streaming this session; "
                                  "close it first")
            session.clients += 1
            session.queue.on_put = wake
            return session

    def disconnect(self, session: ServeSession) -> None:
        with self._cond:
            session.clients -= 1
            session.queue.on_put = None
            session.idle_since_s = time.monotonic()
            self._cond.notify_all()

    def close(self, public_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Close a session (at the next block boundary): hooks run, pages back. Returns its
        last description."""
        with self._cond:
            session = self.get(public_id)
            session.close_requested = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: session.state is State.CLOSED or self._thread_gone
                                or self.abandoned, timeout_s)
            return session.describe(0)

    def video(self, public_id: str, target: Path, timeout_s: float = 60.0) -> int:
        """The session's video so far as one mp4 at `target`; returns its frames (0: none yet)."""
        with self._cond:
            session = self.get(public_id)
            if not session.state.is_final:
                session.roll_requested = True  # the scheduler finishes the open segment
                self._cond.notify_all()
                self._cond.wait_for(lambda: not session.roll_requested or self._thread_gone
                                    or self.abandoned, timeout_s)
        return session.recording.join(target)

    # -- stopping ------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """Take no new session (503) from now on and start `shutdown` on a thread of its
        own, so the streams end as their sessions close (a signal handler calls this)."""
        with self._cond:
            self.accepting = False
            if self._stopper is not None:
                return
            self._stopper = threading.Thread(target=self.shutdown, daemon=True,
                                             name="ardiff-serve-stop")
        self._stopper.start()

    def shutdown(self) -> None:
        """Stop taking sessions, let the blocks in flight finish, close every session (hooks
        run, pages back), close the runner and the output folder. A forward still running
        `serve.stop_timeout_s` later is left to itself: its sessions fail, every video is
        finished, the runner is not touched again. Safe to call twice, from any thread."""
        with self._stop_lock:
            if self._stopped:
                return
            with self._cond:
                self.accepting, self._stopping = False, True
                self._cond.notify_all()
            self._thread.join(self.config.serve.stop_timeout_s)
            if self._thread.is_alive():
                self._abandon()
            else:
                self.runner.close()
            self.folder.close()
            self._stopped = True

    def _abandon(self) -> None:
        """The scheduler is stuck in a forward: fail every session it holds (as `_fail`,
        but without the runner, which that forward still uses) and finish their videos.
        The scheduler, should the forward return, touches no file after this."""
        why = (f"stopped: a forward still ran {self.config.serve.stop_timeout_s:g} s after "
               f"the stop (serve.stop_timeout_s); the session failed with it")
        with self._files:
            with self._cond:
                self.abandoned = True
                left = list(self.sessions.values())
            for session in left:
                self._fail_files(session, why)

    # -- numbers -------------------------------------------------------------------------
    def kv_pages(self) -> tuple[int | None, int | None]:
        """(pages in use, pages in all) of the runner's cache (None: a cache without pages)."""
        stats = self.runner.cache.stats()
        return stats.pages_in_use, stats.pages_total

    def load(self) -> dict[str, Any]:
        """What a worker of `--workers N` tells its front with each beat: sessions holding
        a slot, the capacity, KV pages in use and in all (None: a cache without pages)."""
        with self._cond:
            sessions = self.live_sessions
        try:
            in_use, total = self.kv_pages()
        except Exception:  # noqa: BLE001 - read while a block runs: the count still goes
            in_use = total = None
        return {"sessions": sessions, "capacity": self.capacity,
                "kv_pages_in_use": in_use, "kv_pages_total": total}

    def queued_frames(self) -> int:
        """Frames waiting for a client: of live sessions, and of ended ones still streamed
        (an ended session nobody streams counts no more, though its record stays)."""
        with self._cond:
            return sum(len(s.queue) for s in self.sessions.values()
                       if not s.state.is_final or s.clients)

    def frames_dropped(self) -> int:
        with self._cond:
            return (sum(s.queue.dropped for s in self.sessions.values())
                    + self.stats.frames_dropped_closed)

    def blocks_per_s(self, window_s: float = 10.0) -> float:
        now = time.monotonic()
        with self._cond:
            recent = [t for t in self.stats.block_times_s if now - t <= window_s]
        return len(recent) / window_s

    @property
    def idle_action(self) -> str | None:
        """The action of a block nobody steered (`play.idle`, else the pipeline's first)."""
        return self._idle_action()

    def _idle_action(self) -> str | None:
        if self.action_names is None:
            return None
        return self.config.play.idle or self.action_names[0]


def check_serve_config(config: RunConfig) -> None:
    """What `ardiff serve` cannot run: several prompts per session, CFG-parallel ranks or
    torchrun's ranks (data-parallel workers it runs: ardiff.serve.workers)."""
    if config.rollout.prompts is not None:
        raise ConfigError("rollout.prompts: ardiff serve runs one prompt per session (a "
                          "request's body gives it); remove rollout.prompts")
    parallel = config.runtime.parallel
    if parallel.cfg != 1 or parallel.launcher == "env":
        raise ConfigError("runtime.parallel: ardiff serve runs data-parallel workers only "
                          "(--workers N, one per device); set runtime.parallel.cfg: 1 and "
                          "launcher: spawn")


def _check_one_worker(config: RunConfig) -> None:
    check_serve_config(config)
    if needs_processes(config):
        raise ConfigError("runtime.parallel.workers: a SessionManager is one worker; "
                          "several are a WorkerPool's (ardiff.serve.workers)")


def _body_path(message: str) -> str:
    """A rollout message's dotted path as the body's (`rollout.actions[0]` -> `actions[0]`)."""
    return message.removeprefix("rollout.").removeprefix("output.")
