"""ardiff/kv/plan.py: the memory plan on hand-computed cases (docs/design.md#4-memory).

Unless a test says otherwise: 2 layers, 2 KV heads of 8, 4 tokens per frame,
blocks of 2 frames, a 6-frame window, no sink, float32 (4 bytes), one page
per frame, so

    page_bytes = 2 (K and V) * 4 tokens * 2 heads * 8 * 4 bytes * 2 layers = 1024
"""

from __future__ import annotations

import re

import pytest

from ardiff.contract.spec import ARDiffusionCrossAttentionKVSpec as Cross
from ardiff.contract.spec import ARDiffusionKVBranchSpec as Branch
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.errors import CapacityError, SpecError
from ardiff.kv.plan import make_plan, required_bytes

BASE = dict(num_layers=2, num_kv_heads=2, head_size=8, tokens_per_frame=4, frames_per_block=2,
            window_frames=6, sink_frames=0, session_capacity=8, kv_branches=(Branch("main", 0),))
BIG = 2**30  # a budget that never limits


def spec(**changes) -> ARDiffusionKVCacheSpec:
    return ARDiffusionKVCacheSpec(**{**BASE, **changes})


def plan(budget=BIG, dtype="float32", dtype_bytes=4, **kwargs):
    spec_fields = {k: v for k, v in kwargs.items() if k in ARDiffusionKVCacheSpec.__annotations__}
    options = {k: v for k, v in kwargs.items() if k not in spec_fields}
    return make_plan(spec(**spec_fields), dtype, dtype_bytes, budget, **options)


CFG = (Branch("positive", 0), Branch("negative", 1))
CFG_SHARED = (Branch("positive", 0), Branch("negative", 0))


# ---- pages ---------------------------------------------------------------------------------

def test_one_branch_no_sink():
    p = plan()
    assert (p.page_tokens, p.pages_per_frame, p.page_bytes) == (4, 1, 1024)
    assert p.history_frames_per_branch == 4     # 0 + (6 - 2)
    assert p.history_pages_per_session == 4     # 1 branch * 4 frames * 1 page
    assert p.inflight_pages == 2                # 1 branch * 2 frames * 1 page
    assert p.register_pages == 0
    assert p.cross_attention_bytes_per_session == 0
    assert p.bytes_per_session == 4096          # 4 pages * 1024
    assert p.fixed_bytes == 2048                # (2 + 0 pages) * 1024


def test_sink_frames_are_kept_on_top_of_the_window():
    p = plan(sink_frames=2)
    assert p.history_frames_per_branch == 6     # 2 + (6 - 2)
    assert p.history_pages_per_session == 6
    assert p.bytes_per_session == 6144
    assert p.fixed_bytes == 2048                # the sink does not change the block in flight


def test_two_local_branches_double_history_and_inflight():
    p = plan(kv_branches=CFG)
    assert p.history_pages_per_session == 8     # 2 branches * 4 frames
    assert p.inflight_pages == 4                # 2 branches * 2 frames
    assert (p.bytes_per_session, p.fixed_bytes) == (8192, 4096)


def test_two_logical_branches_sharing_a_slot_cost_one():
    p = plan(kv_branches=CFG_SHARED)
    assert p.history_pages_per_session == 4
    assert p.inflight_pages == 2
    assert (p.bytes_per_session, p.fixed_bytes) == (4096, 2048)


def test_window_smaller_than_the_block_keeps_only_the_sink():
    p = plan(window_frames=1, sink_frames=1)
    assert p.history_frames_per_branch == 1     # 1 + max(0, 1 - 2)
    assert p.history_pages_per_session == 1
    assert p.inflight_pages == 2                # the whole block is still in flight


def test_window_equal_to_the_block_without_sink_costs_nothing_per_session():
    p = plan(budget=2048, window_frames=2)
    assert p.history_pages_per_session == 0
    assert p.bytes_per_session == 0
    assert p.session_capacity == 8              # every session the spec allows
    assert (p.total_pages, p.total_bytes) == (2, 2048)
    with pytest.raises(CapacityError, match=re.escape("needs 2.0KiB: 0B per session")):
        plan(budget=2047, window_frames=2)


