"""The upstream pipeline contract: the KV-cache spec types and the pipeline protocols.

    spec = ARDiffusionKVCacheSpec(num_layers=2, num_kv_heads=4, head_size=64, ...,
                                  kv_branches=(ARDiffusionKVBranchSpec("main", 0),))

vLLM-Omni's AR-Diffusion contract (`docs/upstream-contract.md`): the same class and
field names, field order, defaults, validation rules and properties, so a pipeline
written against it runs under ardiff unchanged. ardiff adds only type checks whose
`SpecError` names the field and value, and the helpers at the bottom. A pipeline
declares its geometry here; ardiff plans, allocates and owns the cache from it. The
spec is the single source of shapes.
"""

from __future__ import annotations

import dataclasses
import numbers
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, NoReturn, Protocol, TypeVar, runtime_checkable

from ardiff.errors import SpecError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.contract.forward import ARDiffusionKVState, RolloutRequest

# Frame positions a spec may declare when it does not say (the upstream default).
DEFAULT_MAX_MODEL_LEN = 1 << 20

POSITIVE_FIELDS = ("num_layers", "num_kv_heads", "head_size", "tokens_per_frame",
                   "frames_per_block", "window_frames", "session_capacity", "max_model_len")
NON_NEGATIVE_FIELDS = ("sink_frames", "max_scratch_tokens_per_branch",
                       "model_owned_state_bytes_per_session")

ItemT = TypeVar("ItemT")


def _fail(field_name: str, value: object, rule: str) -> NoReturn:
    raise SpecError(f"spec.{field_name}: {value!r} is invalid; it must be {rule}")


def _check_name(value: object, field_name: str) -> None:
    if not (isinstance(value, str) and value):
        _fail(field_name, value, "a non-empty string")


def _as_int(value: object, field_name: str, minimum: int) -> int:
    """Any integer type (numpy's too, as upstream accepts), stored as a Python int."""
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and int(value) >= minimum):
        _fail(field_name, value, "an integer > 0" if minimum == 1 else f"an integer >= {minimum}")
    return int(value)


def _set_ints(obj: object, names: Iterable[tuple[str, str]], minimum: int) -> None:
    """Check and store each (attribute, field name shown in errors) as a Python int."""
    for attribute, shown in names:
        object.__setattr__(obj, attribute, _as_int(getattr(obj, attribute), shown, minimum))


def _as_tuple(value: object, field_name: str, item_type: type[ItemT]) -> tuple[ItemT, ...]:
    """Lists are accepted and stored as tuples, so the spec stays hashable."""
    if not isinstance(value, (list, tuple)):
        _fail(field_name, value, f"a tuple of {item_type.__name__}")
    for item in value:
        if not isinstance(item, item_type):
            _fail(field_name, item, f"a tuple of {item_type.__name__}")
    return tuple(value)


@dataclass(frozen=True)
class ARDiffusionKVBranchSpec:
    """One logical KV branch of a session and its storage slot on this worker.

    Branches may share a `local_index` when each worker runs only one of them
    (the two CFG branches under CFG parallelism); one session may then use only
    one of the branches that share a slot on this worker.
    """

    name: str
    local_index: int

    def __post_init__(self) -> None:
        _check_name(self.name, "kv_branches[].name")
        _set_ints(self, [("local_index", f"kv_branches[{self.name}].local_index")], 0)


@dataclass(frozen=True)
class ARDiffusionCrossAttentionKVSpec:
    """A fixed-length cross-attention K/V cache (e.g. the prompt's text tokens).

    Per session, branch and layer its K and V are `[num_tokens, num_kv_heads,
    head_size]`, with the heads and head size of the enclosing spec.
    """

    name: str
    num_tokens: int

    def __post_init__(self) -> None:
        _check_name(self.name, "cross_attention[].name")
        _set_ints(self, [("num_tokens", f"cross_attention[{self.name}].num_tokens")], 1)


