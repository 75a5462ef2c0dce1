"""Property-based tests of the bookkeeping (docs/design.md#9-how-we-know-it-is-right): no leak, no double free, sink kept,
window exact, bounded history, everything back after release."""

from __future__ import annotations

import contextlib

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kvdrive import (
    CFG_BRANCHES,
    InjectedFailure,
    WindowModel,
    branch_names,
    check_pool,
    make_spec,
    plan_for,
)

from ardiff.errors import KVStateError, SessionError
from ardiff.kv.backend import create_cache
from ardiff.kv.pool import PagePool
from ardiff.kv.state import open_state
from ardiff.kv.table import PageTable
from ardiff.kv.window import WindowPolicy

SETTINGS = settings(max_examples=60, deadline=None)


# -- PagePool alone -------------------------------------------------------------------------

@SETTINGS
@given(num_pages=st.integers(0, 12),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 99)),
                    min_size=5, max_size=40))
def test_pool_random_allocate_free(num_pages, ops):
    pool = PagePool(num_pages)
    held: list[int] = []
    for is_allocate, num, pick in ops:
        if is_allocate:
            page_ids = pool.allocate(num)
            if num > num_pages - len(held):
                assert page_ids is None  # all or nothing
            else:
                assert len(page_ids) == num and not set(page_ids) & set(held)
                held += page_ids
        elif held:
            page = held.pop(pick % len(held))
            pool.free([page])
            try:
                pool.free([page])
            except KVStateError:
                pass
            else:
                raise AssertionError("double free passed")
        assert pool.num_used == len(held) and pool.num_free + pool.num_used == num_pages
        assert all(0 <= p < num_pages for p in held)
    pool.free(held)
    assert pool.num_free == num_pages


# -- PageTable alone (integers only) ------------------------------------------------------------

@SETTINGS
@given(sink=st.integers(0, 3), window=st.integers(1, 8), block=st.integers(1, 4),
       reset=st.booleans(), pages_per_frame=st.integers(1, 3),
       ops=st.lists(st.integers(0, 4), min_size=5, max_size=40))
def test_table_random_commits(sink, window, block, reset, pages_per_frame, ops):
    """ops: 0 releases the table, k > 0 commits min(k, block) frames."""
    history_pages = (sink + max(0, window - block)) * pages_per_frame
    pool = PagePool(history_pages + block * pages_per_frame)
    table, model = PageTable(WindowPolicy(sink, window, block, reset)), WindowModel(sink, window,
                                                                                   block, reset)
    for op in ops:
        if op == 0:
            pool.free(table.release())
            model = WindowModel(sink, window, block, reset)
        else:
            num_frames = min(op, block)
            pages = pool.allocate(num_frames * pages_per_frame)
            frames = [tuple(pages[i * pages_per_frame:(i + 1) * pages_per_frame])
                      for i in range(num_frames)]
            sink_pages = {p for f in table.visible_pages[:min(sink, model.n)] for p in f}
            evicted = table.commit(frames)
            assert not sink_pages & set(evicted), "a sink page was evicted"
            pool.free(evicted)  # raises on a double free or a foreign id
            model.commit(num_frames)
        assert table.visible_frames == model.visible
        assert table.visible_frames[:min(sink, model.n)] == list(range(min(sink, model.n)))
        assert table.num_pages == pool.num_used <= history_pages
    pool.free(table.release())
    assert pool.num_used == 0


# -- the paged cache under random sessions -------------------------------------------------------

@st.composite
def paged_setups(draw):
    spec = make_spec(num_layers=draw(st.integers(1, 2)), num_kv_heads=1, head_size=2,
                     tokens_per_frame=draw(st.integers(1, 4)),
                     frames_per_block=draw(st.integers(1, 3)),
                     window_frames=draw(st.integers(1, 6)), sink_frames=draw(st.integers(0, 2)),
                     reset_at_boundary=draw(st.booleans()), registers=draw(st.integers(0, 2)),
                     kv_branches=CFG_BRANCHES if draw(st.booleans()) else None,
                     session_capacity=draw(st.integers(1, 3)))
    return spec, draw(st.integers(1, 5))


