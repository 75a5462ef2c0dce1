"""Soak: a 10,000-frame rollout on a minimal geometry, with the KV pool's invariants
checked after every block and the process's resident memory flat.

The library side of `ardiff rollout` without the encoder: the rollout plan and
`iter_rollout` drive `Runner.execute` block by block over the synthetic attention
pipeline (1 layer, 1 head, a few tokens per frame, window 4, sink 1). After every block:

- pages in use are exactly the pages of the frames the session keeps (no leak), within
  the plan's bound (capacity x history pages) and never above its total;
- the page table holds at most `history_frames_per_branch` frames (bounded by the
  window however long the rollout), and positions stay absolute (frame n is at n).

RSS is read from /proc/self/statm after the first 1,000 frames and at the end: it may
grow by the block latencies the runner keeps (a float per block), not by the length of
the video. Runs in a few seconds on one CPU thread: part of the default run, marked slow
so that `pytest -m "not slow"` leaves it out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ardiff.config.run import build_config
from ardiff.engine.build import build_runner
from ardiff.engine.runner import Runner
from ardiff.rollout.streams import iter_rollout, plan_rollout

SOAK_FRAMES = 10_000
RSS_BASELINE_FRAMES = 1_000
# Bytes. Measured: 0.3 MiB (the runner's 10,000 block latencies); keeping every frame
# (8x8 pixels each) instead would add 5.9 MiB.
RSS_GROWTH_LIMIT = 3 << 20
BRANCH = "main"
STATM = Path("/proc/self/statm")


def resident_bytes() -> int:
    """This process's resident set size now (Linux)."""
    return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak_config(tmp_path: Path, frames_per_block: int, tokens_per_frame: int,
                page_tokens: int | None):
    args = dict(num_layers=1, num_kv_heads=1, head_size=4, tokens_per_frame=tokens_per_frame,
                frames_per_block=frames_per_block, window_frames=4, sink_frames=1,
                num_steps=1, session_capacity=1)
    return build_config({
        "pipeline": {"entry": "ardiff.pipelines.synthetic:SyntheticAttention", "args": args},
        "runtime": {"device": "cpu", "memory_budget": "1MiB", "kv": {"page_tokens": page_tokens}},
        "warmup": {"enabled": False},
        "rollout": {"frames": SOAK_FRAMES, "prompt": "soak"},
        "output": {"path": str(tmp_path / "unused.npy")}})


def check_pool(runner: Runner, session_id: str, committed_frames: int) -> None:
    cache, plan = runner.cache, runner.plan
    table = cache._sessions[session_id].branches[BRANCH].table
    kept = min(committed_frames, plan.history_frames_per_branch)
    assert table.num_committed_frames == committed_frames     # positions stay absolute
    assert table.num_frames == kept <= plan.history_frames_per_branch
    assert cache.pool.num_used == table.num_pages == kept * plan.pages_per_frame
    assert cache.pool.num_used <= plan.session_capacity * plan.history_pages_per_session
    assert cache.pool.peak_used <= plan.total_pages


@pytest.mark.slow
@pytest.mark.skipif(not STATM.exists(), reason="needs /proc/self/statm (Linux)")
@pytest.mark.parametrize("frames_per_block, tokens_per_frame, page_tokens", [
    (1, 1, None),   # one frame per block, one token per page
    (3, 3, 2),      # blocks of 3 frames, each frame on 2 pages (3 tokens, 2 per page)
], ids=["block1", "block3-two-pages-per-frame"])
def test_a_10000_frame_rollout_keeps_the_pool_bounded_and_rss_flat(
        tmp_path, frames_per_block, tokens_per_frame, page_tokens):
    config = soak_config(tmp_path, frames_per_block, tokens_per_frame, page_tokens)
    runner = build_runner(config)
    plan = plan_rollout(config, runner.cache.spec, frames_per_block)
    baseline = None
    try:
        for event in iter_rollout(runner, plan):
            committed = (event.block_index + 1) * frames_per_block  # the last block is cut
            check_pool(runner, event.stream.session_id, committed)
            if baseline is None and event.frames_written >= RSS_BASELINE_FRAMES:
                baseline = resident_bytes()
        growth = resident_bytes() - baseline
    finally:
        runner.close()

    assert event.frames_written == SOAK_FRAMES
    assert len(runner.block_latencies_s) == plan.blocks_per_stream
    assert runner.cache.pool.num_used == 0 and runner.stats().sessions["closed"] == 1
    assert growth <= RSS_GROWTH_LIMIT, f"RSS grew by {growth / 2**20:.1f} MiB"
