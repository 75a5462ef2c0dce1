"""Paged (poisoned) vs dense reference: same blocks, same outputs, same windows (docs/design.md#9-how-we-know-it-is-right)."""

from __future__ import annotations

import pytest
import torch
from kvdrive import CFG_BRANCHES, Lockstep, drive_random, make_spec

# (sink, window, frames_per_block, tokens_per_frame, page_tokens, cfg branches, registers)
CASES = [
    (0, 1, 1, 3, 3, False, 0),    # no history at all: every block sees only itself
    (1, 4, 2, 5, 3, False, 3),    # the smoke shape: page_tokens does not divide the frame
    (2, 5, 2, 4, 2, True, 0),     # CFG, two pages per frame
    (1, 2, 3, 3, 2, False, 2),    # window < frames_per_block: sink only
    (0, 6, 3, 4, 4, True, 4),     # CFG + registers, one page per frame
    (2, 3, 1, 5, 1, False, 0),    # one token per page
    (1, 7, 2, 3, 4, False, 1),    # page bigger than the frame: a tail never read
    (0, 3, 2, 5, 2, True, 0),     # sink 0, three pages per frame
]


def _case_id(case) -> str:
    s, w, b, tpf, pt, cfg, reg = case
    return f"S{s}-W{w}-B{b}-tpf{tpf}-pt{pt}{'-cfg' if cfg else ''}-reg{reg}"


@pytest.mark.parametrize("reset_at_boundary", [False, True], ids=["sliding", "tumbling"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_paged_matches_dense(case, reset_at_boundary):
    sink, window, block, tpf, page_tokens, cfg, registers = case
    spec = make_spec(num_layers=2, num_kv_heads=2, head_size=4, tokens_per_frame=tpf,
                     frames_per_block=block, window_frames=window, sink_frames=sink,
                     reset_at_boundary=reset_at_boundary, registers=registers,
                     kv_branches=CFG_BRANCHES if cfg else None)
    lock = Lockstep(spec, page_tokens, seed=hash(case) % 1000)
    drive_random(lock, ["s"], min_frames=4 * window + block, seed=len(CASES),
                 partial_blocks=True)
    assert lock.num_attends > 0
    lock.release("s")
    assert lock.paged.pool.num_used == 0


@pytest.mark.parametrize("reset_at_boundary", [False, True], ids=["sliding", "tumbling"])
def test_sessions_interleave_reset_and_cfg_nested(reset_at_boundary):
    """Two sessions share the pool; CFG blocks are open together; one session is reset."""
    spec = make_spec(num_layers=2, num_kv_heads=1, head_size=4, tokens_per_frame=3,
                     frames_per_block=2, window_frames=5, sink_frames=1,
                     reset_at_boundary=reset_at_boundary, registers=2,
                     kv_branches=CFG_BRANCHES, session_capacity=2)
    lock = Lockstep(spec, page_tokens=2, seed=7)
    drive_random(lock, ["a", "b"], min_frames=4 * 5, seed=3, cfg_nested=True, resets=True)
    assert lock.paged.pool.peak_used <= lock.plan.total_pages
    for sid in ("a", "b"):
        lock.release(sid)
    assert lock.paged.pool.num_used == 0


def test_exception_inside_commit_block_commits_nothing():
    spec = make_spec(num_layers=2, tokens_per_frame=4, frames_per_block=2, window_frames=4,
                     sink_frames=1, registers=2)
    lock = Lockstep(spec, page_tokens=3, seed=1)
    for _ in range(3):
        lock.commit("s", ["main"])
    for after in range(spec.num_layers + 1):  # before any attend, midway, after every layer
        lock.fail("s", ["main"], after_attends=after)
        assert lock.model("s", "main").n == 6
    for _ in range(4):  # later blocks still agree, windows still exact
        lock.probe("s", ["main"], steps=2)
        lock.commit("s", ["main"])


def test_gqa_and_plain_heads_agree():
    spec = make_spec(num_layers=1, num_kv_heads=2, head_size=4, tokens_per_frame=3,
                     frames_per_block=1, window_frames=3, sink_frames=1)
    for factor in (1, 2):
        lock = Lockstep(spec, page_tokens=2, seed=factor)
        lock.inputs.q_heads = spec.num_kv_heads * factor
        for _ in range(6):
            lock.commit("s", ["main"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_paged_matches_dense_on_cuda():
    spec = make_spec(num_layers=2, num_kv_heads=2, head_size=8, tokens_per_frame=5,
                     frames_per_block=2, window_frames=5, sink_frames=1, registers=3,
                     kv_branches=CFG_BRANCHES)
    lock = Lockstep(spec, page_tokens=3, device="cuda", seed=0, atol=1e-5)
    drive_random(lock, ["s"], min_frames=20, seed=0, cfg_nested=True)
    assert lock.paged.storage.k[0].is_cuda
    lock.release("s")
    assert lock.paged.pool.num_used == 0


@pytest.mark.parametrize("reset_at_boundary", [False, True], ids=["sliding", "tumbling"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_slice_copy_path_matches_dense(case, reset_at_boundary, monkeypatch):
    """The same harness with every stretch copied as a slice (the path big frames take)."""
    from ardiff.kv import storage as storage_module

    monkeypatch.setattr(storage_module, "RUN_COPY_MIN_ELEMENTS", 1)
    test_paged_matches_dense(case, reset_at_boundary)