def test_page_tokens_dividing_a_frame():
    p = plan(page_tokens=2)
    assert (p.pages_per_frame, p.page_bytes) == (2, 512)   # 2 * 2 * 2 * 8 * 4 * 2
    assert p.history_pages_per_session == 8     # 4 frames * 2 pages
    assert p.inflight_pages == 4                # 2 frames * 2 pages
    assert (p.bytes_per_session, p.fixed_bytes) == (4096, 2048)   # same bytes as 1 page/frame


def test_page_tokens_not_dividing_a_frame_round_up():
    p = plan(page_tokens=3)
    assert (p.pages_per_frame, p.page_bytes) == (2, 768)   # ceil(4 / 3); 2 * 3 * 2 * 8 * 4 * 2
    assert p.history_pages_per_session == 8
    assert p.inflight_pages == 4
    assert (p.bytes_per_session, p.fixed_bytes) == (6144, 3072)   # 8 * 768, 4 * 768


def test_page_larger_than_a_frame():
    p = plan(page_tokens=8)
    assert (p.pages_per_frame, p.page_bytes) == (1, 2048)
    assert p.bytes_per_session == 8192          # 4 pages of 2048: half of each is unused


def test_page_tokens_must_be_positive():
    with pytest.raises(SpecError, match=re.escape(
            "runtime.kv.page_tokens: 0 is invalid; it must be > 0")):
        plan(page_tokens=0)


def test_register_pages():
    p = plan(kv_branches=CFG, max_scratch_tokens_per_branch=5)
    assert p.register_pages == 4                # 2 branches * ceil(5 / 4)
    assert p.fixed_bytes == 8192                # (4 in flight + 4 registers) * 1024
    assert plan(max_scratch_tokens_per_branch=4).register_pages == 1
    assert plan(max_scratch_tokens_per_branch=5, page_tokens=2).register_pages == 3  # ceil(5/2)


def test_a_backend_that_stores_no_registers_plans_none():
    p = plan(kv_branches=CFG, max_scratch_tokens_per_branch=5, stores_registers=False)
    assert p.register_pages == 0
    assert p.fixed_bytes == 4096


def test_cross_attention_bytes_count_the_branches_a_worker_runs():
    caches = (Cross("text", 10), Cross("image", 3))
    # 2 (K, V) * 13 tokens * 2 heads * 8 * 4 bytes * 2 layers = 3328 per logical branch
    assert plan(cross_attention=caches).cross_attention_bytes_per_session == 3328
    shared = plan(cross_attention=caches, kv_branches=CFG_SHARED)
    # Branches sharing a slot run on different workers (CFG-parallel): one session here uses
    # one of them, so its cross-attention K/V are counted once, like its history.
    assert shared.cross_attention_bytes_per_session == 3328
    assert shared.bytes_per_session == 4096 + 3328
    both = plan(cross_attention=caches, kv_branches=CFG)
    assert both.cross_attention_bytes_per_session == 6656      # 2 branches on this worker
    assert shared.fixed_bytes == 2048                          # cross K/V is per session


def test_model_owned_state_is_per_session():
    p = plan(model_owned_state_bytes_per_session=1000)
    assert p.model_owned_bytes_per_session == 1000
    assert p.bytes_per_session == 5096          # 4096 + 1000
    assert p.fixed_bytes == 2048


def test_dtype_bytes_scale_pages_and_cross_attention():
    p = plan(dtype="bfloat16", dtype_bytes=2, cross_attention=(Cross("text", 10),))
    assert p.page_bytes == 512
    assert p.cross_attention_bytes_per_session == 1280   # 2 * 10 * 2 * 8 * 2 * 2
    assert p.dtype == "bfloat16"


# ---- how many sessions fit -----------------------------------------------------------------

