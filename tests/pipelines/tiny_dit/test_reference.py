"""The tiny DiT's hand-written loop (tiny_dit/reference.py) makes the frames ardiff makes, bit
for bit, from the same weights: through the window's wrap-around, with the sink, across a
prompt switch."""

from __future__ import annotations

import pytest
import torch

import ardiff
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan
from ardiff.pipelines.tiny_dit import TinyCausalDiT
from ardiff.pipelines.tiny_dit.reference import TinyDiTLoop

BLOCKS = 6  # 18 frames: the 6-frame ring (window 9, blocks of 3) wraps around twice


pytestmark = pytest.mark.usefixtures("one_thread")


def requests() -> list[ardiff.RolloutRequest]:
    return [ardiff.RolloutRequest("s", block_index=i, seed=3, num_steps=2,
                                  prompt="a red ball" if i < 4 else "a blue cube")
            for i in range(BLOCKS)]


@pytest.mark.parametrize("args", [{"frames_per_block": 3, "window_frames": 9, "sink_frames": 1},
                                  {"frames_per_block": 2, "window_frames": 4, "sink_frames": 0}])
def test_the_tiny_dit_loop_makes_ardiffs_frames_bit_for_bit(args):
    pipe = TinyCausalDiT(**args)
    pipe.load("cpu", torch.float32)
    plan = make_plan(get_spec(pipe), "float32", 1, 1 << 26, max_sessions=1)
    runner = Runner(pipe, create_cache(plan, "paged", "cpu", poison=True))
    try:
        theirs = torch.cat([runner.execute(r).output.frames for r in requests()])
    finally:
        runner.close()
    loop = TinyDiTLoop(pipe, pipe.config)
    ours = torch.cat([loop.step(r) for r in requests()])

    assert ours.shape == theirs.shape and ours.shape[0] == BLOCKS * args["frames_per_block"]
    assert torch.equal(ours, theirs)
