"""PagedStorage: one K and one V tensor per layer, indexed by page id; poison mode."""

from __future__ import annotations

import pytest
import torch
from kvdrive import CFG_BRANCHES, make_spec, paged_tables, plan_for

from ardiff.kv import storage as storage_module
from ardiff.kv.backend import create_cache
from ardiff.kv.state import open_state
from ardiff.kv.storage import PagedStorage

LAYERS, HEADS, HS = 3, 2, 4


def spec_(**kw):
    base = dict(num_layers=LAYERS, num_kv_heads=HEADS, head_size=HS, tokens_per_frame=5,
                frames_per_block=2, window_frames=4, sink_frames=1, registers=3,
                session_capacity=3)
    return make_spec(**{**base, **kw})


@pytest.mark.parametrize("dtype, torch_dtype", [("float32", torch.float32),
                                                ("bfloat16", torch.bfloat16)])
@pytest.mark.parametrize("page_tokens", [5, 2, 1, 8])
def test_layout_and_bytes(page_tokens, dtype, torch_dtype):
    plan = plan_for(spec_(kv_branches=CFG_BRANCHES), page_tokens, dtype, max_sessions=3)
    storage = PagedStorage(plan, "cpu")
    shape = (plan.total_pages, page_tokens, HEADS, HS)
    assert len(storage.k) == len(storage.v) == LAYERS
    for tensor in (*storage.k, *storage.v):
        assert tuple(tensor.shape) == shape
        assert tensor.dtype == torch_dtype
    pointers = {t.untyped_storage().data_ptr() for t in (*storage.k, *storage.v)}
    assert len(pointers) == 2 * LAYERS, "K and V of every layer are separate allocations"
    assert storage.nbytes == plan.page_bytes * plan.total_pages
    assert plan.total_pages == (3 * plan.history_pages_per_session + plan.inflight_pages
                                + plan.register_pages)


def test_cache_allocates_exactly_the_plan():
    plan = plan_for(spec_(), page_tokens=2, max_sessions=2)
    cache = create_cache(plan, "paged")
    assert plan.total_pages == cache.storage.k[0].shape[0]
    assert cache.pool.num_pages == plan.total_pages - plan.register_pages  # registers: per slot
    assert [s.register_pages for s in cache.slots] == [list(range(cache.pool.num_pages,
                                                                plan.total_pages))]
    stats = cache.stats()
    assert (stats.pages_total, stats.pages_in_use, stats.kv_bytes_allocated) == (
        plan.total_pages, 0, plan.page_bytes * plan.total_pages)


def test_frames_address_skips_the_tail_of_the_last_page():
    plan = plan_for(spec_(), page_tokens=2)  # 5 tokens -> 3 pages, the last half used
    storage = PagedStorage(plan, "cpu")
    address = storage.frames_address([(4, 0, 7), (1, 2, 3)])
    assert address.index.tolist() == [8, 9, 0, 1, 14, 2, 3, 4, 5, 6]
    assert address.runs == ((8, 2), (0, 2), (14, 1), (2, 5))  # adjacent stretches merged
    assert storage.frames_address([]).num_tokens == 0
    assert storage.registers_address([6, 2], 3).index.tolist() == [12, 13, 4]


@pytest.fixture(params=["index", "runs"])
def copy_path(request, monkeypatch):
    """Run a storage test through per-token indexing and through slice copies."""
    threshold = 1 << 40 if request.param == "index" else 1
    monkeypatch.setattr(storage_module, "RUN_COPY_MIN_ELEMENTS", threshold)
    return request.param


@pytest.mark.parametrize("page_tokens", [3, 5])  # 3: a frame spans pages, 5: one page a frame
def test_write_then_read_round_trips(page_tokens, copy_path):
    plan = plan_for(spec_(), page_tokens=page_tokens)
    storage = PagedStorage(plan, "cpu", poison=True)
    frames = [(2, 5), (0, 1)] if page_tokens == 3 else [(2,), (0,)]
    address = storage.frames_address(frames)
    k, v = torch.randn(10, HEADS, HS), torch.randn(10, HEADS, HS)
    storage.write(1, address, k, v)
    got_k, got_v = storage.read(1, address)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    assert torch.isnan(storage.k[0]).all(), "other layers untouched"
    assert torch.isnan(storage.k[1][3]).all(), "pages not written stay poisoned"


def test_read_appends_register_tokens_after_the_frames(copy_path):
    plan = plan_for(spec_(), page_tokens=5)
    storage = PagedStorage(plan, "cpu", poison=True)
    address = storage.frames_address([(1,)])
    registers = storage.registers_address([4], 3)
    k, extra = torch.randn(5, HEADS, HS), torch.randn(3, HEADS, HS)
    storage.write(0, address, k, k)
    storage.write(0, registers, extra, extra)
    got_k, _ = storage.read(0, address, registers)
    assert torch.equal(got_k, torch.cat([k, extra]))


def _commit(state, tokens=10):
    with state.block("main", commit=True) as blk:
        for layer in range(LAYERS):
            x = torch.randn(tokens, HEADS, HS)
            blk.attend(layer, torch.randn(tokens, 2 * HEADS, HS), x, x,
                       torch.ones(3, HEADS, HS), torch.ones(3, HEADS, HS))


def _is_nan(storage: PagedStorage, page_ids) -> bool:
    ids = torch.tensor(sorted(page_ids), dtype=torch.long)
    return all(torch.isnan(t[ids]).all() for t in (*storage.k, *storage.v))


def _history_pages(cache) -> set[int]:
    return {p for table in paged_tables(cache).values() for f in table.visible_pages for p in f}


def test_poison_fills_free_and_evicted_pages_with_nan():
    plan = plan_for(spec_(), page_tokens=5)
    cache = create_cache(plan, "paged", poison=True)
    storage = cache.storage
    assert _is_nan(storage, range(plan.total_pages)), "unused pages start poisoned"
    state = open_state(cache, "s")
    seen_pages: set[int] = set()
    for _ in range(4):
        before = _history_pages(cache)
        _commit(state)
        after = _history_pages(cache)
        seen_pages |= after
        evicted = before - after
        assert _is_nan(storage, evicted)
        free = set(range(cache.pool.num_pages)) - after
        assert _is_nan(storage, free), "in-flight and evicted pages are NaN once free"
        registers = cache.slots[0].register_pages
        assert _is_nan(storage, registers), "the eager path stores no register tokens"
        assert not any(torch.isnan(t[sorted(after)]).any() for t in storage.k), "history is data"
    assert seen_pages - after, "the window evicted something"
    cache.release_session("s")
    assert _is_nan(storage, range(plan.total_pages))


def test_without_poison_nothing_is_filled():
    plan = plan_for(spec_(), page_tokens=5)
    cache = create_cache(plan, "paged", poison=False)
    cache.storage.k[0].zero_()
    cache.storage.poison([0, 1])
    assert not torch.isnan(cache.storage.k[0]).any()
