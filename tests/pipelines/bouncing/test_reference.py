"""The hand-written loop `ardiff bench` measures ardiff against (bouncing/reference.py) makes
the frames ardiff makes, bit for bit, from the same weights: through the window's wrap-around,
with a sink, and for every action."""

from __future__ import annotations

import pytest
import torch

import ardiff
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan
from ardiff.pipelines.bouncing import BouncingWorld, sim
from ardiff.pipelines.bouncing.reference import ReferenceLoop

FRAMES = 11  # 4 start frames, then 7 sampled: the 4-frame ring wraps around


pytestmark = pytest.mark.usefixtures("one_thread")


def requests(seed: int) -> list[ardiff.RolloutRequest]:
    return [ardiff.RolloutRequest("s", block_index=i, seed=seed,
                                  actions=(sim.ACTIONS[i % len(sim.ACTIONS)],))
            for i in range(FRAMES)]


def ardiff_frames(pipe, seed: int) -> torch.Tensor:
    plan = make_plan(get_spec(pipe), "float32", 1, 1 << 24, max_sessions=1)
    runner = Runner(pipe, create_cache(plan, "paged", "cpu", poison=True))
    try:
        return torch.cat([runner.execute(r).output.frames for r in requests(seed)])
    finally:
        runner.close()


@pytest.mark.parametrize("args", [{}, {"sink_frames": 1, "window_frames": 4}])
def test_the_reference_loop_makes_ardiffs_frames_bit_for_bit(args):
    pipe = BouncingWorld(**args)
    pipe.load("cpu", torch.float32)
    loop = ReferenceLoop(pipe.model, pipe.config)
    ours = torch.cat([loop.step(r) for r in requests(7)])

    assert ours.dtype == torch.uint8 and ours.shape == (FRAMES, 256, 256, 3)
    assert torch.equal(ours, ardiff_frames(pipe, 7))