# Commits weigh most, so that windows fill, slide and tumble within one example.
OP_NAMES = ["commit"] * 5 + ["cfg"] * 2 + ["probe"] * 2 + ["fail", "open", "release", "reset"]
OPS = st.lists(st.tuples(st.sampled_from(OP_NAMES),
                         st.integers(0, 2),    # session
                         st.integers(0, 1),    # branch
                         st.integers(1, 3),    # num_frames (capped at frames_per_block)
                         st.integers(0, 4)),   # attends before an injected failure
               min_size=10, max_size=50)


class PagedMachine:
    """Runs ops on a poisoned paged cache, checking it against WindowModel after every op."""

    def __init__(self, spec, page_tokens: int) -> None:
        self.spec = spec
        self.plan = plan_for(spec, page_tokens)
        self.cache = create_cache(self.plan, "paged", poison=True)
        self.names = branch_names(spec)
        self.models: dict[str, dict[str, WindowModel]] = {}

    def open(self, sid: str):
        if sid not in self.models and len(self.models) >= self.plan.session_capacity:
            try:
                open_state(self.cache, sid)
            except SessionError:
                return None
            raise AssertionError("opened more sessions than the plan's capacity")
        self.models.setdefault(sid, {b: WindowModel.of(self.spec) for b in self.names})
        return open_state(self.cache, sid)

    def release(self, sid: str) -> None:
        if sid in self.models:
            self.cache.release_session(sid)
            del self.models[sid]
        else:
            try:
                self.cache.release_session(sid)
            except SessionError:
                return
            raise AssertionError("released a session that was not resident")

    def blocks(self, sid: str, branches: list[str], commit: bool, num_frames: int,
               fail_after: int | None) -> None:
        state = self.open(sid)
        if state is None:
            return
        before = {b: self.models[sid][b].n for b in branches}
        try:
            with contextlib.ExitStack() as stack:
                blks = [stack.enter_context(state.block(b, commit=commit, num_frames=num_frames))
                        for b in branches]
                self._attend_all(sid, branches, blks, num_frames, fail_after)
        except InjectedFailure:
            assert {b: state.num_committed_frames(b) for b in branches} == before
        else:
            if commit:
                for b in branches:
                    self.models[sid][b].commit(num_frames)
        finally:
            state.close()

    def _attend_all(self, sid, branches, blks, num_frames, fail_after) -> None:
        s = self.spec
        x = torch.randn(num_frames * s.tokens_per_frame, s.num_kv_heads, s.head_size)
        extra = torch.randn(s.max_scratch_tokens_per_branch, 1, s.head_size)
        extras = (extra, extra) if s.max_scratch_tokens_per_branch else (None, None)
        attends = 0
        for branch, blk in zip(branches, blks):
            model = self.models[sid][branch]
            sink = list(range(min(s.sink_frames, model.n)))
            assert blk.visible_frames[:len(sink)] == sink, "a sink frame was evicted"
            assert blk.visible_frames == model.visible
            assert blk.start_frame == model.n
            for layer in range(s.num_layers):
                if attends == fail_after:
                    raise InjectedFailure
                assert not torch.isnan(blk.attend(layer, x, x, x, *extras)).any()
                attends += 1
        if fail_after is not None:
            raise InjectedFailure

    def run(self, op: str, session: int, branch: int, num_frames: int, fail_after: int) -> None:
        sid, name = f"s{session}", self.names[branch % len(self.names)]
        num_frames = min(num_frames, self.spec.frames_per_block)
        if op == "open":
            state = self.open(sid)
            if state is not None:
                state.close()
        elif op in ("probe", "commit", "fail"):
            self.blocks(sid, [name], op != "probe", num_frames,
                        fail_after if op == "fail" else None)
        elif op == "cfg":
            self.blocks(sid, self.names, True, num_frames, None)
        elif op == "release":
            self.release(sid)
        elif op == "reset":
            self.release(sid)
            state = self.open(sid)
            if state is not None:
                assert all(state.num_committed_frames(b) == 0 for b in self.names)
                state.close()
        check_pool(self.cache)
        assert sorted(self.cache.session_ids) == sorted(self.models)


@settings(max_examples=150, deadline=None)
@given(setup=paged_setups(), ops=OPS)
def test_paged_cache_random_sessions(setup, ops):
    machine = PagedMachine(*setup)
    for op in ops:
        machine.run(*op)
    assert machine.cache.pool.peak_used <= machine.plan.total_pages
    machine.cache.close()
    assert machine.cache.pool.num_used == 0
    assert machine.cache.session_ids == []
