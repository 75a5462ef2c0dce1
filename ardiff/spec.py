"""The KV-cache spec a pipeline declares, and the protocols it implements.

A pipeline *declares* its KV geometry with an `ARDiffusionKVCacheSpec`; ardiff
plans, allocates and manages the cache from it. The spec is the single source
of shapes: every size in ardiff is derived from it (or from the plan built on
it). All types are frozen dataclasses validated on construction; an invalid
value raises `SpecError` naming the field and the value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ardiff.errors import SpecError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.request import BlockOutput, RolloutRequest

# The most frame positions a spec may declare when it does not say: large
# enough for any practical rollout, small enough to be an honest bound.
DEFAULT_MAX_MODEL_LEN = 1_000_000


def _require(cond: bool, field_name: str, value: Any, rule: str) -> None:
    if not cond:
        raise SpecError(f"spec.{field_name}: {value!r} is invalid; it must be {rule}")


def _require_name(value: Any, field_name: str) -> None:
    _require(isinstance(value, str) and value.strip() != "", field_name, value, "a non-empty string")


def _require_int(value: Any, field_name: str, minimum: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, field_name, value, "an integer > 0" if minimum == 1 else f"an integer >= {minimum}")


@dataclass(frozen=True)
class ARDiffusionKVBranchSpec:
    """One logical KV stream of a session (`main`, or `positive`/`negative` for CFG).

    `local_index` is the storage slot of the branch on this worker. Two logical
    branches may share a slot (e.g. CFG branches split across workers), but one
    session may then use only one of them on this worker.
    """

    name: str = "main"
    local_index: int = 0

    def __post_init__(self) -> None:
        _require_name(self.name, "branches[].name")
        _require_int(self.local_index, f"branches[{self.name}].local_index", 0)


@dataclass(frozen=True)
class ARDiffusionCrossAttentionKVSpec:
    """A cross-attention K/V cache (e.g. the prompt's text tokens), per session and branch.

    Its K and V are `[num_tokens, num_kv_heads, head_size]` per layer, with the
    heads and head size of the enclosing spec.
    """

    name: str
    num_tokens: int

    def __post_init__(self) -> None:
        _require_name(self.name, "cross_attention[].name")
        _require_int(self.num_tokens, f"cross_attention[{self.name}].num_tokens", 1)


@dataclass(frozen=True)
class ARDiffusionKVCacheSpec:
    """The KV geometry of a block-causal video diffusion pipeline.

    Positions (`max_model_len`) and the window (`window_frames`,
    `sink_frames`) count latent frames. A block attends to the first
    `sink_frames` frames, the most recent `window_frames - frames_per_block`
    other frames and itself (DESIGN §3).
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    tokens_per_frame: int
    frames_per_block: int
    window_frames: int
    sink_frames: int = 0
    reset_at_boundary: bool = False
    session_capacity: int = 1
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    branches: tuple[ARDiffusionKVBranchSpec, ...] = (ARDiffusionKVBranchSpec(),)
    cross_attention: tuple[ARDiffusionCrossAttentionKVSpec, ...] = ()
    max_scratch_tokens_per_branch: int = 0
    model_owned_state_bytes_per_session: int = 0

    def __post_init__(self) -> None:
        # Accept lists from callers; store tuples so the spec stays hashable.
        for name, item_type in (("branches", "ARDiffusionKVBranchSpec"),
                                ("cross_attention", "ARDiffusionCrossAttentionKVSpec")):
            value = getattr(self, name)
            _require(isinstance(value, (list, tuple)), name, value, f"a list of {item_type}")
            object.__setattr__(self, name, tuple(value))
        for name in ("num_layers", "num_kv_heads", "head_size", "tokens_per_frame",
                     "frames_per_block", "window_frames", "session_capacity", "max_model_len"):
            _require_int(getattr(self, name), name, 1)
        for name in ("sink_frames", "max_scratch_tokens_per_branch",
                     "model_owned_state_bytes_per_session"):
            _require_int(getattr(self, name), name, 0)
        _require(isinstance(self.reset_at_boundary, bool), "reset_at_boundary",
                 self.reset_at_boundary, "true or false")
        self._validate_branches()
        self._validate_cross_attention()

    def _validate_branches(self) -> None:
        _require(len(self.branches) > 0, "branches", list(self.branches), "at least one branch")
        for branch in self.branches:
            _require(isinstance(branch, ARDiffusionKVBranchSpec), "branches", branch,
                     "a list of ARDiffusionKVBranchSpec")
        names = [b.name for b in self.branches]
        _require(len(set(names)) == len(names), "branches", names, "unique branch names")
        indices = sorted({b.local_index for b in self.branches})
        _require(indices == list(range(len(indices))), "branches[].local_index", indices,
                 "exactly 0..max with no gap")

    def _validate_cross_attention(self) -> None:
        for cache in self.cross_attention:
            _require(isinstance(cache, ARDiffusionCrossAttentionKVSpec), "cross_attention",
                     cache, "a list of ARDiffusionCrossAttentionKVSpec")
        names = [c.name for c in self.cross_attention]
        _require(len(set(names)) == len(names), "cross_attention", names,
                 "unique cross-attention names")

    @property
    def num_local_kv_branches(self) -> int:
        """Storage slots this worker needs: one per distinct `local_index`."""
        return max(b.local_index for b in self.branches) + 1

    @property
    def num_logical_branches(self) -> int:
        return len(self.branches)

    @property
    def cross_attention_lengths(self) -> dict[str, int]:
        """Cross-attention cache name -> number of tokens."""
        return {c.name: c.num_tokens for c in self.cross_attention}

    @property
    def history_frames_per_branch(self) -> int:
        """Frames a branch must keep: the sink plus what the window shows of the past."""
        return self.sink_frames + max(0, self.window_frames - self.frames_per_block)

    def get_branch(self, name: str) -> ARDiffusionKVBranchSpec:
        for branch in self.branches:
            if branch.name == name:
                return branch
        known = ", ".join(b.name for b in self.branches)
        raise SpecError(f"branch {name!r} is not declared by the spec; declared: {known}")


@runtime_checkable
class SupportsARDiffusionPipeline(Protocol):
    """What a pipeline must implement to be run by ardiff (DESIGN §2)."""

    def get_ar_diffusion_kv_cache_spec(self) -> ARDiffusionKVCacheSpec: ...

    def generate_block(self, request: RolloutRequest, state: Any) -> BlockOutput: ...

    def reset_ar_diffusion_session(self, session_id: str) -> None: ...

    def close_ar_diffusion_session(self, session_id: str) -> None: ...


@runtime_checkable
class SupportsARDiffusionWarmup(Protocol):
    """Optional: requests that exercise every shape the pipeline will run."""

    def ar_diffusion_warmup_requests(self) -> list[RolloutRequest]: ...


PIPELINE_METHODS = ("get_ar_diffusion_kv_cache_spec", "generate_block",
                    "reset_ar_diffusion_session", "close_ar_diffusion_session")


def missing_pipeline_methods(obj: object) -> list[str]:
    """Names of the protocol methods `obj` lacks (empty when it satisfies the protocol)."""
    return [name for name in PIPELINE_METHODS if not callable(getattr(obj, name, None))]


def spec_to_dict(spec: ARDiffusionKVCacheSpec) -> dict[str, Any]:
    """Every spec field as plain data (for `--json`)."""
    return {
        "num_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size,
        "tokens_per_frame": spec.tokens_per_frame,
        "frames_per_block": spec.frames_per_block,
        "window_frames": spec.window_frames,
        "sink_frames": spec.sink_frames,
        "reset_at_boundary": spec.reset_at_boundary,
        "session_capacity": spec.session_capacity,
        "max_model_len": spec.max_model_len,
        "branches": [{"name": b.name, "local_index": b.local_index} for b in spec.branches],
        "cross_attention": [{"name": c.name, "num_tokens": c.num_tokens}
                            for c in spec.cross_attention],
        "max_scratch_tokens_per_branch": spec.max_scratch_tokens_per_branch,
        "model_owned_state_bytes_per_session": spec.model_owned_state_bytes_per_session,
    }


__all__ = [
    "ARDiffusionKVBranchSpec", "ARDiffusionCrossAttentionKVSpec", "ARDiffusionKVCacheSpec",
    "SupportsARDiffusionPipeline", "SupportsARDiffusionWarmup", "missing_pipeline_methods",
    "spec_to_dict", "apply_overrides",
]


def apply_overrides(spec: ARDiffusionKVCacheSpec, window_frames: int | None = None,
                    sink_frames: int | None = None) -> ARDiffusionKVCacheSpec:
    """The effective spec: runtime overrides replace the spec's values when set (0 included)."""
    changes = {}
    if window_frames is not None:
        changes["window_frames"] = window_frames
    if sink_frames is not None:
        changes["sink_frames"] = sink_frames
    return dataclasses.replace(spec, **changes) if changes else spec
