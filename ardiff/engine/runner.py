"""The runner: owns the pipeline, the KV cache and the sessions.

    runner = build_runner(config)     (ardiff.engine.build: load, measure, plan, allocate)
    runner.warmup()                   the pipeline's warmup requests on a reserved session
    runner.execute(request)           one AR block of one session -> BlockResult(output, latency)
    runner.execute_batch(requests)    one block of each session, one forward where the pipeline
                                      has generate_blocks -> [BlockResult], in request order
    runner.execute_rows(requests)     the same, each row's result or error: a forward that
                                      failed before committing runs each row again alone
    runner.fail_block(sid, k, exc)    a block whose error surfaced at a later device wait
    runner.stats()                    latencies, session counts, pages; it never prints

Every forward, warmup included, runs `generate_block(request, state)` inside
`bind_ar_diffusion_state(session_id, state)`; the state is closed when the bind exits. One
release path serves reset, close, LRU eviction and failure: the session's KV first, then
the pipeline's hook, every step run even when one raises. Warmup never evicts: it runs
under `WARMUP_SESSION_ID` on a free slot. On CUDA `execute` returns once the block is
queued (its latency is read later: `ardiff.engine.timing`); an error the device raises
surfaces at the next wait, and whoever sees it calls `fail_block`
(docs/design.md#5-runner-and-sessions). A batch enters every session's bind, in request
order, around one `generate_blocks(requests, KVStateBatch(states))`; it fails closed as a
whole: every session of a batch whose forward raised is released, the others untouched
(`execute_rows`: unless nothing was committed, when each row runs again on its own).
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, NoReturn, Sequence

import torch

from ardiff.contract import ARDiffusionPipeline
from ardiff.contract.forward import BlockOutput, RolloutRequest
from ardiff.engine.batching import batch_failure, check_batch, forward_batch, supports_batches
from ardiff.engine.sessions import Release, SessionInfo, SessionMap
from ardiff.engine.timing import EventFactory, Latency, seconds, start_timer, stop_timer
from ardiff.errors import (
    ArdiffError,
    BlockOutputError,
    PipelineError,
    SessionError,
    WarmupError,
)
from ardiff.kv.backend import CacheStats, KVCacheBase
from ardiff.kv.plan import KVPlan
from ardiff.kv.state import KVState, open_state

WARMUP_SESSION_ID = "__ardiff_warmup__"



@dataclass(frozen=True)
class BlockResult:
    """What `execute` returns: the block's output and the time its forward took (a float on
    CPU; on CUDA a `DeviceLatency` whose events are read when `latency_s` is first read)."""

    output: BlockOutput
    latency: Latency
    started_s: float = 0.0   # time.perf_counter() when its forward began
    stages_s: dict[str, float] = field(default_factory=dict)  # KVState.stage_s: host seconds

    @property
    def latency_s(self) -> float:
        return seconds(self.latency)


class _NothingCommitted(Exception):
    """A batched forward failed before any session's history moved (`execute_rows`)."""


@dataclass
class WarmupReport:
    """What warmup did; `skipped_reason` is set when the pipeline has no warmup."""

    latencies_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    pages_in_use_before: int | None = None
    pages_in_use_after: int | None = None
    skipped_reason: str | None = None

    @property
    def leaked_pages(self) -> int:
        if self.pages_in_use_before is None or self.pages_in_use_after is None:
            return 0
        return self.pages_in_use_after - self.pages_in_use_before


@dataclass
class RunnerStats:
    """Numbers the runner keeps: one latency per AR block (a batched block's is its
    forward's), sessions, pages, and the forwards by how many sessions they served."""

    block_latencies_s: list[float]
    warmup_latencies_s: list[float]
    sessions: dict[str, int]
    cache: CacheStats
    batch_sizes: dict[int, int] = field(default_factory=dict)  # sessions -> forwards


