"""Matrix-Game 2.0's action module (blocks 0-14, between cross-attention and the FFN), with
its caches as per-session state. Parameter names are the released `action_model.*` ones.

    mouse     per spatial token s and latent frame j: mouse_mlp([h_(j,s) | the mouse of video
              frames 4j-12 .. 4j-1]) -> q, k, v (heads x 64) -> RMS-norm q, k (no weight, as
              released) -> RoPE at frame j -> token s attends to its own position over the
              window's frames (the block's own, all of them, and the kept ones)
    keyboard  per latent frame j: keyboard_embed(the keys of video frames 4j-12 .. 4j-1)
              -> k, v (one token a frame); every token of frame j attends to them over the
              window, with RoPE at the frames' positions

Video frames before 0 repeat frame 0's action (the released padding). What a session keeps
(`ActionHistory`): per layer the last `kept` frames' mouse K/V [S, kept, heads, hs] and
keyboard K/V [kept, heads, hs], written by the commit forward, as the released ring cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ardiff.pipelines.causal_wan.processors import rotate

VIDEO_FRAMES_PER_LATENT = 4  # vae_time_compression_ratio


class UnweightedRMSNorm(nn.Module):
    """The action module's RMS norm: it holds a weight (in the checkpoint) and never uses it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


@dataclass
class ActionHistory:
    """One session's kept action K/V, per layer index of the action blocks."""

    layers: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in self.layers.values() for t in d.values())


