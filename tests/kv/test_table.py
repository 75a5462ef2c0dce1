"""WindowPolicy and PageTable: integer bookkeeping of what a branch keeps (docs/design.md#3-what-a-block-sees)."""

from __future__ import annotations

import itertools

import pytest
import torch
from kvdrive import WindowModel, check_pool, make_spec, paged_tables, plan_for, sliding_visible

from ardiff.kv.backend import create_cache
from ardiff.kv.pool import PagePool
from ardiff.kv.state import open_state
from ardiff.kv.table import PageTable
from ardiff.kv.window import WindowPolicy


def commit_frames(table: PageTable, pool: PagePool, num_frames: int, pages_per_frame: int):
    """Commit `num_frames` frames of fresh pages; free what the window evicts."""
    pages = pool.allocate(num_frames * pages_per_frame)
    assert pages is not None, "the pool is sized for history + one block"
    frames = [tuple(pages[i * pages_per_frame:(i + 1) * pages_per_frame])
              for i in range(num_frames)]
    evicted = table.commit(frames)
    pool.free(evicted)
    return frames, evicted


# -- WindowPolicy ------------------------------------------------------------------------

@pytest.mark.parametrize("window, block, past", [(5, 2, 3), (2, 2, 0), (1, 3, 0), (7, 1, 6)])
def test_past_frames(window, block, past):
    assert WindowPolicy(1, window, block).past_frames == past


def test_sliding_keeps_the_most_recent_past_frames():
    policy = WindowPolicy(sink_frames=1, window_frames=5, frames_per_block=2)
    assert [policy.num_recent_to_keep(n) for n in range(7)] == [0, 1, 2, 3, 3, 3, 3]


def test_tumbling_keeps_all_until_the_next_block_does_not_fit():
    policy = WindowPolicy(sink_frames=1, window_frames=5, frames_per_block=2,
                          reset_at_boundary=True)
    assert [policy.num_recent_to_keep(n) for n in range(7)] == [0, 1, 2, 3, 0, 0, 0]


def test_from_spec_and_sink():
    spec = make_spec(window_frames=6, frames_per_block=3, sink_frames=2, reset_at_boundary=True)
    policy = WindowPolicy.from_spec(spec)
    assert policy == WindowPolicy(2, 6, 3, True)
    assert [policy.is_sink(i) for i in range(4)] == [True, True, False, False]


# -- PageTable -----------------------------------------------------------------------------

GRID = list(itertools.product([0, 1, 2], [1, 2, 4, 7], [1, 2, 3], [False, True]))


@pytest.mark.parametrize("sink, window, block, reset", GRID)
def test_table_follows_design_window(sink, window, block, reset):
    ppf = 2
    policy = WindowPolicy(sink, window, block, reset)
    history_pages = (sink + max(0, window - block)) * ppf
    pool = PagePool(history_pages + block * ppf)
    table, model = PageTable(policy), WindowModel(sink, window, block, reset)
    owner: dict[int, int] = {}  # page -> frame
    for _ in range(6 * window // block + 3):
        assert table.visible_frames == model.visible
        assert table.num_committed_frames == model.n
        frames, evicted = commit_frames(table, pool, block, ppf)
        owner.update({p: model.n + i for i, pages in enumerate(frames) for p in pages})
        model.commit(block)
        assert all(owner[p] >= sink for p in evicted), "a sink page was evicted"
        assert table.num_pages == pool.num_used <= history_pages
        kept = {p for pages in table.visible_pages for p in pages}
        assert {owner[p] for p in kept} == set(table.visible_frames)
    if not reset:
        assert table.visible_frames == sliding_visible(sink, window, block, table.num_committed_frames)
    pool.free(table.release())
    assert pool.num_used == 0
    assert (table.num_committed_frames, table.visible_frames) == (0, [])


def test_sink_larger_than_one_block():
    table, pool = PageTable(WindowPolicy(3, 4, 2)), PagePool(20)
    for _ in range(5):
        commit_frames(table, pool, 2, 1)
    assert table.visible_frames == [0, 1, 2, 8, 9]


def test_table_stays_bounded_over_10000_frames():
    sink, window, block, ppf = 2, 9, 3, 3
    for reset in (False, True):
        policy = WindowPolicy(sink, window, block, reset)
        bound = sink + max(0, window - block)
        pool = PagePool((bound + block) * ppf)
        table = PageTable(policy)
        for _ in range(10_000 // block):
            commit_frames(table, pool, block, ppf)
            assert table.num_frames <= bound
            assert len(table._recent) <= bound - sink
        assert table.num_committed_frames == 10_000 // block * block
        assert table.visible_frames[:sink] == list(range(sink))
        assert pool.peak_used <= pool.num_pages


@pytest.mark.parametrize("reset_at_boundary", [False, True])
def test_paged_cache_bounded_over_a_long_rollout(reset_at_boundary):
    spec = make_spec(num_layers=1, num_kv_heads=1, head_size=2, tokens_per_frame=3,
                     frames_per_block=2, window_frames=6, sink_frames=1,
                     reset_at_boundary=reset_at_boundary, registers=1)
    plan = plan_for(spec, page_tokens=2)
    cache = create_cache(plan, "paged", poison=True)
    q = torch.ones(6, 1, 2)
    extra = torch.ones(1, 1, 2)
    bound = plan.history_frames_per_branch
    for block_index in range(150):  # 300 frames
        state = open_state(cache, "s")
        with state.block("main", commit=True) as blk:
            assert blk.start_frame == 2 * block_index  # absolute positions
            assert len(blk.visible_frames) <= bound
            assert blk.visible_frames[:1] == [0] * min(1, block_index)
            assert not torch.isnan(blk.attend(0, q, q, q, extra, extra)).any()
            assert cache.pool.num_used <= plan.total_pages
        state.close()
        check_pool(cache)
        assert cache.pool.num_used <= plan.history_pages_per_session
    assert cache.num_committed_frames("s", "main") == 300
    assert paged_tables(cache)[("s", "main")].num_frames <= bound
    assert cache.pool.peak_used <= plan.total_pages
    cache.release_session("s")
    assert cache.pool.num_used == 0
