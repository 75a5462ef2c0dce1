"""The plugin API by example: an action-conditioned world model, loaded by file path
(`entry: ../examples/plugin_world_model.py:ActionWorldModel`, configs/plugin-world.yaml).

Each frame's action (`none`, `left`, `right`, `up`, `down`) becomes *register tokens*:
keys and values the block attends to but never commits (`max_scratch_tokens_per_branch`).
Pixels are the latent space; positions are absolute frames (`blk.start_frame`); a block
is a few flow-matching steps (probes) and one commit. Weights are seeded and untrained.
It uses only what `import ardiff` exports, and owns its layers on purpose: the shipped
pipelines' shared parts (`ardiff.pipelines.shared`) are not public API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import ardiff

ACTIONS = ("none", "left", "right", "up", "down")


@dataclass(frozen=True)
class WorldConfig:
    size: int = 16              # frame side in pixels (the model's own resolution)
    patch: int = 4
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    frames_per_block: int = 1   # one frame per block: an action takes effect at once
    window_frames: int = 8
    sink_frames: int = 1
    num_steps: int = 3
    registers_per_action: int = 4  # register tokens that carry each frame's action
    upscale: int = 8            # output frames are size * upscale pixels (nearest neighbour)
    session_capacity: int = 2
    seed: int = 0

    @property
    def grid(self) -> int:
        return self.size // self.patch

    @property
    def head_size(self) -> int:
        return self.dim // self.num_heads


def sinusoid(position: torch.Tensor, dim: int) -> torch.Tensor:
    """[n] positions -> [n, dim] sinusoidal features."""
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(dim // 2) / (dim // 2))
    angles = position.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class WorldNet(nn.Module):
    def __init__(self, c: WorldConfig) -> None:
        super().__init__()
        self.c = c
        patch_dim = 3 * c.patch * c.patch
        self.inp, self.out = nn.Linear(patch_dim, c.dim), nn.Linear(c.dim, patch_dim)
        self.cell = nn.Parameter(torch.randn(c.grid * c.grid, c.dim) * 0.5)
        self.action = nn.Embedding(len(ACTIONS), c.registers_per_action * c.dim)
        self.time = nn.Linear(c.dim, c.dim)
        self.norms = nn.ModuleList(nn.LayerNorm(c.dim) for _ in range(c.num_layers))
        self.qkv = nn.ModuleList(nn.Linear(c.dim, 3 * c.dim) for _ in range(c.num_layers))
        self.proj = nn.ModuleList(nn.Linear(c.dim, c.dim) for _ in range(c.num_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(c.dim), nn.Linear(c.dim, 2 * c.dim),
                                               nn.GELU(), nn.Linear(2 * c.dim, c.dim))
                                 for _ in range(c.num_layers))

    def forward(self, frames: torch.Tensor, t: float, actions: torch.Tensor, blk) -> torch.Tensor:
        """frames [F, 3, size, size] at noise level t, actions [F] ids -> clean frames."""
        c, num_frames = self.c, frames.shape[0]
        tokens = F.unfold(frames, c.patch, stride=c.patch).transpose(1, 2)  # [F, cells, patch_dim]
        position = sinusoid(torch.arange(num_frames) + blk.start_frame, c.dim).to(frames)
        h = self.inp(tokens) + self.cell + position[:, None]
        h = (h + self.time(sinusoid(torch.tensor([t * 1000.0]), c.dim).to(frames))).flatten(0, 1)
        # [F * registers_per_action, dim]: each frame's action as a few register tokens
        registers = (self.action(actions).unflatten(-1, (c.registers_per_action, c.dim))
                     + position[:, None]).flatten(0, 1)
        for layer in range(c.num_layers):
            q, k, v = self.qkv[layer](self.norms[layer](h)).unflatten(
                -1, (3, c.num_heads, c.head_size)).unbind(1)
            _, rk, rv = self.qkv[layer](registers).unflatten(
                -1, (3, c.num_heads, c.head_size)).unbind(1)
            attended = blk.attend(layer, q, k, v, extra_k=rk, extra_v=rv)
            h = h + self.proj[layer](attended.flatten(-2))
            h = h + self.mlp[layer](h)
        patches = self.out(h).unflatten(0, (num_frames, -1)).transpose(1, 2)
        return F.fold(patches, (c.size, c.size), c.patch, stride=c.patch)


# Subclassing ardiff.ARDiffusionPipelineBase is optional: it supplies the contract's no-op
# defaults (load, bind, reset, close; warmup, overridden below). ardiff checks methods, not
# the class, so writing those four methods yourself works just as well.
class ActionWorldModel(ardiff.ARDiffusionPipelineBase):
    """The pipeline: one branch, actions as register tokens, no text. All of its per-session
    state is its KV history, which ardiff owns, so the session hooks stay the base's no-ops."""

    action_names = ACTIONS  # declared for `ardiff play` (the keys it maps)

    def __init__(self, **config) -> None:
        self.c = WorldConfig(**config)
        self.net: WorldNet | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        c = self.c
        return ardiff.ARDiffusionKVCacheSpec(
            num_layers=c.num_layers, num_kv_heads=c.num_heads, head_size=c.head_size,
            tokens_per_frame=c.grid * c.grid, frames_per_block=c.frames_per_block,
            window_frames=c.window_frames, sink_frames=c.sink_frames,
            session_capacity=c.session_capacity,
            kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),),
            max_scratch_tokens_per_branch=c.frames_per_block * c.registers_per_action)

    def load(self, device, dtype) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.c.seed)
            net = WorldNet(self.c)
        self.device, self.dtype = torch.device(device), dtype
        self.net = net.to(self.device, dtype).eval()

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Blocks that fill the sink and the window, plus one that evicts (ardiff's rule)."""
        c = self.c
        blocks = math.ceil((c.sink_frames + c.window_frames) / c.frames_per_block) + 1
        return [ardiff.RolloutRequest(session_id, block_index=i, actions=("right",), reset=i == 0)
                for i in range(blocks)]

    def action_ids(self, actions: tuple[str, ...] | None) -> torch.Tensor:
        """One action per frame of the block; a single action applies to every frame."""
        names = list(actions or ("none",))
        for name in names:
            if name not in ACTIONS:
                raise ardiff.ConfigError(f"rollout.actions: {name!r} is not an action; use one "
                                         f"of {', '.join(ACTIONS)}")
        names = (names * self.c.frames_per_block)[:self.c.frames_per_block]
        return torch.tensor([ACTIONS.index(n) for n in names], device=self.device)

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        if self.net is None:
            self.load("cpu", torch.float32)
        c = self.c
        actions = self.action_ids(request.actions)
        start = state.num_committed_frames("main")
        generator = torch.Generator().manual_seed(request.seed * 1_000_003 + start)
        x = torch.randn(c.frames_per_block, 3, c.size, c.size, generator=generator)
        x = x.to(self.device, self.dtype)
        levels = torch.linspace(1.0, 0.0, (request.num_steps or c.num_steps) + 1).tolist()
        for t, t_next in zip(levels[:-1], levels[1:]):
            with state.block("main") as blk:  # a probe: the net predicts the clean frames
                clean = self.net(x, t, actions, blk)
            x = clean + t_next * (x - clean) / t  # flow matching: x_t = (1 - t) clean + t noise
        with state.block("main", commit=True) as blk:
            self.net(x, 0.0, actions, blk)
        rgb = torch.tanh(x.float()).add(1).mul(127.5).round().clamp(0, 255).to(torch.uint8)
        big = rgb.repeat_interleave(c.upscale, dim=2).repeat_interleave(c.upscale, dim=3)
        return ardiff.BlockOutput(frames=big.permute(0, 2, 3, 1).contiguous())