class ActionModule(nn.Module):
    """One block's action module (released `ActionModule`, causal inference path only)."""

    def __init__(self, config: dict[str, Any], dim: int) -> None:
        super().__init__()
        self.heads = config["heads_num"]
        self.windows = config["windows_size"]
        self.rope_dims = list(config.get("mouse_qk_dim_list") or config["rope_dim_list"])
        self.rope_theta = float(config["rope_theta"])
        hidden, key_hidden = config["hidden_size"], config["keyboard_hidden_dim"]
        self.enable_mouse = bool(config.get("enable_mouse", True))
        self.keyboard_embed = nn.Sequential(nn.Linear(config["keyboard_dim_in"], hidden),
                                            nn.SiLU(), nn.Linear(hidden, hidden))
        pad = VIDEO_FRAMES_PER_LATENT * self.windows
        if self.enable_mouse:
            c = config["mouse_hidden_dim"]
            self.mouse_mlp = nn.Sequential(nn.Linear(config["mouse_dim_in"] * pad + dim, c),
                                           nn.GELU(approximate="tanh"), nn.Linear(c, c),
                                           nn.LayerNorm(c))
            self.t_qkv = nn.Linear(c, 3 * c, bias=config["qkv_bias"])
            self.img_attn_q_norm = UnweightedRMSNorm(c // self.heads)
            self.img_attn_k_norm = UnweightedRMSNorm(c // self.heads)
            self.proj_mouse = nn.Linear(c, dim, bias=config["qkv_bias"])
        self.key_attn_q_norm = UnweightedRMSNorm(key_hidden // self.heads)
        self.key_attn_k_norm = UnweightedRMSNorm(key_hidden // self.heads)
        self.mouse_attn_q = nn.Linear(dim, key_hidden, bias=config["qkv_bias"])
        self.keyboard_attn_kv = nn.Linear(hidden * pad, 2 * key_hidden, bias=config["qkv_bias"])
        self.proj_keyboard = nn.Linear(key_hidden, dim, bias=config["qkv_bias"])

    def rope(self, start: int, frames: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(cos, sin) [1, frames, 1, head_size]: the time axis on the first rope dims, the
        released 3-axis table whose other two axes sit at position 0."""
        parts_cos, parts_sin = [], []
        positions = torch.arange(start, start + frames, dtype=torch.float32)
        for axis, dim in enumerate(self.rope_dims):
            freqs = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
            angles = torch.outer(positions if axis == 0 else torch.zeros(frames), freqs)
            parts_cos.append(angles.cos().repeat_interleave(2, dim=1))
            parts_sin.append(angles.sin().repeat_interleave(2, dim=1))
        cos, sin = torch.cat(parts_cos, dim=1), torch.cat(parts_sin, dim=1)
        return cos[None, :, None].to(device), sin[None, :, None].to(device)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], starts: Sequence[int],
                mouse: torch.Tensor | None, keyboard: torch.Tensor,
                kept: Sequence[dict[str, torch.Tensor] | None]
                ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """x [B, T*S, dim] (B sessions' blocks of T frames), mouse [B, T, 4*window*2] and
        keyboard [B, T, 4*window, keys] (each latent frame's video-frame actions), kept: per
        row the K/V its session kept (None: none yet). Returns the new x and per row this
        block's K/V (what a commit keeps)."""
        rows, tokens = x.shape[0], grid[0] * grid[1]
        frames = x.shape[1] // tokens
        new: list[dict[str, torch.Tensor]] = [{} for _ in range(rows)]
        if self.enable_mouse and mouse is not None:
            x = x + self._mouse(x, tokens, frames, starts, mouse, kept, new)
        return x + self._keyboard(x, tokens, frames, starts, keyboard, kept, new), new

    def _mouse(self, x, tokens, frames, starts, mouse, kept, new) -> torch.Tensor:
        rows = x.shape[0]
        h = x.reshape(rows, frames, tokens, -1).transpose(1, 2)  # [B, S, T, dim]
        groups = mouse[:, None].expand(rows, tokens, frames, mouse.shape[-1])
        qkv = self.t_qkv(self.mouse_mlp(torch.cat([h, groups.to(h.dtype)], dim=-1)))
        q, k, v = qkv.unflatten(-1, (3, self.heads, -1)).unbind(-3)  # [B, S, T, H, D]
        q, k = self.img_attn_q_norm(q).to(v), self.img_attn_k_norm(k).to(v)
        out = []
        for row, start in enumerate(starts):
            cos, sin = self.rope(start, frames, x.device)
            qr, kr = rotate(q[row], cos, sin), rotate(k[row], cos, sin)  # [S, T, H, D]
            new[row]["mouse_k"], new[row]["mouse_v"] = kr, v[row]
            keys, values = _with_kept(kept[row], "mouse", kr, v[row], dim=1)
            attn = F.scaled_dot_product_attention(qr.transpose(1, 2), keys.transpose(1, 2),
                                                  values.transpose(1, 2))  # [S, H, T, D]
            out.append(attn.permute(2, 0, 1, 3).flatten(2).flatten(0, 1))  # [T*S, H*D]
        return self.proj_mouse(torch.stack(out))

    def _keyboard(self, x, tokens, frames, starts, keyboard, kept, new) -> torch.Tensor:
        embedded = self.keyboard_embed(keyboard.to(x.dtype)).flatten(2)  # [B, T, pad*hidden]
        k, v = self.keyboard_attn_kv(embedded).unflatten(-1, (2, self.heads, -1)).unbind(2)
        q = self.mouse_attn_q(x).unflatten(-1, (self.heads, -1))  # [B, T*S, H, D]
        q = q.unflatten(1, (frames, tokens)).transpose(1, 2)  # [B, S, T, H, D]
        q, k = self.key_attn_q_norm(q).to(v), self.key_attn_k_norm(k).to(v)
        out = []
        for row, start in enumerate(starts):
            cos, sin = self.rope(start, frames, x.device)
            qr, kr = rotate(q[row], cos, sin), rotate(k[row:row + 1], cos, sin)[0]  # [T, H, D]
            new[row]["key_k"], new[row]["key_v"] = kr, v[row]
            keys, values = _with_kept(kept[row], "key", kr, v[row], dim=0)
            attn = F.scaled_dot_product_attention(
                qr.transpose(1, 2), keys.transpose(0, 1)[None].expand(tokens, -1, -1, -1),
                values.transpose(0, 1)[None].expand(tokens, -1, -1, -1))  # [S, H, T, D]
            out.append(attn.permute(2, 0, 1, 3).flatten(2).flatten(0, 1))  # [T*S, H*D]
        return self.proj_keyboard(torch.stack(out))


def _with_kept(kept: dict[str, torch.Tensor] | None, name: str, k: torch.Tensor,
               v: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept frames' K/V (if any) followed by this block's, along the frame axis `dim`."""
    if kept is None or f"{name}_k" not in kept:
        return k, v
    return (torch.cat([kept[f"{name}_k"], k], dim=dim),
            torch.cat([kept[f"{name}_v"], v], dim=dim))


def keep_last(kept: dict[str, torch.Tensor] | None, block: dict[str, torch.Tensor],
              frames: int) -> dict[str, torch.Tensor]:
    """The last `frames` frames of the kept K/V followed by a committed block's."""
    out = {}
    for name, value in block.items():
        dim = 1 if name.startswith("mouse") else 0
        joined = value if kept is None or name not in kept else torch.cat([kept[name], value], dim)
        out[name] = joined.narrow(dim, joined.shape[dim] - min(frames, joined.shape[dim]),
                                  min(frames, joined.shape[dim])).clone()
    return out
