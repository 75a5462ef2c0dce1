"""The action module's per-session caches and the action track, against references written
here from the released semantics (the in-repo reference CI runs; the released code itself is
test_release_source.py's):

    caches  block by block with the kept K/V (window - block frames) equals one dense pass
            over every frame where latent frame j's queries see the frames of
            [end - window, end) of its block (end: the block's last frame + 1), written with
            explicit softmax, over 4 blocks (eviction from block 2)
    track   each latent frame's action window equals the released streaming demo's
            `cond_current` writes (a block's action over its 9 or 12 video frames) sliced
            as its ActionModule slices them (frames before 0: frame 0's)
"""

from __future__ import annotations

import math

import pytest
import torch

from ardiff.pipelines.matrix_game.action_module import ActionModule, keep_last
from ardiff.pipelines.matrix_game.actions import SPACES
from ardiff.pipelines.matrix_game.make_tiny import TINY, model_config
from ardiff.pipelines.matrix_game.track import ActionTrack

WINDOW, BLOCK, BLOCKS, GRID = 6, 3, 4, (2, 3)


def rope(x: torch.Tensor, positions: torch.Tensor, dims: list[int], theta: float):
    """Interleaved-pair RoPE on the first `dims[0]` dims at `positions` (x [..., T, H, D])."""
    half = dims[0] // 2
    freqs = 1.0 / (theta ** (torch.arange(0, dims[0], 2)[:half].float() / dims[0]))
    angles = positions.float()[:, None] * freqs[None]  # [T, half]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # [T, 1, half]
    out = x.clone()
    even, odd = x[..., 0:dims[0]:2], x[..., 1:dims[0]:2]
    out[..., 0:dims[0]:2] = even * cos - odd * sin
    out[..., 1:dims[0]:2] = even * sin + odd * cos
    return out


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def softmax_attend(q, k, v, visible):
    """q [T, H, D], k/v [T', H, D], visible [T, T'] bool."""
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def dense(module: ActionModule, x, mouse, keyboard, config) -> torch.Tensor:
    """Every frame at once: x [T, S, dim], mouse [T, 24], keyboard [T, 12, keys]."""
    frames, tokens, _ = x.shape
    ends = torch.tensor([(j // BLOCK + 1) * BLOCK for j in range(frames)])
    span = torch.arange(frames)
    visible = (span[None] < ends[:, None]) & (span[None] >= ends[:, None] - WINDOW)
    dims, theta = config["mouse_qk_dim_list"], float(config["rope_theta"])
    heads = config["heads_num"]
    positions = torch.arange(frames)
    out = x.clone()
    for s in range(tokens):  # mouse: each token over its own position's frames
        h = module.mouse_mlp(torch.cat([x[:, s], mouse], dim=-1))
        q, k, v = module.t_qkv(h).view(frames, 3, heads, -1).unbind(1)
        q, k = rope(rms(q), positions, dims, theta), rope(rms(k), positions, dims, theta)
        out[:, s] = x[:, s] + module.proj_mouse(softmax_attend(q, k, v, visible).flatten(1))
    embedded = module.keyboard_embed(keyboard).flatten(1)  # [T, 12 * hidden]
    k, v = module.keyboard_attn_kv(embedded).view(frames, 2, heads, -1).unbind(1)
    k = rope(rms(k), positions, dims, theta)
    final = out.clone()
    for s in range(tokens):
        q = rope(rms(module.mouse_attn_q(out[:, s]).view(frames, heads, -1)), positions, dims,
                 theta)
        final[:, s] = out[:, s] + module.proj_keyboard(softmax_attend(q, k, v, visible)
                                                       .flatten(1))
    return final


def test_blocks_with_kept_action_kv_equal_one_dense_pass():
    config = model_config("universal", TINY)["action_config"]
    torch.manual_seed(0)
    module = ActionModule(config, TINY["dim"]).eval()
    frames, tokens = BLOCK * BLOCKS, GRID[0] * GRID[1]
    x = torch.randn(frames, tokens, TINY["dim"])
    mouse = torch.randn(frames, 4 * config["windows_size"] * 2) * 0.1
    keyboard = (torch.rand(frames, 4 * config["windows_size"], 4) > 0.5).float()
    with torch.no_grad():
        expected = dense(module, x, mouse, keyboard, config)
        kept = None
        for block in range(BLOCKS):
            rows = slice(BLOCK * block, BLOCK * block + BLOCK)
            out, new = module(x[rows].reshape(1, -1, TINY["dim"]), GRID, [BLOCK * block],
                              mouse[None, rows], keyboard[None, rows], [kept])
            kept = keep_last(kept, new[0], WINDOW - BLOCK)
            error = (out[0].view(BLOCK, tokens, -1) - expected[rows]).abs().max()
            assert float(error / expected[rows].abs().max()) < 1e-5, (block, float(error))


def released_windows(space, actions: list[str], window: int = 3):
    """The demo's per-video-frame conditions after `cond_current` for each block, then the
    ActionModule's groups: latent j reads padded frames [4 (j - window) + pad, 4 j + pad)."""
    latent = BLOCK * len(actions)
    keyboard = torch.zeros(1 + 4 * (latent - 1), len(space.keyboard))
    mouse = torch.zeros(1 + 4 * (latent - 1), 2)
    for block, action in enumerate(actions):
        start = BLOCK * block
        count = 1 + 4 * (BLOCK - 1) if start == 0 else 4 * BLOCK
        final = 1 + 4 * (start + BLOCK - 1)
        k, m = space.vectors(action)
        keyboard[final - count:final] = torch.tensor(k)
        mouse[final - count:final] = torch.tensor(m)
    pad = 4 * window
    keyboard = torch.cat([keyboard[:1].expand(pad, -1), keyboard])
    mouse = torch.cat([mouse[:1].expand(pad, -1), mouse])
    return ([keyboard[4 * (j - window) + pad:4 * j + pad] for j in range(latent)],
            [mouse[4 * (j - window) + pad:4 * j + pad].flatten() for j in range(latent)])


@pytest.mark.parametrize("mode", ["universal", "gta_drive", "templerun"])
def test_the_track_gives_the_released_action_windows(mode):
    space = SPACES[mode]
    names = space.names
    actions = [names[1], names[-1], space.idle, names[len(names) // 2], names[2]]
    keyboard, mouse = released_windows(space, actions)
    track = ActionTrack()
    for block, action in enumerate(actions):
        track.write(space, BLOCK * block, BLOCK, [action])
        mine_k, mine_m = track.windows(BLOCK * block, BLOCK, 3)
        for i in range(BLOCK):
            j = BLOCK * block + i
            assert torch.equal(mine_k[i], keyboard[j]), (block, i)
            assert torch.equal(mine_m[i], mouse[j]), (block, i)
