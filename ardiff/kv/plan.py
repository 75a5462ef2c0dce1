"""The memory plan: (spec, dtype, page_tokens, budget) -> pages and bytes, in pure integers.

Shared by `inspect-spec` (a dry run) and the cache that allocates it
(docs/design.md#4-memory). With S sink frames, window W, block B frames, and
local_branches the branches this worker runs (one per local_index; a CFG-parallel rank
counts only its own):

    page_bytes     = 2 * page_tokens * num_kv_heads * head_size * dtype_bytes * num_layers
    history_pages  = local_branches * (S + max(0, W - B)) * pages_per_frame     per session
    inflight_pages = batch_rows * local_branches * B * pages_per_frame           shared
    register_pages = local_branches * ceil(max_scratch_tokens / page_tokens)     shared
    cross_bytes    = sum 2 * local_branches * L * heads * head_size * dtype_bytes * layers
    required(c)    = page_bytes * (c * history_pages + inflight_pages + register_pages)
                     + c * (cross_bytes + model_owned_state_bytes_per_session)

The pool allocates exactly `total_pages` for the largest c that fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ardiff.contract.spec import ARDiffusionKVCacheSpec, history_frames_per_branch
from ardiff.errors import CapacityError, SpecError
from ardiff.sizes import ceil_div, format_bytes


@dataclass(frozen=True)
class KVPlan:
    """How many pages of which size the cache holds, and how many sessions fit."""

    spec: ARDiffusionKVCacheSpec  # the effective spec (runtime overrides applied)
    dtype: str
    dtype_bytes: int
    page_tokens: int
    budget_bytes: int
    session_capacity: int
    stores_registers: bool = True
    batch_rows: int = 1  # blocks in flight per slot at once: the largest batch (ardiff.kv.batch)

    @property
    def pages_per_frame(self) -> int:
        return ceil_div(self.spec.tokens_per_frame, self.page_tokens)

    @property
    def page_bytes(self) -> int:
        s = self.spec
        return 2 * self.page_tokens * s.num_kv_heads * s.head_size * self.dtype_bytes * s.num_layers

    @property
    def history_frames_per_branch(self) -> int:
        return history_frames_per_branch(self.spec)

    @property
    def history_pages_per_branch(self) -> int:
        return self.history_frames_per_branch * self.pages_per_frame

    @property
    def history_pages_per_session(self) -> int:
        return self.spec.num_local_kv_branches * self.history_pages_per_branch

    @property
    def inflight_pages_per_branch(self) -> int:
        return self.spec.frames_per_block * self.pages_per_frame

    @property
    def inflight_pages(self) -> int:
        return self.batch_rows * self.spec.num_local_kv_branches * self.inflight_pages_per_branch

    @property
    def register_pages_per_branch(self) -> int:
        if not self.stores_registers:
            return 0
        return ceil_div(self.spec.max_scratch_tokens_per_branch, self.page_tokens)

    @property
    def register_pages(self) -> int:
        return self.spec.num_local_kv_branches * self.register_pages_per_branch

    @property
    def cross_attention_bytes_per_session(self) -> int:
        s = self.spec
        per_token = 2 * s.num_local_kv_branches * s.num_kv_heads * s.head_size * s.num_layers
        return sum(c.num_tokens for c in s.cross_attention) * per_token * self.dtype_bytes

    @property
    def model_owned_bytes_per_session(self) -> int:
        return self.spec.model_owned_state_bytes_per_session

    @property
    def bytes_per_session(self) -> int:
        return (self.page_bytes * self.history_pages_per_session
                + self.cross_attention_bytes_per_session + self.model_owned_bytes_per_session)

    @property
    def fixed_bytes(self) -> int:
        """Bytes shared by all sessions: the in-flight and register pages."""
        return self.page_bytes * (self.inflight_pages + self.register_pages)

    @property
    def total_pages(self) -> int:
        return (self.session_capacity * self.history_pages_per_session
                + self.inflight_pages + self.register_pages)

    @property
    def total_bytes(self) -> int:
        return required_bytes(self, self.session_capacity)

    def binding_limit(self, max_sessions: int | None = None) -> str:
        """What holds `session_capacity` where it is, named as the setting to change: the
        spec's session_capacity, `runtime.max_sessions`, or the memory budget."""
        if self.session_capacity >= self.spec.session_capacity:
            return (f"the pipeline's session_capacity of {self.spec.session_capacity} "
                    f"(pipeline.args.session_capacity where the pipeline takes it)")
        if max_sessions is not None and self.session_capacity >= max_sessions:
            return f"runtime.max_sessions: {max_sessions}"
        return (f"runtime.memory_budget ({format_bytes(self.budget_bytes, round_down=True)} "
                f"holds {self.session_capacity} at {format_bytes(self.bytes_per_session)} "
                f"each)")

    def to_dict(self) -> dict[str, int]:
        """The `memory` object of `inspect-spec --json` (stable keys)."""
        keys = ("page_bytes", "history_frames_per_branch", "history_pages_per_session",
                "inflight_pages", "register_pages", "cross_attention_bytes_per_session",
                "model_owned_bytes_per_session", "bytes_per_session", "fixed_bytes",
                "budget_bytes", "session_capacity", "total_pages", "total_bytes")
        return {key: getattr(self, key) for key in keys}


