"""`ARDiffusionPipelineBase` (ardiff/contract/base.py): a subclass that writes only the spec and
`generate_block` loads, warms up and runs; the base stays optional; the default warmup fills
the sink and the window and evicts once."""

from __future__ import annotations

import contextlib

import pytest
import torch
from upstream_pipeline import UpstreamStylePipeline

import ardiff
from ardiff.contract.base import WARMUP_GUIDANCE, warmup_blocks, warmup_requests
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import WARMUP_SESSION_ID, Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan

# 1 layer x 1 head x 4 dims, 2 tokens per frame, blocks of 2 frames, a 4-frame window, sink 1.
SPEC = ardiff.ARDiffusionKVCacheSpec(1, 1, 4, 2, 2, 4, (ardiff.ARDiffusionKVBranchSpec("main", 0),),
                                     2, sink_frames=1)


class Minimal(ardiff.ARDiffusionPipelineBase):
    """Only what the base cannot know: the spec, and a block that commits its frames' K/V."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, int]] = []

    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        return SPEC

    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        with state.block("main", commit=True) as blk:
            x = torch.zeros(SPEC.frames_per_block * SPEC.tokens_per_frame, 1, 4)
            blk.attend(0, x, x, x)  # [tokens, heads, head_size]
            start = blk.start_frame
        self.starts.append((request.session_id, start))
        return ardiff.BlockOutput(torch.full((2, 4, 4, 3), start, dtype=torch.uint8))


class NoWarmup(Minimal):
    ar_diffusion_warmup_requests = None  # how a subclass declines the default warmup


def runner_for(pipeline) -> Runner:
    plan = make_plan(get_spec(pipeline), "float32", 1, 1 << 20, max_sessions=1)
    return Runner(pipeline, create_cache(plan, "paged", "cpu", poison=True))


def test_the_defaults_are_the_contracts_no_ops():
    pipe = Minimal()
    assert pipe.load("cpu", torch.float32) is None
    assert isinstance(pipe.bind_ar_diffusion_state("s", None), contextlib.nullcontext)
    assert pipe.reset_ar_diffusion_session("s") is None
    assert pipe.close_ar_diffusion_session("s") is None
    for protocol in (ardiff.SupportsARDiffusionPipeline, ardiff.SupportsARDiffusionWarmup,
                     ardiff.SupportsARDiffusionBlockGeneration):
        assert isinstance(pipe, protocol)


def test_a_subclass_without_the_spec_or_the_forward_cannot_be_built():
    class NoForward(ardiff.ARDiffusionPipelineBase):
        def ar_diffusion_kv_cache_spec(self):
            return SPEC

    with pytest.raises(TypeError, match="generate_block"):
        NoForward()


def test_a_minimal_subclass_warms_up_then_runs_through_the_runner():
    runner = runner_for(Minimal())
    try:
        report = runner.warmup()
        assert report.skipped_reason is None and report.leaked_pages == 0
        assert len(report.latencies_s) == warmup_blocks(SPEC) == 4  # ceil((1 + 4) / 2) + 1
        runner.execute(ardiff.RolloutRequest("a", block_index=0))
        second = runner.execute(ardiff.RolloutRequest("a", block_index=1)).output
    finally:
        runner.close()
    assert second.frames[0, 0, 0, 0].item() == 2
    assert runner.pipeline.starts == [(WARMUP_SESSION_ID, f) for f in (0, 2, 4, 6)] + [
        ("a", 0), ("a", 2)]


def test_none_declines_the_default_warmup():
    pipe = NoWarmup()
    assert not isinstance(pipe, ardiff.SupportsARDiffusionWarmup)
    runner = runner_for(pipe)
    try:
        assert "no warmup" in runner.warmup().skipped_reason
    finally:
        runner.close()
    assert pipe.starts == []


def test_the_base_is_optional():
    # A pipeline written from the upstream contract alone subclasses nothing of ardiff's and
    # still runs (tests/contract/test_upstream_contract.py runs it end to end).
    assert not issubclass(UpstreamStylePipeline, ardiff.ARDiffusionPipelineBase)
    runner = runner_for(UpstreamStylePipeline())
    try:
        assert len(runner.warmup().latencies_s) == 5
        frames = runner.execute(ardiff.RolloutRequest("a", block_index=0)).output.frames
    finally:
        runner.close()
    assert frames.shape == (2, 8, 8, 3)


@pytest.mark.parametrize("sink, window, block, expected", [
    (1, 9, 3, 5),    # ceil(10 / 3) = 4 blocks fill sink and window, the 5th evicts
    (0, 5, 1, 6),
    (1, 8, 2, 6),    # ceil(9 / 2) = 5
    (0, 4, 4, 2),
])
def test_warmup_blocks_fill_sink_and_window_then_evict_once(sink, window, block, expected):
    spec = ardiff.ARDiffusionKVCacheSpec(
        num_layers=1, num_kv_heads=1, head_size=8, tokens_per_frame=4,
        frames_per_block=block, window_frames=window, sink_frames=sink, session_capacity=1,
        kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),))
    assert warmup_blocks(spec) == expected


def test_warmup_requests_fill_the_window_reset_first_and_guide_when_asked():
    main = (ardiff.ARDiffusionKVBranchSpec("m", 0),)
    spec = ardiff.ARDiffusionKVCacheSpec(1, 1, 4, 2, 2, 5, main, 1, sink_frames=1)
    plain = warmup_requests(spec, "w")
    assert len(plain) == 4  # ceil((1 + 5) / 2) + 1
    assert [r.reset for r in plain] == [True, False, False, False]
    assert {r.session_id for r in plain} == {"w"} and {r.guidance_scale for r in plain} == {1.0}
    assert {r.guidance_scale for r in warmup_requests(spec, "w", guided=True)} == {WARMUP_GUIDANCE}
    assert Minimal().ar_diffusion_warmup_requests("w") == warmup_requests(SPEC, "w")