class Runner:
    """Serves `execute(request)` over one pipeline and one KV cache."""

    def __init__(self, pipeline: ARDiffusionPipeline, cache: KVCacheBase[Any],
                 device: str = "cpu") -> None:
        self.pipeline, self.cache, self.device = pipeline, cache, torch.device(device)
        self.plan: KVPlan = cache.plan
        self.sessions = SessionMap(cache.capacity, frozenset({WARMUP_SESSION_ID}))
        self.block_latencies_s: list[Latency] = []  # read into floats by stats()
        self.warmup_latencies_s: list[float] = []
        self.batch_sizes: Counter[int] = Counter()  # forwards (warmup's not) by sessions in them
        self._closed = False
        self.event_factory: EventFactory | None = None  # CUDA timing events (None: torch's)

    # -- serving ---------------------------------------------------------------
    def execute(self, request: RolloutRequest) -> BlockResult:
        """Run one AR block. Any exception releases the session (fail-closed), then propagates."""
        if request.session_id == WARMUP_SESSION_ID:
            raise SessionError(f"session id {WARMUP_SESSION_ID!r} is reserved for warmup; "
                               f"use another session_id")
        result = self._run(request)
        self.block_latencies_s.append(result.latency)
        self.batch_sizes[1] += 1
        return result

    def execute_batch(self, requests: Sequence[RolloutRequest],
                      isolate: bool = False) -> list[BlockResult]:
        """One AR block of each request's session, results in request order.

        A pipeline with `generate_blocks` runs them in one forward (one request: `execute`);
        one without it, one `execute` per request. Each result's latency is the whole
        forward's. A batched forward raises `SessionError` for a repeated or reserved session
        id and `CapacityError` for more sessions than can be resident or than the plan holds
        blocks in flight for, before anything changes; a failed forward releases every
        session of the batch, then raises naming them all."""
        requests = list(requests)
        if len(requests) <= 1 or not supports_batches(self.pipeline):
            return [self.execute(request) for request in requests]
        self._check_open()
        check_batch(requests, self.sessions.capacity, self.plan.batch_rows, WARMUP_SESSION_ID)
        results = self._run_batch(requests, isolate)
        self.block_latencies_s.extend(result.latency for result in results)
        self.batch_sizes[len(requests)] += 1
        return results

    def execute_rows(self, requests: Sequence[RolloutRequest]
                     ) -> list[BlockResult | Exception]:
        """As `execute_batch`, each row's result or error in its place: a failed forward
        that committed nothing (no session's history moved) runs each request again on its
        own, so a failing row fails (and releases) its own session only. One that did
        commit fails every row, as `execute_batch` does."""
        requests = list(requests)
        if len(requests) <= 1 or not supports_batches(self.pipeline):
            return [self._alone(request) for request in requests]
        try:
            return list(self.execute_batch(requests, isolate=True))
        except _NothingCommitted:
            return [self._alone(request) for request in requests]
        except Exception as exc:  # noqa: BLE001 - the forward committed: every row failed
            return [exc] * len(requests)

    def session_pages(self, session_id: str) -> int:
        """KV pages the session holds now (0: not resident, or a cache without pages)."""
        return self.cache.session_pages(session_id)

    def _alone(self, request: RolloutRequest) -> BlockResult | Exception:
        try:
            return self.execute(request)
        except Exception as exc:  # noqa: BLE001 - that row's: its session was released
            return exc

    def _committed(self, requests: list[RolloutRequest]) -> list[int]:
        return [self.cache.num_committed_frames(request.session_id, branch.name)
                for request in requests for branch in self.cache.spec.kv_branches]

    def _run_batch(self, requests: list[RolloutRequest],
                   isolate: bool = False) -> list[BlockResult]:
        for request in requests:  # resets first: the reset hook runs on every reset
            if request.reset:
                self._release(request.session_id, Release.RESET)
        infos = self._admit_batch([request.session_id for request in requests])
        for request in requests:
            if request.clear_cross_kv:
                for branch in self.cache.spec.kv_branches:
                    self.cache.cross.clear(request.session_id, branch.name)
        committed = self._committed(requests) if isolate else []
        started, stage_times = time.perf_counter(), list[dict[str, float]]()
        timer = start_timer(self.device, self.event_factory)
        stage = ["bind_ar_diffusion_state"]
        try:
            outputs = forward_batch(self.pipeline, self.cache, requests, self._bind, stage,
                                    stage_times)
            stage[0] = "generate_blocks' outputs"
            for info, request, output in zip(infos, requests, outputs):
                info.frame_size = self._check_output(info, request, output)
        except Exception as exc:
            if isolate and self._committed(requests) == committed:
                raise _NothingCommitted from exc  # nothing released: each runs again alone
            self._fail_batch(requests, exc, stage[0])
        except BaseException as exc:  # an interrupt: the batch ends, as always
            self._fail_batch(requests, exc, stage[0])
        latency = stop_timer(timer, self.event_factory)
        for info in infos:
            info.blocks += 1
        for request in requests:
            if request.close_session:
                self._release(request.session_id, Release.CLOSED)
        return [BlockResult(output, latency, started, stages)
                for output, stages in zip(outputs, stage_times)]

    def _admit_batch(self, session_ids: list[str]) -> list[SessionInfo]:
        """Admit every session; the batch's resident ones become the most recently used
        first, so an eviction (of the least recent) never takes a member of the batch."""
        for sid in session_ids:
            if sid in self.sessions:
                self.sessions.touch(sid)
        return [self._admit(sid) for sid in session_ids]

    def _fail_batch(self, requests: list[RolloutRequest], exc: BaseException,
                    stage: str) -> NoReturn:
        """Release every session of the batch (each step of each, even when one raises),
        then raise as `_fail` does, the error naming every session and its block."""
        cleanup_errors = [(request.session_id, error) for request in requests
                          for error in self._release_steps(request.session_id, Release.FAILED)]
        error = batch_failure(requests, exc, stage)
        for sid, cleanup_error in cleanup_errors:  # on the error that propagates
            if hasattr(error, "add_note"):
                error.add_note(f"while releasing session {sid!r}: "
                               f"{type(cleanup_error).__name__}: {cleanup_error}")
        if error is exc:
            raise exc
        raise error from exc

    def _run(self, request: RolloutRequest) -> BlockResult:
        self._check_open()
        sid = request.session_id
        if request.reset:  # the reset hook runs on every reset, resident or not
            self._release(sid, Release.RESET)
        info = self._admit(sid)
        if request.clear_cross_kv:
            for branch in self.cache.spec.kv_branches:
                self.cache.cross.clear(sid, branch.name)
        started, stages = time.perf_counter(), dict[str, float]()
        timer = start_timer(self.device, self.event_factory)
        stage = ["bind_ar_diffusion_state"]  # what was running when an exception came
        try:
            output = self._forward(request, stage, stages)
            info.frame_size = self._check_output(info, request, output)
        except BaseException as exc:
            self._fail(sid, request.block_index, exc, stage[0])
        latency = stop_timer(timer, self.event_factory)
        info.blocks += 1
        if request.close_session:
            self._release(sid, Release.CLOSED)
        return BlockResult(output, latency, started, stages)

    def _forward(self, request: RolloutRequest, stage: list[str],
                 stages: dict[str, float]) -> BlockOutput:
        """generate_block inside the pipeline's bind; the state is closed when the bind ends,
        and a KV block the pipeline entered and never exited with it (a failed forward).
        `stages` gets the state's stage times."""
        state = open_state(self.cache, request.session_id)
        raised: BaseException | None = None
        try:
            with self._bind(request.session_id, state):
                stage[0] = "generate_block"
                try:
                    output = self.pipeline.generate_block(request, state)
                except BaseException as exc:
                    raised = exc
                    raise
                stage[0] = "bind_ar_diffusion_state"  # its exit
        finally:
            left_open = state.close()
            stages.update(state.stage_s)
        if raised is not None:  # the bind's __exit__ swallowed it: the block never finished
            raise PipelineError(f"session {request.session_id!r} block {request.block_index}: "
                                f"bind_ar_diffusion_state suppressed {type(raised).__name__}: "
                                f"{raised}; a bind must let the forward's exceptions "
                                f"through") from raised
        if left_open:
            raise PipelineError(f"session {request.session_id!r} block {request.block_index}: "
                                f"generate_block returned with {' and '.join(left_open)} still "
                                f"open (entered, never exited); nothing of it was committed "
                                f"and its KV pages are back in the pool; enter KV blocks with "
                                f"`with state.block(...)`")
        return output

    def _bind(self, session_id: str, state: KVState) -> AbstractContextManager[None]:
        bind = self.pipeline.bind_ar_diffusion_state(session_id, state)
        if not (hasattr(bind, "__enter__") and hasattr(bind, "__exit__")):
            raise PipelineError(f"pipeline: bind_ar_diffusion_state returned a "
                                f"{type(bind).__name__}; it must return a context manager "
                                f"(e.g. contextlib.nullcontext())")
        return bind

    def _admit(self, session_id: str) -> SessionInfo:
        if session_id not in self.sessions and self.sessions.is_full:
            self._release(self.sessions.least_recently_used(), Release.EVICTED)
        return self.sessions.touch(session_id)

    def fail_block(self, session_id: str, block_index: int, exc: BaseException) -> NoReturn:
        """Fail a block whose error surfaced after `execute` returned (on CUDA, at a later
        wait for the device): release its session if it is still resident (fail-closed, as
        `execute` does), then raise the error as a PipelineError naming session and block."""
        stage = "generate_block (on the device; surfaced at a later wait for it)"
        self._fail(session_id, block_index, exc, stage, release=session_id in self.sessions)

    def _fail(self, session_id: str, block_index: int, exc: BaseException,
              stage: str, release: bool = True) -> NoReturn:
        """Release the session, then raise: ardiff errors and KeyboardInterrupt (an interrupt)
        as they are; anything else, `SystemExit` from a pipeline calling `sys.exit(n)`
        included, as a PipelineError naming the session, block and stage."""
        cleanup_errors = self._release_steps(session_id, Release.FAILED) if release else []
        where = f"session {session_id!r} block {block_index}: {stage}"
        if isinstance(exc, (ArdiffError, KeyboardInterrupt)):
            error = exc
        elif isinstance(exc, SystemExit):  # the pipeline must not end the process
            error = PipelineError(f"{where} called exit({exc.code!r}); a pipeline must raise an "
                                  f"exception, not exit the process")
        else:
            error = PipelineError(f"{where} raised {type(exc).__name__}: {exc}")
        for cleanup_error in cleanup_errors:  # on the error that propagates, not its cause
            if hasattr(error, "add_note"):
                error.add_note(f"while releasing session {session_id!r}: "
                               f"{type(cleanup_error).__name__}: {cleanup_error}")
        if error is exc:
            raise exc
        raise error from exc

    def _check_output(self, info: SessionInfo, request: RolloutRequest,
                      output: object) -> tuple[int, int]:
        where = f"session {info.session_id!r} block {request.block_index}: BlockOutput"
        if not isinstance(output, BlockOutput):
            raise BlockOutputError(f"{where} expected, got {type(output).__name__}")
        size = output.check(where)
        if info.frame_size is not None and size != info.frame_size:
            raise BlockOutputError(f"{where}.frames are {size[0]}x{size[1]} (HxW); earlier "
                                   f"blocks of this session were {info.frame_size[0]}x"
                                   f"{info.frame_size[1]}")
        return size

    # -- the one release path ----------------------------------------------------
    def _release(self, session_id: str, why: Release) -> None:
        errors = self._release_steps(session_id, why)
        if errors:
            raise PipelineError(f"releasing session {session_id!r} ({why.value}): "
                                f"{type(errors[0]).__name__}: {errors[0]}") from errors[0]

    def _release_steps(self, session_id: str, why: Release) -> list[BaseException]:
        """Release KV and model state; every step runs, errors are collected."""
        errors: list[BaseException] = []
        if self.cache.has_session(session_id):
            try:
                self.cache.release_session(session_id)
            except Exception as exc:
                errors.append(exc)
        hook = (self.pipeline.reset_ar_diffusion_session if why is Release.RESET
                else self.pipeline.close_ar_diffusion_session)
        try:
            hook(session_id)
        except (Exception, SystemExit) as exc:  # a hook that calls exit() is a failing hook
            errors.append(exc)
        finally:  # a Ctrl-C in the hook must not leave the map naming a released session
            if session_id in self.sessions:
                self.sessions.remove(session_id, why)
        return errors

    def close_session(self, session_id: str) -> None:
        """Close a resident session now (its close hook runs)."""
        if session_id not in self.sessions:
            raise SessionError(f"session {session_id!r} is not resident")
        self._release(session_id, Release.CLOSED)

    def close(self) -> None:
        """Close every session. Safe to call twice; cleanup errors are raised after all ran."""
        if self._closed:
            return
        self._closed = True
        errors = [e for sid in self.sessions.session_ids
                  for e in self._release_steps(sid, Release.CLOSED)]
        if errors:
            raise PipelineError(f"closing the runner: {type(errors[0]).__name__}: "
                                f"{errors[0]}") from errors[0]

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise SessionError("the runner is closed; build a new one")

    # -- warmup -------------------------------------------------------------------
    def warmup(self) -> WarmupReport:
        """Run `ar_diffusion_warmup_requests(WARMUP_SESSION_ID)` on a free slot, then release it.

        Raises `SessionError` when every slot holds a user's session (warmup never
        evicts one) and `WarmupError` if a request raised or carried another
        session id. A leak (pages not given back) is reported in `leaked_pages`;
        callers decide how loud it is.
        """
        self._check_open()
        make_requests = getattr(self.pipeline, "ar_diffusion_warmup_requests", None)
        if not callable(make_requests):
            return WarmupReport(skipped_reason="the pipeline declares no warmup requests "
                                               "(SupportsARDiffusionWarmup)")
        if self.sessions.is_full:
            raise SessionError(f"warmup needs a free session slot and all "
                               f"{self.sessions.capacity} hold sessions; warmup never evicts "
                               f"one: run it before opening sessions, or close one first")
        report = WarmupReport(pages_in_use_before=self.cache.stats().pages_in_use)
        start = time.perf_counter()
        try:
            try:
                for request in make_requests(WARMUP_SESSION_ID):
                    self._check_warmup_request(request)
                    report.latencies_s.append(self._run(request).latency_s)
            finally:
                if WARMUP_SESSION_ID in self.sessions:
                    self._release(WARMUP_SESSION_ID, Release.CLOSED)
        except Exception as exc:  # a request or the release of its session
            raise WarmupError(f"warmup failed: {type(exc).__name__}: {exc}") from exc
        report.total_s = time.perf_counter() - start
        report.pages_in_use_after = self.cache.stats().pages_in_use
        self.warmup_latencies_s.extend(report.latencies_s)
        return report

    @staticmethod
    def _check_warmup_request(request: object) -> None:
        if not isinstance(request, RolloutRequest):
            raise SessionError(f"ar_diffusion_warmup_requests yielded a "
                               f"{type(request).__name__}; yield RolloutRequest objects")
        if request.session_id != WARMUP_SESSION_ID:
            raise SessionError(f"a warmup request carries session_id {request.session_id!r}; "
                               f"ar_diffusion_warmup_requests(session_id) must yield requests "
                               f"with the session_id it is given ({WARMUP_SESSION_ID!r})")

    def stats(self) -> RunnerStats:
        return RunnerStats([seconds(latency) for latency in self.block_latencies_s],
                           list(self.warmup_latencies_s),
                           self.sessions.counts.as_dict(), self.cache.stats(),
                           dict(sorted(self.batch_sizes.items())))