def required_bytes(plan: KVPlan, num_sessions: int) -> int:
    """Bytes needed to keep `num_sessions` sessions resident."""
    return plan.fixed_bytes + num_sessions * plan.bytes_per_session


def make_plan(spec: ARDiffusionKVCacheSpec, dtype: str, dtype_bytes: int, budget_bytes: int,
              page_tokens: int | None = None, max_sessions: int | None = None,
              stores_registers: bool = True, batch_rows: int = 1) -> KVPlan:
    """Plan the largest session count that fits `budget_bytes`; raise `CapacityError` if none.
    `batch_rows`: the most sessions one batched forward holds (each row a block in flight)."""
    page_tokens = spec.tokens_per_frame if page_tokens is None else page_tokens
    if page_tokens < 1:
        raise SpecError(f"runtime.kv.page_tokens: {page_tokens!r} is invalid; it must be > 0")
    limit = spec.session_capacity if max_sessions is None else min(spec.session_capacity,
                                                                   max_sessions)
    plan = KVPlan(spec, dtype, dtype_bytes, page_tokens, budget_bytes, limit, stores_registers,
                  batch_rows)
    fits = _sessions_that_fit(plan)
    if fits < 1:
        raise CapacityError(_shortfall_message(plan))
    return dataclasses.replace(plan, session_capacity=min(limit, fits))


def _sessions_that_fit(plan: KVPlan) -> int:
    """Sessions that fit beside the shared pages (the cap when a session costs nothing)."""
    room = plan.budget_bytes - plan.fixed_bytes
    if room < 0:
        return 0
    if plan.bytes_per_session == 0:  # S = 0, W <= B and no cross or model state: free sessions
        return plan.session_capacity
    return room // plan.bytes_per_session


def _shortfall_message(plan: KVPlan) -> str:
    needed = required_bytes(plan, 1)
    hints = [f"raise the budget to at least {format_bytes(needed)}"]
    window = _largest_fitting_window(plan)
    if window is not None:
        hints.insert(0, f"lower runtime.kv.window_frames to {window} or less")
    if plan.dtype == "float32":
        half = dataclasses.replace(plan, dtype="bfloat16", dtype_bytes=2)
        if required_bytes(half, 1) <= plan.budget_bytes:
            hints.insert(0, "use runtime.dtype=bfloat16")
    return (f"runtime.memory_budget: {format_bytes(plan.budget_bytes)} cannot hold one session "
            f"(needs {format_bytes(needed)}: {format_bytes(plan.bytes_per_session)} per session "
            f"+ {format_bytes(plan.fixed_bytes)} shared, short by "
            f"{format_bytes(needed - plan.budget_bytes)}); {' or '.join(hints)}")


def _largest_fitting_window(plan: KVPlan) -> int | None:
    """The largest window_frames with which one session fits, or None if no window does."""
    frame_bytes = plan.page_bytes * plan.pages_per_frame * plan.spec.num_local_kv_branches
    room = (plan.budget_bytes - plan.fixed_bytes - plan.cross_attention_bytes_per_session
            - plan.model_owned_bytes_per_session)
    past_frames = room // frame_bytes - plan.spec.sink_frames  # non-sink frames that fit
    if past_frames < 0:
        return None
    window = plan.spec.frames_per_block + past_frames
    return window if window < plan.spec.window_frames else None
