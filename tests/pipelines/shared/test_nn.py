"""The model parts the shipped pipelines share (ardiff/pipelines/shared/nn.py), on hand-computed cases:
adaLN's named layout, patch order, rotation, timestep embedding."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ardiff.pipelines.shared.nn import (
    AdaLN,
    Modulation,
    Patches,
    Rope,
    RotaryEmbedding,
    TimestepEmbedding,
    rotate,
    timestep_embedding,
)


def adaln_with_bias(dim: int, num_sets: int, gated: bool = True) -> AdaLN:
    """An AdaLN whose output is its bias, 0, 1, 2, ...: each part is visible by value."""
    layer = AdaLN(dim, num_sets, gated=gated)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.copy_(torch.arange(layer.out_features, dtype=torch.float32))
    return layer


def test_adaln_names_shift_scale_gate_in_layout_order():
    attn, mlp = adaln_with_bias(dim=2, num_sets=2)(torch.ones(1, 2))
    assert attn.shift.tolist() == [[0, 1]] and attn.scale.tolist() == [[2, 3]]
    assert attn.gate.tolist() == [[4, 5]] and mlp.shift.tolist() == [[6, 7]]
    assert mlp.scale.tolist() == [[8, 9]] and mlp.gate.tolist() == [[10, 11]]


def test_an_ungated_adaln_gives_shift_and_scale_only():
    (final,) = adaln_with_bias(dim=2, num_sets=1, gated=False)(torch.ones(1, 2))
    assert final.shift.tolist() == [[0, 1]] and final.scale.tolist() == [[2, 3]]
    assert final.gate is None


def test_zero_init_starts_as_the_identity_with_closed_gates():
    (mod,) = AdaLN(4, 1, zero_init=True)(torch.randn(3, 4))
    x = torch.randn(3, 4)
    assert torch.equal(mod.modulate(x), x) and not mod.gate.any()


def test_adaln_keeps_the_names_and_the_seeded_init_of_the_linear_it_replaced():
    torch.manual_seed(0)
    linear = nn.Linear(4, 2 * 3 * 4)
    torch.manual_seed(0)
    adaln = AdaLN(4, num_sets=2)
    assert set(adaln.state_dict()) == {"weight", "bias"}
    assert torch.equal(adaln.weight, linear.weight) and torch.equal(adaln.bias, linear.bias)


def test_modulate_scales_around_one_then_shifts():
    mod = Modulation(shift=torch.tensor([1.0]), scale=torch.tensor([0.5]))
    assert mod.modulate(torch.tensor([2.0])).item() == 2.0 * 1.5 + 1.0


def test_patch_tokens_are_row_major_and_channel_major_inside():
    frame = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)  # [F, C, H, W]
    tokens = Patches(channels=2, patch=2, grid=2).patchify(frame)           # [F, 4, 8]
    assert tokens.shape == (1, 4, 8)
    # token 1 = grid row 0, column 1: pixels (0..1, 2..3) of channel 0, then of channel 1
    assert tokens[0, 1].tolist() == [2, 3, 6, 7, 18, 19, 22, 23]


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_unpatchify_inverts_patchify_for_any_leading_dims(lead):
    patches = Patches(channels=3, patch=2, grid=3)
    frames = torch.randn(*lead, 3, 6, 6)
    tokens = patches.patchify(frames)
    assert tokens.shape == (*lead, 9, patches.patch_dim)
    assert torch.equal(patches.unpatchify(tokens), frames)


def test_rotate_turns_each_pair_by_its_angle_for_every_head():
    x = torch.tensor([[[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 2.0]]])  # [1 token, 2 heads, 4]
    rope = Rope.from_angles(torch.tensor([[math.pi / 2, 0.0]]))     # [1 token, 2 pairs]
    out = rotate(x, rope)
    torch.testing.assert_close(out, torch.tensor([[[0.0, 1.0, 1.0, 0.0],
                                                  [-1.0, 0.0, 0.0, 2.0]]]))


def test_rotate_broadcasts_a_batched_rope_and_keeps_the_dtype():
    x = torch.randn(2, 5, 3, 8, dtype=torch.bfloat16)    # [B, tokens, heads, head_size]
    angles = torch.randn(2, 5, 4)
    out = rotate(x, Rope.from_angles(angles))
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[1], rotate(x[1], Rope.from_angles(angles[1])))


def test_rotary_angles_use_absolute_frames_and_the_grid_cell():
    rotary = RotaryEmbedding(head_size=16, grid=2)       # 8 pairs: 4 frame, 2 row, 2 column
    assert (rotary.frame_pairs, rotary.space_pairs) == (4, 2)
    angles = rotary.angles(start_frame=5, num_frames=2, device=torch.device("cpu"))
    assert angles.shape == (2 * 4, 8)
    assert angles[0, 0].item() == 5 and angles[4, 0].item() == 6   # frame, at frequency 1
    assert angles[3, 4].item() == 1 and angles[3, 6].item() == 1   # last cell: row 1, col 1
    assert angles[2, 4].item() == 1 and angles[2, 6].item() == 0   # row 1, col 0


def test_timestep_embedding_is_cos_then_sin_of_t_times_1000():
    emb = timestep_embedding(torch.tensor([0.0, 0.001]), dim=4)
    assert emb[0].tolist() == [1.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(emb[1], torch.tensor([math.cos(1), math.cos(0.01),
                                                     math.sin(1), math.sin(0.01)]))


def test_timestep_embedding_module_runs_in_its_weights_dtype():
    module = TimestepEmbedding(8).to(torch.bfloat16)
    assert set(module.state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert module(torch.tensor([0.5, 1.0])).dtype == torch.bfloat16
