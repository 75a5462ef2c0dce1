"""The hand-written loop `ardiff bench` measures ardiff against (bouncing/reference.py) makes
the frames ardiff makes, bit for bit, from the same weights: through the window's wrap-around,
with a sink, and for every action."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ardiff
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan
from ardiff.pipelines.bouncing import BouncingWorld, sim
from ardiff.pipelines.bouncing.reference import KVRing, ReferenceLoop

FRAMES = 11  # 4 start frames, then 7 sampled: the 4-frame ring wraps around


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ardiff_frames(pipe: BouncingWorld, seed: int, actions: list[str]) -> torch.Tensor:
    plan = make_plan(get_spec(pipe), "float32", 1, 1 << 24, max_sessions=1)
    runner = Runner(pipe, create_cache(plan, "paged", "cpu", poison=True))
    try:
        return torch.cat([runner.execute(ardiff.RolloutRequest(
            "s", block_index=i, seed=seed, actions=(a,))).output.frames
            for i, a in enumerate(actions)])
    finally:
        runner.close()


@pytest.mark.parametrize("args", [{}, {"sink_frames": 1, "window_frames": 4}])
def test_the_reference_loop_makes_ardiffs_frames_bit_for_bit(args):
    pipe = BouncingWorld(**args)
    pipe.load("cpu", torch.float32)
    actions = [sim.ACTIONS[i % len(sim.ACTIONS)] for i in range(FRAMES)]
    loop = ReferenceLoop(pipe.model, pipe.config)
    ours = torch.cat([loop.step(7, a) for a in actions])

    assert ours.dtype == torch.uint8 and ours.shape == (FRAMES, 256, 256, 3)
    assert torch.equal(ours, ardiff_frames(pipe, 7, actions))


def test_the_ring_shows_the_last_frames_oldest_first_as_one_slice():
    config = dataclasses.replace(BouncingWorld().config, window_frames=4, sink_frames=1)
    ring = KVRing(config, "cpu", torch.float32)
    tokens = config.tokens_per_frame
    for frame in range(9):
        ring.write(frame, torch.full((tokens, config.num_heads, config.head_size), float(frame)))
        sink, recent = ring.visible(frame + 1)
        seen = [int(x) for x in torch.cat([sink, recent])[::tokens, 0, 0]]
        # the sink frame 0, then the last window - 1 = 3 frames before the next one
        assert seen == [0] + list(range(max(1, frame - 2), frame + 1))
        storage = ring.data.untyped_storage().data_ptr()
        assert recent.untyped_storage().data_ptr() == storage  # a view: nothing gathered