@dataclass(frozen=True)
class ARDiffusionKVCacheSpec:
    """The KV geometry and session policy of a block-causal video diffusion pipeline.

    A frame is `tokens_per_frame` tokens; one forward makes `frames_per_block`
    frames. `window_frames` (the recent tail, counting the block itself) and
    `sink_frames` (the kept prefix) count frames, as does `max_model_len`
    (positions). A block attends to the sink, the most recent
    `window_frames - frames_per_block` other frames and itself (docs/design.md#3-what-a-block-sees).
    `session_capacity` is the pipeline's upper bound; the plan may keep fewer.
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    tokens_per_frame: int
    frames_per_block: int
    window_frames: int
    kv_branches: tuple[ARDiffusionKVBranchSpec, ...]
    session_capacity: int
    sink_frames: int = 0
    reset_at_boundary: bool = False
    cross_attention: tuple[ARDiffusionCrossAttentionKVSpec, ...] = ()
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    max_scratch_tokens_per_branch: int = 0
    model_owned_state_bytes_per_session: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_branches",
                           _as_tuple(self.kv_branches, "kv_branches", ARDiffusionKVBranchSpec))
        object.__setattr__(self, "cross_attention", _as_tuple(
            self.cross_attention, "cross_attention", ARDiffusionCrossAttentionKVSpec))
        _set_ints(self, [(name, name) for name in POSITIVE_FIELDS], 1)
        _set_ints(self, [(name, name) for name in NON_NEGATIVE_FIELDS], 0)
        if not (isinstance(self.reset_at_boundary, bool)
                or (isinstance(self.reset_at_boundary, numbers.Integral)
                    and self.reset_at_boundary in (0, 1))):
            _fail("reset_at_boundary", self.reset_at_boundary, "true or false (or 1 / 0)")
        object.__setattr__(self, "reset_at_boundary", bool(self.reset_at_boundary))
        self._check_kv_branches()
        names = [cache.name for cache in self.cross_attention]
        if len(set(names)) != len(names):
            _fail("cross_attention", names, "unique cross-attention cache names")

    def _check_kv_branches(self) -> None:
        if not self.kv_branches:
            _fail("kv_branches", [], "at least one ARDiffusionKVBranchSpec")
        names = [branch.name for branch in self.kv_branches]
        if len(set(names)) != len(names):
            _fail("kv_branches", names, "unique branch names")
        indices = sorted({branch.local_index for branch in self.kv_branches})
        if indices != list(range(indices[-1] + 1)):
            _fail("kv_branches[].local_index", indices, "contiguous from 0 (0..max, no gap)")

    @property
    def num_local_kv_branches(self) -> int:
        """Storage slots this worker needs: one per distinct `local_index`."""
        return max(branch.local_index for branch in self.kv_branches) + 1

    @property
    def cross_attention_lengths(self) -> dict[str, int]:
        """Cross-attention cache name -> number of tokens."""
        return {cache.name: cache.num_tokens for cache in self.cross_attention}


@runtime_checkable
class SupportsARDiffusionPipeline(Protocol):
    """The upstream pipeline capability: spec, per-request bind, session hooks.

    A session starts when the runner first sees its `session_id` and lives
    until reset, close, LRU eviction or a failed forward. The runner enters
    `bind_ar_diffusion_state(session_id, state)` around every forward (warmup
    included); the state is valid only inside it. `reset_ar_diffusion_session`
    runs after the KV of a reset session is released;
    `close_ar_diffusion_session` after close, eviction or a failed forward.
    """

    def ar_diffusion_kv_cache_spec(self) -> ARDiffusionKVCacheSpec: ...

    def bind_ar_diffusion_state(self, session_id: str,
                                state: ARDiffusionKVState) -> AbstractContextManager[None]: ...

    def reset_ar_diffusion_session(self, session_id: str) -> None: ...

    def close_ar_diffusion_session(self, session_id: str) -> None: ...


@runtime_checkable
class SupportsARDiffusionWarmup(Protocol):
    """Optional: requests for the shapes the pipeline runs, each carrying `session_id`."""

    def ar_diffusion_warmup_requests(self, session_id: str) -> Iterable[RolloutRequest]: ...


# ---- ardiff's helpers beside the contract ------------------------------------------------------

def history_frames_per_branch(spec: ARDiffusionKVCacheSpec) -> int:
    """Frames a branch must keep: the sink plus what the window shows of the past
    (docs/design.md#3-what-a-block-sees)."""
    return spec.sink_frames + max(0, spec.window_frames - spec.frames_per_block)


def find_branch(spec: ARDiffusionKVCacheSpec, name: str) -> ARDiffusionKVBranchSpec | None:
    """The declared branch called `name`, or None."""
    return next((branch for branch in spec.kv_branches if branch.name == name), None)


def spec_to_dict(spec: ARDiffusionKVCacheSpec) -> dict[str, Any]:
    """Every spec field as plain data, in declaration order (for `--json`)."""
    data = dataclasses.asdict(spec)
    for name in ("kv_branches", "cross_attention"):
        data[name] = list(data[name])
    return data


def apply_overrides(spec: ARDiffusionKVCacheSpec, window_frames: int | None = None,
                    sink_frames: int | None = None) -> ARDiffusionKVCacheSpec:
    """The effective spec: runtime overrides replace the spec's values when set (0 included)."""
    if window_frames is None and sink_frames is None:
        return spec
    return dataclasses.replace(
        spec, window_frames=spec.window_frames if window_frames is None else window_frames,
        sink_frames=spec.sink_frames if sink_frames is None else sink_frames)
