"""How the shipped pipelines sample (ardiff/pipelines/shared/sampling.py): seeded block noise
and the flow-matching steps, on hand-computed cases."""

from __future__ import annotations

import torch

from ardiff.pipelines.shared.sampling import (
    SEED_STRIDE,
    block_noise,
    flow_step,
    noise_levels,
    sample,
)

CPU = torch.device("cpu")


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
