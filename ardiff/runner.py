"""The runner: owns the pipeline, the KV cache and the sessions (DESIGN §5).

    Runner.from_config(config)   build the pipeline, call its load(device, dtype),
                                 measure free memory, plan, allocate the cache
    runner.warmup()              the pipeline's warmup requests on a reserved session
    runner.execute(request)      one AR block of one session -> BlockOutput
    runner.stats()               latencies, session counts, pages; it never prints

One release path serves reset, close, LRU eviction and failure: it releases
the session's KV (pages, cross-attention K/V) and calls the pipeline's hook,
running every step even when one raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ardiff.config import RunConfig
from ardiff.device import free_memory_bytes, resolve_device
from ardiff.errors import (ArdiffError, BlockOutputError, CapacityError, PipelineError,
                           SessionError, WarmupError)
from ardiff.inspect import effective_spec, plan_for
from ardiff.kv.base import CacheStats, KVCacheBase
from ardiff.kv.cache import create_cache
from ardiff.kv.plan import KVPlan
from ardiff.kv.state import KVState
from ardiff.kv.storage import TORCH_DTYPES
from ardiff.loader import build_pipeline, get_spec
from ardiff.request import BlockOutput, RolloutRequest
from ardiff.sizes import format_bytes
from ardiff.sessions import Release, SessionInfo, SessionMap

WARMUP_SESSION_ID = "__ardiff_warmup__"


@contextlib.contextmanager
def bind_ar_diffusion_state(cache: KVCacheBase, session_id: str) -> Iterator[KVState]:
    """A KV state for one forward; it is closed (unusable) when the bind ends."""
    state = cache.open_state(session_id)
    try:
        yield state
    finally:
        cache.forget_state(state)


def _allocate(plan: KVPlan, backend: str, device: str, poison: bool) -> KVCacheBase:
    """The cache; a budget the device cannot actually provide is a capacity error (exit 3)."""
    try:
        return create_cache(plan, backend, device, poison)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "alloc" not in str(exc).lower():
            raise
        raise CapacityError(
            f"runtime.memory_budget: allocating the KV cache ({format_bytes(plan.total_bytes)} "
            f"for {plan.session_capacity} session(s)) on {device} failed "
            f"({type(exc).__name__}); lower runtime.memory_budget or runtime.max_sessions "
            f"to what the device really has") from exc


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
    """Numbers the runner keeps: one latency per AR block, sessions and pages."""

    block_latencies_s: list[float]
    warmup_latencies_s: list[float]
    sessions: dict[str, int]
    cache: CacheStats


class Runner:
    """Serves `execute(request)` over one pipeline and one KV cache."""

    def __init__(self, pipeline: Any, cache: KVCacheBase, device: str = "cpu") -> None:
        self.pipeline, self.cache, self.device = pipeline, cache, torch.device(device)
        self.plan: KVPlan = cache.plan
        self.sessions = SessionMap(cache.capacity, frozenset({WARMUP_SESSION_ID}))
        self.block_latencies_s: list[float] = []
        self.warmup_latencies_s: list[float] = []
        self._closed = False

    @classmethod
    def from_config(cls, config: RunConfig) -> Runner:
        """Build, load, measure, plan and allocate, in that order (DESIGN §2, §4)."""
        return cls.from_pipeline(build_pipeline(config.pipeline, config.base_dir), config)

    @classmethod
    def from_pipeline(cls, pipeline: Any, config: RunConfig, load_weights: bool = True) -> Runner:
        """Load a built pipeline, then plan and allocate its cache under the config's budget.

        `load_weights=False` skips the `load` hook, for a pipeline another runner loaded.
        """
        spec = effective_spec(config, get_spec(pipeline))
        device = resolve_device(config.runtime.device)
        load = getattr(pipeline, "load", None)
        if load_weights and callable(load):
            try:
                load(device, TORCH_DTYPES[config.runtime.dtype])
            except ArdiffError:
                raise
            except Exception as exc:
                raise PipelineError(f"pipeline: load({device!r}, {config.runtime.dtype}) raised "
                                    f"{type(exc).__name__}: {exc}") from exc
        kv = config.runtime.kv
        plan = plan_for(config, spec, free_memory_bytes(device),
                        stores_registers=kv.backend == "paged")
        return cls(pipeline, _allocate(plan, kv.backend, device, kv.poison), device)

    # -- serving ---------------------------------------------------------------
    def execute(self, request: RolloutRequest) -> BlockOutput:
        """Run one AR block. Any exception releases the session (fail-closed), then propagates."""
        if request.session_id == WARMUP_SESSION_ID:
            raise SessionError(f"session id {WARMUP_SESSION_ID!r} is reserved for warmup; "
                               f"use another session_id")
        output, latency = self._run(request)
        self.block_latencies_s.append(latency)
        return output

    def _run(self, request: RolloutRequest) -> tuple[BlockOutput, float]:
        self._check_open()
        sid = request.session_id
        if request.reset and sid in self.sessions:
            self._release(sid, Release.RESET)
        info = self._admit(sid)
        if request.clear_cross_kv:
            for branch in self.cache.spec.branches:
                self.cache.cross.clear(sid, branch.name)
        start = time.perf_counter()
        try:
            with bind_ar_diffusion_state(self.cache, sid) as state:
                output = self.pipeline.generate_block(request, state)
                self._synchronize()
            self._check_output(info, request, output)
        except BaseException as exc:
            self._fail(sid, request, exc)
        latency = time.perf_counter() - start
        info.blocks += 1
        if request.close_session:
            self._release(sid, Release.CLOSED)
        return output, latency

    def _admit(self, session_id: str) -> SessionInfo:
        if session_id not in self.sessions and self.sessions.is_full:
            self._release(self.sessions.least_recently_used(), Release.EVICTED)
        return self.sessions.touch(session_id)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _fail(self, session_id: str, request: RolloutRequest, exc: BaseException) -> None:
        cleanup_errors = self._release_steps(session_id, Release.FAILED)
        if isinstance(exc, (ArdiffError, KeyboardInterrupt)) or not isinstance(exc, Exception):
            error = exc
        else:
            error = PipelineError(f"session {session_id!r} block {request.block_index}: "
                                  f"generate_block raised {type(exc).__name__}: {exc}")
        for cleanup_error in cleanup_errors:  # on the error that propagates, not its cause
            if hasattr(error, "add_note"):
                error.add_note(f"while releasing session {session_id!r}: "
                               f"{type(cleanup_error).__name__}: {cleanup_error}")
        if error is exc:
            raise exc
        raise error from exc

    def _check_output(self, info: SessionInfo, request: RolloutRequest, output: Any) -> None:
        where = f"session {info.session_id!r} block {request.block_index}: BlockOutput"
        if not isinstance(output, BlockOutput):
            raise BlockOutputError(f"{where} expected, got {type(output).__name__}")
        frames = output.frames
        if not isinstance(frames, torch.Tensor):
            raise BlockOutputError(f"{where}.frames is a {type(frames).__name__}; expected a "
                                   f"uint8 tensor [F, H, W, 3]")
        if frames.dtype != torch.uint8:
            raise BlockOutputError(f"{where}.frames is {frames.dtype}; expected torch.uint8 "
                                   f"(decode and clamp to 0..255)")
        if frames.dim() != 4 or frames.shape[-1] != 3 or min(frames.shape[:3]) == 0:
            raise BlockOutputError(f"{where}.frames has shape {tuple(frames.shape)}; expected "
                                   f"[F > 0, H > 0, W > 0, 3]")
        size = (int(frames.shape[1]), int(frames.shape[2]))
        if info.frame_size is not None and size != info.frame_size:
            raise BlockOutputError(f"{where}.frames are {size[0]}x{size[1]} (HxW); earlier "
                                   f"blocks of this session were {info.frame_size[0]}x"
                                   f"{info.frame_size[1]}")
        info.frame_size = size

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
        except Exception as exc:
            errors.append(exc)
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

    def _check_open(self) -> None:
        if self._closed:
            raise SessionError("the runner is closed; build a new one")

    # -- warmup -------------------------------------------------------------------
    def warmup(self) -> WarmupReport:
        """Run the pipeline's warmup requests on a reserved session, then release it.

        Raises `WarmupError` if a request raised. A leak (pages not given back)
        is reported in `leaked_pages`; callers decide how loud it is.
        """
        make_requests = getattr(self.pipeline, "ar_diffusion_warmup_requests", None)
        if not callable(make_requests):
            return WarmupReport(skipped_reason="the pipeline declares no warmup requests "
                                               "(SupportsARDiffusionWarmup)")
        report = WarmupReport(pages_in_use_before=self.cache.stats().pages_in_use)
        start = time.perf_counter()
        try:
            try:
                for request in make_requests():
                    request = dataclasses.replace(request, session_id=WARMUP_SESSION_ID)
                    _output, latency = self._run(request)
                    report.latencies_s.append(latency)
            finally:
                if WARMUP_SESSION_ID in self.sessions:
                    self._release(WARMUP_SESSION_ID, Release.CLOSED)
        except Exception as exc:  # a request or the release of its session
            raise WarmupError(f"warmup failed: {type(exc).__name__}: {exc}") from exc
        report.total_s = time.perf_counter() - start
        report.pages_in_use_after = self.cache.stats().pages_in_use
        self.warmup_latencies_s.extend(report.latencies_s)
        return report

    def stats(self) -> RunnerStats:
        return RunnerStats(list(self.block_latencies_s), list(self.warmup_latencies_s),
                           self.sessions.counts.as_dict(), self.cache.stats())
