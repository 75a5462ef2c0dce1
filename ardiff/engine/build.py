"""The one build path of every command: config -> pipeline + spec -> plan -> cache -> runner.

    resolved = resolve(config)            build the pipeline (cheap, no weights), validate its
                                          spec, apply the runtime overrides
    report = inspect_spec(config)         the first half only: resolve, then a dry-run plan
                                          beside the weights (placement.py)
    runner = build_runner(config)         resolve, place the weights, load(device, dtype),
                                          measure free memory,
                                          check the budget fits in it, plan, allocate: in
                                          that order (docs/design.md#4-memory)

`inspect-spec` never calls `load` and allocates nothing; `rollout`, `warmup`
and `bench` build their runners here, so the effective spec and the plan are
computed once, one way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ardiff.config.run import RunConfig
from ardiff.contract import ARDiffusionPipeline
from ardiff.contract.spec import (
    ARDiffusionKVCacheSpec,
    apply_overrides,
    history_frames_per_branch,
    spec_to_dict,
)
from ardiff.distributed.context import ParallelContext, bind_parallel, check_cfg_spec
from ardiff.distributed.topology import rank_budget
from ardiff.dtypes import DTYPE_BYTES, torch_dtype
from ardiff.engine.device import assumed_device, free_memory_bytes, resolve_device, resolve_dtype
from ardiff.engine.loader import args_base_note, build_pipeline, get_spec
from ardiff.engine.placement import (
    MemoryFit,
    WeightPlan,
    activation_margin,
    fits_in,
    get_weight_bytes,
    place_weights,
)
from ardiff.errors import ArdiffError, CapacityError, ConfigError, PipelineError
from ardiff.kv.backends import BACKENDS
from ardiff.kv.plan import KVPlan, make_plan
from ardiff.sizes import MemoryBudget, format_bytes
from ardiff.text import shorten

if TYPE_CHECKING:  # pragma: no cover - typing only: both import torch, which inspect-spec must not
    from ardiff.engine.runner import Runner
    from ardiff.kv.backend import KVCacheBase


@dataclass(frozen=True)
class ResolvedPipeline:
    """A built (not loaded) pipeline with its declared and effective specs."""

    config: RunConfig
    pipeline: ARDiffusionPipeline
    declared: ARDiffusionKVCacheSpec
    spec: ARDiffusionKVCacheSpec  # runtime overrides applied
    context: ParallelContext | None = None  # CFG-parallel: the rank's (group None: a dry one)

    def plan(self, free_bytes: int, dtype: str, stores_registers: bool = True,
             batch_rows: int = 1) -> KVPlan:
        """The plan for the effective spec under the config's budget, given the free memory
        and the resolved dtype (`resolve_dtype`: never `auto`). `batch_rows`: the most
        sessions of one batched forward (a block in flight each), fewer where the budget
        would then keep fewer sessions than rows (never below 1)."""
        runtime = self.config.runtime

        def plan_for(rows: int) -> KVPlan:
            return make_plan(self.spec, dtype, DTYPE_BYTES[dtype],
                             runtime.memory_budget.resolve(free_bytes),
                             page_tokens=runtime.kv.page_tokens,
                             max_sessions=runtime.max_sessions,
                             stores_registers=stores_registers, batch_rows=rows)

        def holds(rows: int) -> bool:  # fewer rows never hold fewer sessions
            try:
                return plan_for(rows).session_capacity >= rows
            except CapacityError:
                return False

        if batch_rows == 1 or holds(batch_rows):
            return plan_for(batch_rows)
        low, high = 1, batch_rows - 1  # the most rows that still hold as many sessions
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if holds(middle) else (low, middle - 1)
        return plan_for(low)


def resolve(config: RunConfig, pipeline: ARDiffusionPipeline | None = None,
            parallel: ParallelContext | None = None) -> ResolvedPipeline:
    """Build the config's pipeline (or take `pipeline`), validate its spec, apply overrides.

    Under `runtime.parallel.cfg: 2` the pipeline gets its CFG-parallel context first
    (`parallel`, or a dry one for rank 0), so its spec is the one a rank runs."""
    if pipeline is None:
        pipeline = build_pipeline(config.pipeline, config.base_dir)
    cfg = config.runtime.parallel.cfg
    parallel = bind_parallel(pipeline, cfg, parallel)
    declared = get_spec(pipeline)
    check_cfg_spec(declared, cfg, config.rollout.guidance_scale)
    kv = config.runtime.kv
    spec = apply_overrides(declared, window_frames=kv.window_frames, sink_frames=kv.sink_frames)
    return ResolvedPipeline(config, pipeline, declared, spec, parallel)


# -- the first half: what `inspect-spec` reports ----------------------------------------------

@dataclass(frozen=True)
class SpecReport:
    """The declared spec, the effective one (overrides applied) and its plan; the weights
    and whether they fit beside it, where the pipeline and the device memory say."""

    declared: ARDiffusionKVCacheSpec
    plan: KVPlan              # one rank's, in a parallel job
    device: str = "cpu"       # the device the plan assumes (runtime.device, auto resolved)
    workers: int = 1          # runtime.parallel: data-parallel replicas...
    cfg: int = 1              # ... of this many ranks each
    weights: WeightPlan | None = None  # None: the pipeline declares no weight_bytes
    fit: MemoryFit | None = None       # None: the memory or the weights are not known
    model_layout: str | None = None    # the pipeline's `model_layout`, when it names one

    @property
    def num_ranks(self) -> int:
        return self.workers * self.cfg

    @property
    def effective(self) -> ARDiffusionKVCacheSpec:
        return self.plan.spec

    @property
    def visible_frames_per_block(self) -> int:
        """Frames a block attends to once the window is full (sink + past + itself)."""
        return history_frames_per_branch(self.effective) + self.effective.frames_per_block

    def to_dict(self) -> dict[str, Any]:
        """The `inspect-spec --json` object; `parallel` only when runtime.parallel asks for
        several ranks (then `memory` is one rank's plan), `weights` only for a pipeline
        that declares them (`weights_declared`), `fit` only when the device's memory and
        the weights are both known."""
        eff = self.effective
        parallel = {"parallel": {"workers": self.workers, "cfg": self.cfg,
                                 "ranks": self.num_ranks,
                                 "per_rank_bytes": self.plan.total_bytes,
                                 "total_bytes": self.num_ranks * self.plan.total_bytes}}
        return {
            "spec": spec_to_dict(self.declared),
            "effective": {
                "window_frames": eff.window_frames,
                "sink_frames": eff.sink_frames,
                "page_tokens": self.plan.page_tokens,
                "pages_per_frame": self.plan.pages_per_frame,
                "dtype": self.plan.dtype,
                "device": self.device,
            },
            "memory": self.plan.to_dict(),
            **(parallel if self.num_ranks > 1 else {}),
            "weights_declared": self.weights is not None,
            **({"weights": self.weights.to_dict()} if self.weights is not None else {}),
            **({"fit": self.fit.to_dict()} if self.fit is not None else {}),
            **({"model_layout": self.model_layout} if self.model_layout is not None else {}),
        }


def inspect_spec(config: RunConfig, device_memory: int | None = None) -> SpecReport:
    """Build the pipeline (no `load`), validate its spec and plan it; allocate nothing.

    With the pipeline's weights (`weight_bytes`) and the device's memory (`device_memory`,
    else its free memory now if the device is on this machine) it also places the weights
    as a run would and says whether weights + KV plan + margin fit."""
    parallel = config.runtime.parallel
    resolved = resolve(config)
    runtime = config.runtime
    share = rank_budget(runtime.memory_budget, runtime.device, parallel.world_size)
    if share != runtime.memory_budget:  # ranks on one host share its memory
        resolved = dataclasses.replace(resolved, config=dataclasses.replace(
            config, runtime=dataclasses.replace(runtime, memory_budget=share)))
    device = assumed_device(runtime.device)
    dtype = resolve_dtype(runtime.dtype, device)
    registers = stores_registers(config, config.runtime.kv.backend)
    parts = get_weight_bytes(resolved.pipeline, dtype)
    if parts is None:  # weights not declared: no fit verdict, whatever the device's memory
        device_memory = None
    memory = device_memory if device_memory is not None or parts is None else (
        _measured_memory(config.runtime.device))
    fits = None if memory is None else _fits(resolved, memory, dtype, registers, device)
    weights = None if parts is None else place_weights(resolved.pipeline, parts, device, fits)
    on_device = 0 if weights is None else weights.device_bytes
    free = _free_bytes_for_dry_run(config) if memory is None else max(memory - on_device, 0)
    plan = resolved.plan(free, dtype, registers)
    margin = activation_margin(resolved.pipeline, dtype, device)(on_device)
    fit = None if memory is None else MemoryFit(memory, on_device, plan.total_bytes, margin)
    layout = getattr(resolved.pipeline, "model_layout", None)  # e.g. causal-Wan's folder
    return SpecReport(resolved.declared, plan, device, parallel.workers, parallel.cfg,
                      weights, fit, layout if isinstance(layout, str) else None)


def _fits(resolved: ResolvedPipeline, memory_bytes: int, dtype: str, registers: bool,
          device: str, batch_rows: int = 1) -> Callable[[int], bool]:
    """`fits_in` with the KV plan the run would make from the memory the weights leave and
    the pipeline's activation margin on `device`."""
    return fits_in(memory_bytes, lambda free: resolved.plan(
        free, dtype, registers, batch_rows=batch_rows).total_bytes,
        activation_margin(resolved.pipeline, dtype, device))


def _measured_memory(device: str) -> int | None:
    """The device's free memory now, or None when it is not on this machine, or when torch is
    not imported yet: inspect-spec imports it only if the pipeline's module does."""
    import sys

    if "torch" not in sys.modules:
        return None
    try:
        return free_memory_bytes(resolve_device(device))
    except ConfigError:
        return None


def stores_registers(config: RunConfig, backend: str) -> bool:
    """Whether the cache keeps register tokens in pages: a backend that says so, under
    `runtime.compile` (the paged cache, whose `ardiff::paged_attend` reads nothing but
    pages; the eager paths and the dense cache concatenate them as they come)."""
    return config.runtime.compile and BACKENDS[backend].pages_registers_when_compiled


def _free_bytes_for_dry_run(config: RunConfig) -> int:
    budget = config.runtime.memory_budget
    if budget.num_bytes is not None:
        return budget.num_bytes  # not used: a byte budget needs no measurement
    device = config.runtime.device
    if device != "cpu":
        try:
            device = resolve_device(device)
        except ConfigError as exc:
            raise ConfigError(f"runtime.memory_budget: {budget} needs the device's free memory, "
                              f"but {exc}; or give bytes for a dry run, e.g. --budget 80GiB") from exc
    return free_memory_bytes(device)


# -- the second half: load, measure, plan, allocate -------------------------------------------

def build_runner(config: RunConfig, resolved: ResolvedPipeline | None = None,
                 load_weights: bool = True, backend: str | None = None,
                 agree_min: Callable[[int], int] | None = None, batch_rows: int = 1) -> Runner:
    """A ready `Runner` for the config: load the pipeline, then plan and allocate its cache.

    `resolved` reuses a pipeline already built by `resolve`; `load_weights=False`
    skips the `load` hook (for a pipeline another runner loaded); `backend`
    overrides `runtime.kv.backend` (bench runs both); `agree_min` makes the session
    capacity the minimum over a parallel job's ranks (so their LRU decisions match);
    `batch_rows`: the most sessions one batched forward runs (the plan holds their blocks)."""
    from ardiff.engine.runner import Runner  # torch is imported only when a runner is built

    resolved = resolved or resolve(config)
    _check_ranks(resolved)
    device = resolve_device(config.runtime.device)
    dtype = resolve_dtype(config.runtime.dtype, device)
    if load_weights:
        _place_weights(resolved, device, dtype, stores_registers(config, backend or
                                                                 config.runtime.kv.backend),
                       batch_rows)
        _load(resolved.pipeline, device, dtype)
    if config.runtime.compile:
        compile_layers(resolved.pipeline, config.pipeline.entry)
    kv = config.runtime.kv
    backend = backend or kv.backend
    free_bytes = free_memory_bytes(device)
    check_budget_fits(config.runtime.memory_budget, free_bytes, device)
    plan = resolved.plan(free_bytes, dtype, stores_registers=stores_registers(config, backend),
                         batch_rows=batch_rows)
    if agree_min is not None:
        plan = dataclasses.replace(plan, session_capacity=agree_min(plan.session_capacity))
    return Runner(resolved.pipeline, _allocate(plan, backend, device, kv.poison), device)


def _place_weights(resolved: ResolvedPipeline, device: str, dtype: str,
                   registers: bool, batch_rows: int) -> None:
    """Before `load`: a pipeline with `place_weights` (and `weight_bytes`) chooses where its
    parts go, knowing what fits in the device's free memory beside the KV plan."""
    if not callable(getattr(resolved.pipeline, "place_weights", None)):
        return
    parts = get_weight_bytes(resolved.pipeline, dtype)
    if parts is not None:
        fits = _fits(resolved, free_memory_bytes(device), dtype, registers, device, batch_rows)
        place_weights(resolved.pipeline, parts, device, fits)


def _check_ranks(resolved: ResolvedPipeline) -> None:
    """A CFG-parallel pipeline runs one branch: only inside a rank, whose peer has the other."""
    context = resolved.context
    if context is not None and context.group is None:
        raise ConfigError(f"runtime.parallel.cfg: {context.world_size} runs one CFG branch per "
                          f"rank, and this command runs one process; use `ardiff rollout` "
                          f"(it starts the ranks) or set runtime.parallel.cfg: 1")


def check_budget_fits(budget: MemoryBudget, free_bytes: int, device: str) -> None:
    """Raise `CapacityError` (exit 3) for a byte budget above what `device` has free.

    The plan never exceeds the budget, so with this check nothing is allocated that the
    device does not have, however many sessions the spec allows (a fraction of free
    memory always fits)."""
    if budget.num_bytes is not None and budget.num_bytes > free_bytes:
        free = format_bytes(free_bytes, round_down=True)  # a limit the user may copy
        raise CapacityError(
            f"runtime.memory_budget: {budget} is more than the {free} free on {device}; lower "
            f"runtime.memory_budget to at most {free} or give a fraction of free memory like 0.8")


def compile_layers(pipeline: ARDiffusionPipeline, entry: str) -> None:
    """`runtime.compile`: hand `torch.compile` to the pipeline's `compile_layers` hook, which
    compiles its layer stack (attention inside stays one `ardiff::paged_attend` op)."""
    hook = getattr(pipeline, "compile_layers", None)
    if not callable(hook):
        raise ConfigError(f"runtime.compile: true needs a pipeline with a compile_layers("
                          f"compiler) method, and {shorten(entry, 80)} has none; set "
                          f"runtime.compile: false")
    import torch

    import ardiff.kv.ops  # noqa: F401  registers ardiff::paged_attend before anything traces

    try:
        hook(torch.compile)
    except ArdiffError:
        raise
    except Exception as exc:
        raise PipelineError(f"pipeline: compile_layers raised {type(exc).__name__}: "
                            f"{shorten(str(exc))}") from exc


def shutdown_compile_threads() -> None:
    """End the threads Inductor keeps for compiling (a pool it never shuts down itself), once
    no runner compiles any more: a command must not end with threads of ours running."""
    import sys

    module = sys.modules.get("torch._inductor.async_compile")
    if module is None:  # nothing was compiled
        return
    pool = module.AsyncCompile.pool
    if pool.cache_info().currsize:
        pool().shutdown(wait=True)
        pool.cache_clear()
    module.shutdown_compile_workers()


def _load(pipeline: ARDiffusionPipeline, device: str, dtype: str) -> None:
    load = getattr(pipeline, "load", None)
    if not callable(load):
        return
    try:
        load(device, torch_dtype(dtype))
    except ArdiffError:
        raise
    except Exception as exc:
        raise PipelineError(f"pipeline: load({device!r}, {dtype}) raised "
                            f"{type(exc).__name__}: {shorten(str(exc))}"
                            f"{args_base_note(exc)}") from exc


def _allocate(plan: KVPlan, backend: str, device: str, poison: bool) -> KVCacheBase[Any]:
    """The cache; a budget the device cannot actually provide is a capacity error (exit 3)."""
    import torch

    from ardiff.kv.backend import create_cache  # imports torch: inspect-spec must not

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
