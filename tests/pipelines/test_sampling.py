"""How the shipped pipelines sample (ardiff/pipelines/sampling.py): seeded block noise, the
flow-matching steps, and the warmup-block count, on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

import ardiff
from ardiff.pipelines.sampling import (SEED_STRIDE, block_noise, flow_step, noise_levels,
                                       sample, warmup_blocks)

CPU = torch.device("cpu")


def spec(sink_frames: int, window_frames: int, frames_per_block: int):
    return ardiff.ARDiffusionKVCacheSpec(
        num_layers=1, num_kv_heads=1, head_size=8, tokens_per_frame=4,
        frames_per_block=frames_per_block, window_frames=window_frames,
        sink_frames=sink_frames, session_capacity=1,
        kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),))


def test_block_noise_is_named_by_seed_and_start_frame():
    noise = block_noise((2, 3), seed=4, start_frame=7, device=CPU, dtype=torch.float32)
    expected = torch.randn((2, 3), generator=torch.Generator().manual_seed(4 * SEED_STRIDE + 7))
    assert torch.equal(noise, expected)
    assert not torch.equal(noise, block_noise((2, 3), 4, 8, CPU, torch.float32))
    assert not torch.equal(noise, block_noise((2, 3), 5, 7, CPU, torch.float32))


def test_block_noise_is_drawn_in_float32_then_cast():
    low = block_noise((16,), 0, 0, CPU, torch.bfloat16)
    assert low.dtype == torch.bfloat16
    assert torch.equal(low, block_noise((16,), 0, 0, CPU, torch.float32).to(torch.bfloat16))


def test_noise_levels_run_from_noise_to_clean():
    assert noise_levels(4) == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_a_step_lands_on_the_line_between_the_prediction_and_x():
    clean, noise = torch.tensor([2.0]), torch.tensor([-2.0])
    x_half = flow_step(noise, clean, t=1.0, t_next=0.5)
    assert x_half.item() == 0.0   # (1 - 0.5) * clean + 0.5 * noise
    assert flow_step(x_half, clean, t=0.5, t_next=0.0).item() == 2.0


def test_sample_asks_for_one_prediction_per_level_and_returns_it_clean():
    asked = []

    def predict_clean(x: torch.Tensor, t: float) -> torch.Tensor:
        asked.append((x.item(), t))
        return torch.tensor([2.0])

    out = sample(torch.tensor([-2.0]), predict_clean, num_steps=2)
    assert asked == [(-2.0, 1.0), (0.0, 0.5)]
    assert out.item() == 2.0


@pytest.mark.parametrize("sink, window, block, expected", [
    (1, 9, 3, 5),    # ceil(10 / 3) = 4 blocks fill sink and window, the 5th evicts
    (0, 5, 1, 6),
    (1, 8, 2, 6),    # ceil(9 / 2) = 5
    (0, 4, 4, 2),
])
def test_warmup_blocks_fill_sink_and_window_then_evict_once(sink, window, block, expected):
    assert warmup_blocks(spec(sink, window, block)) == expected


def test_warmup_requests_fill_the_window_reset_first_and_guide_when_asked():
    from ardiff.pipelines.sampling import WARMUP_GUIDANCE, warmup_requests

    main = (ardiff.ARDiffusionKVBranchSpec("m", 0),)
    spec = ardiff.ARDiffusionKVCacheSpec(1, 1, 4, 2, 2, 5, main, 1, sink_frames=1)
    plain = warmup_requests(spec, "w")
    assert len(plain) == 4  # ceil((1 + 5) / 2) + 1
    assert [r.reset for r in plain] == [True, False, False, False]
    assert {r.session_id for r in plain} == {"w"} and {r.guidance_scale for r in plain} == {1.0}
    assert {r.guidance_scale for r in warmup_requests(spec, "w", guided=True)} == {WARMUP_GUIDANCE}