def test_required_bytes():
    p = plan(cross_attention=(Cross("text", 10),), model_owned_state_bytes_per_session=100)
    # page_bytes * (c * 4 + 2) + c * (2560 cross + 100 model); cross = 2 * 10 * 2 * 8 * 4 * 2
    assert required_bytes(p, 1) == 1024 * 6 + 2660
    assert required_bytes(p, 3) == 1024 * 14 + 3 * 2660


def test_budget_for_exactly_one_session():
    p = plan(budget=6144)                       # 2048 shared + 4096 per session
    assert p.session_capacity == 1
    assert (p.total_pages, p.total_bytes, p.budget_bytes) == (6, 6144, 6144)


def test_budget_for_many_sessions():
    p = plan(budget=14336)                      # 2048 + 3 * 4096
    assert p.session_capacity == 3
    assert (p.total_pages, p.total_bytes) == (14, 14336)   # 3 * 4 + 2 pages
    assert plan(budget=14335).session_capacity == 2


def test_capacity_is_capped_by_the_spec_and_by_max_sessions():
    assert plan(budget=BIG).session_capacity == 8             # spec.session_capacity
    assert plan(budget=BIG, session_capacity=2).session_capacity == 2
    assert plan(budget=BIG, max_sessions=3).session_capacity == 3
    assert plan(budget=BIG, session_capacity=2, max_sessions=5).session_capacity == 2
    capped = plan(budget=BIG, max_sessions=3)
    assert (capped.total_pages, capped.total_bytes) == (14, 14336)   # only what 3 sessions need


def test_budget_that_fits_no_session():
    with pytest.raises(CapacityError) as info:
        plan(budget=5000)
    assert info.value.exit_code == 3
    # needs 2048 + 4096 = 6144; bfloat16 would need 3072; a 4-frame window would need
    # 2048 + 2 * 1024 = 4096 <= 5000 and a 5-frame window 5120 > 5000.
    assert str(info.value) == (
        "runtime.memory_budget: 4.9KiB cannot hold one session (needs 6.0KiB: 4.0KiB per "
        "session + 2.0KiB shared, short by 1.1KiB); use runtime.dtype=bfloat16 or lower "
        "runtime.kv.window_frames to 4 or less or raise the budget to at least 6.0KiB")


def test_the_suggested_window_and_dtype_do_fit():
    assert plan(budget=5000, window_frames=4).session_capacity == 1
    assert plan(budget=5000, dtype="bfloat16", dtype_bytes=2).session_capacity == 1
    with pytest.raises(CapacityError):
        plan(budget=5000, window_frames=5)


def test_budget_below_the_shared_pages_only_suggests_a_bigger_budget():
    with pytest.raises(CapacityError) as info:
        plan(budget=1000, dtype="bfloat16", dtype_bytes=2)   # shared alone: 2 * 512 = 1024
    assert str(info.value) == (
        "runtime.memory_budget: 1000B cannot hold one session (needs 3.0KiB: 2.0KiB per "
        "session + 1.0KiB shared, short by 2.0KiB); raise the budget to at least 3.0KiB")


def test_to_dict_has_the_stable_keys():
    p = plan(budget=14336)
    assert p.to_dict() == {
        "page_bytes": 1024, "history_frames_per_branch": 4, "history_pages_per_session": 4,
        "inflight_pages": 2, "register_pages": 0, "cross_attention_bytes_per_session": 0,
        "model_owned_bytes_per_session": 0, "bytes_per_session": 4096, "fixed_bytes": 2048,
        "budget_bytes": 14336, "session_capacity": 3, "total_pages": 14, "total_bytes": 14336,
    }


def test_a_huge_session_capacity_is_capped_by_the_budget():
    """The spec's session_capacity is an upper bound, never a size: the plan holds what the
    budget holds (4096 bytes a session, 2048 shared) and allocates no page beyond it."""
    p = plan(budget=1_000_000, session_capacity=10**12)
    assert p.session_capacity == (1_000_000 - 2048) // 4096 == 243
    assert p.total_bytes <= p.budget_bytes
    assert p.total_pages == 243 * 4 + 2
