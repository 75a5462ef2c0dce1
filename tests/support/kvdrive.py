"""Test drivers for the KV cache: tiny specs, docs/design.md#3-what-a-block-sees computed on its own, and a lockstep.

`WindowModel` re-derives what a block sees from the words of docs/design.md#3-what-a-block-sees, without
`ardiff.kv.window`, so a wrong policy cannot agree with itself. `Lockstep` runs
the same blocks on a paged cache (poison=True: unused and freed pages are NaN)
and on the dense reference, and compares every attend output as it comes.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

import torch

from ardiff.contract.spec import (
    ARDiffusionCrossAttentionKVSpec,
    ARDiffusionKVBranchSpec,
    ARDiffusionKVCacheSpec,
)
from ardiff.dtypes import DTYPE_BYTES
from ardiff.kv.backend import create_cache
from ardiff.kv.paged import PagedKVCache
from ardiff.kv.plan import KVPlan, make_plan
from ardiff.kv.state import open_state

BIG_BUDGET_BYTES = 1 << 40  # capacity is then bounded by the spec / max_sessions only
CFG_BRANCHES = (ARDiffusionKVBranchSpec("positive", 0), ARDiffusionKVBranchSpec("negative", 1))
SHARED_SLOT_BRANCHES = (ARDiffusionKVBranchSpec("positive", 0),
                        ARDiffusionKVBranchSpec("negative", 0))


class InjectedFailure(Exception):
    """Raised by a test inside a block, to check that nothing is committed."""


def make_spec(*, num_layers: int = 2, num_kv_heads: int = 2, head_size: int = 8,
              tokens_per_frame: int = 4, frames_per_block: int = 2, window_frames: int = 4,
              sink_frames: int = 0, reset_at_boundary: bool = False, kv_branches=None,
              registers: int = 0, session_capacity: int = 1,
              cross: dict[str, int] | None = None) -> ARDiffusionKVCacheSpec:
    """A tiny spec; `branches` is a tuple of branch specs (default: one `main`)."""
    return ARDiffusionKVCacheSpec(
        num_layers=num_layers, num_kv_heads=num_kv_heads, head_size=head_size,
        tokens_per_frame=tokens_per_frame, frames_per_block=frames_per_block,
        window_frames=window_frames, sink_frames=sink_frames,
        reset_at_boundary=reset_at_boundary, session_capacity=session_capacity,
        kv_branches=kv_branches or (ARDiffusionKVBranchSpec("main", 0),),
        cross_attention=tuple(ARDiffusionCrossAttentionKVSpec(name, n)
                              for name, n in (cross or {}).items()),
        max_scratch_tokens_per_branch=registers)


def plan_for(spec: ARDiffusionKVCacheSpec, page_tokens: int | None = None,
             dtype: str = "float32", max_sessions: int | None = None) -> KVPlan:
    return make_plan(spec, dtype, DTYPE_BYTES[dtype], BIG_BUDGET_BYTES, page_tokens,
                     max_sessions)


def branch_names(spec: ARDiffusionKVCacheSpec) -> list[str]:
    return [b.name for b in spec.kv_branches]


# -- docs/design.md#3-what-a-block-sees, independently --------------------------------

def sliding_visible(sink: int, window: int, block: int, n: int) -> list[int]:
    """First min(S, n) frames + the most recent max(0, W - B) committed non-sink frames."""
    past = max(0, window - block)
    non_sink = list(range(sink, n))
    return list(range(min(sink, n))) + (non_sink[max(0, len(non_sink) - past):] if past else [])


@dataclass
class WindowModel:
    """What the next block of one branch sees, by docs/design.md#3-what-a-block-sees (sliding closed form, tumbling by rule)."""

    sink: int
    window: int
    block: int
    reset_at_boundary: bool
    n: int = 0
    tumbling_recent: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, spec: ARDiffusionKVCacheSpec) -> WindowModel:
        return cls(spec.sink_frames, spec.window_frames, spec.frames_per_block,
                   spec.reset_at_boundary)

    @property
    def visible(self) -> list[int]:
        if not self.reset_at_boundary:
            return sliding_visible(self.sink, self.window, self.block, self.n)
        return list(range(min(self.sink, self.n))) + self.tumbling_recent

    def commit(self, num_frames: int) -> None:
        new = range(self.n, self.n + num_frames)
        self.n += num_frames
        self.tumbling_recent += [f for f in new if f >= self.sink]
        # Tumbling: once the next block would not fit in W, drop everything after the sink.
        if len(self.tumbling_recent) + self.block > self.window:
            self.tumbling_recent = []


