"""What `inspect-spec` reports: the pipeline's spec, the effective window and the memory plan.

A dry run: the pipeline is built (cheap, no weights) but its `load` hook is
never called and nothing is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ardiff.config import RunConfig
from ardiff.device import free_memory_bytes, resolve_device
from ardiff.errors import ConfigError
from ardiff.kv.plan import KVPlan, make_plan
from ardiff.loader import build_pipeline, get_spec
from ardiff.spec import ARDiffusionKVCacheSpec, apply_overrides, spec_to_dict


@dataclass(frozen=True)
class SpecReport:
    """The declared spec, the effective one (overrides applied) and its plan."""

    declared: ARDiffusionKVCacheSpec
    plan: KVPlan

    @property
    def effective(self) -> ARDiffusionKVCacheSpec:
        return self.plan.spec

    @property
    def visible_frames_per_block(self) -> int:
        """Frames a block attends to once the window is full (sink + past + itself)."""
        s = self.effective
        return s.sink_frames + max(0, s.window_frames - s.frames_per_block) + s.frames_per_block

    def to_dict(self) -> dict[str, Any]:
        eff = self.effective
        return {
            "spec": spec_to_dict(self.declared),
            "effective": {
                "window_frames": eff.window_frames,
                "sink_frames": eff.sink_frames,
                "page_tokens": self.plan.page_tokens,
                "pages_per_frame": self.plan.pages_per_frame,
                "dtype": self.plan.dtype,
            },
            "memory": self.plan.to_dict(),
        }


def effective_spec(config: RunConfig, declared: ARDiffusionKVCacheSpec) -> ARDiffusionKVCacheSpec:
    kv = config.runtime.kv
    return apply_overrides(declared, window_frames=kv.window_frames, sink_frames=kv.sink_frames)


def plan_for(config: RunConfig, spec: ARDiffusionKVCacheSpec, free_bytes: int,
             stores_registers: bool = True) -> KVPlan:
    """The plan for an effective spec under the config's budget, given the free memory."""
    runtime = config.runtime
    return make_plan(spec, runtime.dtype, runtime.dtype_bytes,
                     runtime.memory_budget.resolve(free_bytes),
                     page_tokens=runtime.kv.page_tokens, max_sessions=runtime.max_sessions,
                     stores_registers=stores_registers)


def inspect_spec(config: RunConfig) -> SpecReport:
    """Build the pipeline (no `load`), validate its spec and plan it; allocate nothing."""
    pipeline = build_pipeline(config.pipeline, config.base_dir)
    declared = get_spec(pipeline)
    spec = effective_spec(config, declared)
    return SpecReport(declared, plan_for(config, spec, _free_bytes_for_dry_run(config)))


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