# -- paged bookkeeping seen from a test ----------------------------------------

def paged_tables(cache: PagedKVCache) -> dict[tuple[str, str], object]:
    """(session_id, branch) -> PageTable of every resident branch."""
    return {(sid, name): branch.table
            for sid, session in cache._sessions.items()
            for name, branch in session.branches.items()}


def check_pool(cache: PagedKVCache) -> None:
    """With no block open: pages used == pages held by tables, none twice, each session bounded."""
    pool, plan = cache.pool, cache.plan
    # The pool holds history and in-flight pages; register pages are reserved per local slot.
    assert pool.num_free + pool.num_used == pool.num_pages == plan.total_pages - plan.register_pages
    held: list[int] = []
    per_session: dict[str, int] = {}
    for (sid, _), table in paged_tables(cache).items():
        pages = [p for frame in table.visible_pages for p in frame]
        held += pages
        per_session[sid] = per_session.get(sid, 0) + len(pages)
    assert len(held) == len(set(held)), "a page is held by two frames"
    assert pool.num_used == len(held), f"leak: {pool.num_used} used, {len(held)} held by tables"
    assert all(pool._is_used[p] for p in held)
    for sid, num_pages in per_session.items():
        assert num_pages <= plan.history_pages_per_session, (sid, num_pages)


# -- random block inputs -----------------------------------------------------------

class Inputs:
    """Random q/k/v/extra for one attend, made on CPU from one generator, then moved."""

    def __init__(self, spec: ARDiffusionKVCacheSpec, seed: int, device: str | torch.device,
                 q_head_factor: int = 2, dtype: torch.dtype = torch.float32) -> None:
        self.spec, self.device, self.dtype = spec, torch.device(device), dtype
        self.q_heads = spec.num_kv_heads * q_head_factor
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(self.device, self.dtype)

    def attend_args(self, num_frames: int) -> dict:
        s = self.spec
        tokens = num_frames * s.tokens_per_frame
        args = dict(q=self._randn(tokens, self.q_heads, s.head_size),
                    k=self._randn(tokens, s.num_kv_heads, s.head_size),
                    v=self._randn(tokens, s.num_kv_heads, s.head_size))
        if s.max_scratch_tokens_per_branch and self.rng.random() < 0.8:
            n = self.rng.randint(1, s.max_scratch_tokens_per_branch)
            args["extra_k"] = self._randn(n, s.num_kv_heads, s.head_size)
            args["extra_v"] = self._randn(n, s.num_kv_heads, s.head_size)
        if self.rng.random() < 0.3:
            args["scale"] = 0.3
        return args


# -- paged vs dense --------------------------------------------------------------

class Lockstep:
    """One spec on a poisoned paged cache and on the dense reference, driven identically."""

    def __init__(self, spec: ARDiffusionKVCacheSpec, page_tokens: int | None = None,
                 device: str | torch.device = "cpu", seed: int = 0, atol: float = 1e-6,
                 max_sessions: int | None = None) -> None:
        self.spec, self.atol = spec, atol
        self.plan = plan_for(spec, page_tokens, max_sessions=max_sessions)
        self.paged = create_cache(self.plan, "paged", device, poison=True)
        self.dense = create_cache(self.plan, "dense", device)
        self.inputs = Inputs(spec, seed, device)
        self.rng = random.Random(seed + 1)
        self.models: dict[tuple[str, str], WindowModel] = {}
        self.num_attends = 0

    @property
    def caches(self):
        return (self.paged, self.dense)

    def model(self, session_id: str, branch: str) -> WindowModel:
        return self.models.setdefault((session_id, branch), WindowModel.of(self.spec))

    def probe(self, session_id: str, branches: list[str], steps: int = 1,
              num_frames: int | None = None) -> None:
        self._run(session_id, branches, False, steps, num_frames)

    def commit(self, session_id: str, branches: list[str], num_frames: int | None = None) -> None:
        self._run(session_id, branches, True, 1, num_frames)
        for branch in branches:
            self.model(session_id, branch).commit(num_frames or self.spec.frames_per_block)

    def fail(self, session_id: str, branches: list[str], after_attends: int,
             commit: bool = True) -> None:
        """A block that raises after `after_attends` attends: nothing may change."""
        before = {b: self.model(session_id, b).n for b in branches}
        used = self.paged.pool.num_used
        try:
            self._run(session_id, branches, commit, 1, None, fail_after=after_attends)
        except InjectedFailure:
            pass
        else:
            raise AssertionError("the injected failure did not propagate out of the block")
        for cache in self.caches:
            state = open_state(cache, session_id)
            assert {b: state.num_committed_frames(b) for b in branches} == before
            state.close()
        assert self.paged.pool.num_used == used
        check_pool(self.paged)

    def release(self, session_id: str) -> None:
        for cache in self.caches:
            cache.release_session(session_id)
        for key in [key for key in self.models if key[0] == session_id]:
            del self.models[key]
        check_pool(self.paged)

    def _run(self, session_id: str, branches: list[str], commit: bool, steps: int,
             num_frames: int | None, fail_after: int | None = None) -> None:
        states = [open_state(cache, session_id) for cache in self.caches]
        frames = num_frames or self.spec.frames_per_block
        try:
            with contextlib.ExitStack() as stack:
                blocks = {b: [stack.enter_context(st.block(b, commit=commit, num_frames=num_frames))
                              for st in states] for b in branches}
                for branch, pair in blocks.items():
                    self._check_block(session_id, branch, pair)
                attends = 0
                for _ in range(steps):
                    for branch, pair in blocks.items():
                        for layer in self.rng.sample(range(self.spec.num_layers),
                                                     self.spec.num_layers):
                            if attends == fail_after:
                                raise InjectedFailure
                            self._attend(pair, layer, frames)
                            attends += 1
                if fail_after is not None:
                    raise InjectedFailure
        finally:
            for cache, state in zip(self.caches, states):
                state.close()
        check_pool(self.paged)

    def _check_block(self, session_id: str, branch: str, pair) -> None:
        model = self.model(session_id, branch)
        for blk in pair:
            assert blk.start_frame == model.n
            assert blk.visible_frames == model.visible, (
                f"{branch} at n={model.n}: got {blk.visible_frames}, docs/design.md says {model.visible}")

    def _attend(self, pair, layer: int, num_frames: int) -> None:
        args = self.inputs.attend_args(num_frames)
        out_paged, out_dense = (blk.attend(layer, **args) for blk in pair)
        assert out_paged.shape == args["q"].shape
        assert not torch.isnan(out_paged).any(), "paged attention read a poisoned page"
        assert not torch.isnan(out_dense).any()
        torch.testing.assert_close(out_paged, out_dense, rtol=0, atol=self.atol)
        self.num_attends += 1


def drive_random(lock: Lockstep, sessions: list[str], min_frames: int, seed: int,
                 cfg_nested: bool = False, partial_blocks: bool = False,
                 resets: bool = False) -> None:
    """Probes, commits, failures (and resets) in random order until every branch of every
    session has committed at least `min_frames` frames."""
    rng = random.Random(seed)
    spec = lock.spec
    names = branch_names(spec)
    groups = [names] if cfg_nested else [[name] for name in names]
    reset_done: set[str] = set()

    def behind(sid: str) -> bool:
        return any(lock.model(sid, b).n < min_frames for b in names)

    while any(behind(sid) for sid in sessions):
        sid = rng.choice([s for s in sessions if behind(s)])
        group = rng.choice(groups)
        for _ in range(rng.randint(0, 2)):
            lock.probe(sid, group, steps=rng.randint(1, 2))
        if rng.random() < 0.15:
            lock.fail(sid, group, rng.randint(0, spec.num_layers * len(group)),
                      commit=rng.random() < 0.8)
        num_frames = None
        if partial_blocks and spec.frames_per_block > 1 and rng.random() < 0.2:
            num_frames = rng.randint(1, spec.frames_per_block - 1)
        lock.commit(sid, group, num_frames)
        if resets and sid not in reset_done and lock.model(sid, group[0]).n >= min_frames // 2:
            lock.release(sid)
            reset_done.add(sid)
