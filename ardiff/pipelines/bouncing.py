"""A trained world model: coloured balls bouncing in a box and a sprite steered by actions.

    frame [3, 32, 32] --8x8 patches--> 16 tokens --4 x Layer--> predicted clean frame
    Layer:   adaLN from the frame's noise level -> self-attention (3-axis RoPE over frame,
             row, column; q/k RMS-norm) to the visible clean frames, the frame itself and
             the frame's action registers -> MLP
    actions: each frame's action is `registers_per_action` register tokens, passed as
             extra_k / extra_v: attended to, never committed
    blocks:  one frame per block; `context_frames` start frames rendered by the simulator
             (seeded by request.seed) are committed as clean history, then each frame is
             sampled in `num_steps` flow-matching steps (probes) and committed at t = 0

The same `Layer` modules run two ways: `forward_block` attends through the KV state
(`blk.attend`, the runtime path) and `forward_frames` attends over a batch of whole
clips with a block-causal mask (training, evaluation). Both mean the same attention:
a frame at position p sees the clean frames in (p - window_frames, p) and itself.
Weights ship inside the package (weights/bouncing.safetensors, made by
examples/train_world.py); nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ardiff
from ardiff.pipelines import bouncing_sim as sim
from ardiff.pipelines.layers import Rotary, timestep_embedding

BRANCH = "main"
WEIGHTS_PACKAGE = "ardiff.pipelines.weights"
WEIGHTS_FILE = "bouncing.safetensors"
ARCH_FIELDS = ("size", "patch", "dim", "num_layers", "num_heads", "mlp_ratio",
               "registers_per_action")


@dataclass(frozen=True)
class BouncingConfig:
    """Architecture (must match the weights), window and sampling; the spec derives from it."""

    size: int = sim.SIZE
    patch: int = 8
    dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    registers_per_action: int = 2
    window_frames: int = 5      # a frame sees the 4 frames before it: enough to read velocity
    sink_frames: int = 0
    context_frames: int = 4     # simulator start frames committed before the model takes over
    num_steps: int = 4
    upscale: int = 8            # nearest-neighbour: 32 px -> 256 px video
    session_capacity: int = 4
    max_frames: int = 1_000_000
    weights: str | None = None  # a .safetensors path; None: the weights shipped with ardiff
    cpu_threads: int | None = 1  # torch threads on CPU: one is fastest for 16-token frames

    def __post_init__(self) -> None:
        rules = [(self.size % self.patch == 0, "size", "a multiple of patch"),
                 ((self.dim // max(self.num_heads, 1)) % 8 == 0, "dim",
                  "such that dim / num_heads is a multiple of 8 (3-axis RoPE)"),
                 (self.context_frames >= 1, "context_frames", ">= 1"),
                 (self.upscale >= 1, "upscale", ">= 1")]
        for ok, name, rule in rules:
            if not ok:
                raise ardiff.ConfigError(f"pipeline.args.{name}: {getattr(self, name)!r} "
                                         f"must be {rule}")

    @property
    def grid(self) -> int:
        return self.size // self.patch

    @property
    def tokens_per_frame(self) -> int:
        return self.grid * self.grid

    @property
    def head_size(self) -> int:
        return self.dim // self.num_heads


def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """RoPE as `Rotary.apply`, batched: x [..., n, heads, hs], rope (cos, sin) [..., n, hs/2]."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = rope[0][..., None, :], rope[1][..., None, :]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).to(x.dtype)


class Layer(nn.Module):
    """adaLN self-attention + MLP. Attention itself is done by the caller (KV state or mask)."""

    def __init__(self, c: BouncingConfig) -> None:
        super().__init__()
        self.heads, self.head_size = c.num_heads, c.head_size
        self.modulation = nn.Linear(c.dim, 6 * c.dim)
        self.norm1 = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.q_norm, self.k_norm = nn.RMSNorm(c.head_size), nn.RMSNorm(c.head_size)
        self.out = nn.Linear(c.dim, c.dim)
        hidden = c.mlp_ratio * c.dim
        self.mlp = nn.Sequential(nn.Linear(c.dim, hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(hidden, c.dim))
        nn.init.zeros_(self.modulation.weight)  # adaLN-Zero: every layer starts as identity
        nn.init.zeros_(self.modulation.bias)

    def _split(self, x: torch.Tensor):
        return x.unflatten(-1, (3, self.heads, self.head_size)).unbind(-3)

    def project(self, h, mod, rope):
        """h [..., n, dim] -> rotated q, k and v [..., n, heads, head_size], all in v's dtype."""
        q, k, v = self._split(self.qkv(self.norm1(h) * (1 + mod[1]) + mod[0]))
        # Under autocast the norms and the rotation come out in fp32; attention must not.
        return (rotate(self.q_norm(q.float()), rope).to(v.dtype),
                rotate(self.k_norm(k.float()), rope).to(v.dtype), v)

    def register_kv(self, registers, rope):
        """Action registers [..., r, dim] -> their k, v [..., r, heads, head_size]."""
        _, k, v = self._split(self.qkv(registers))
        return rotate(self.k_norm(k.float()), rope).to(v.dtype), v

    def finish(self, h, attended, mod):
        """Residual update from the attention output [..., n, heads, head_size], then the MLP."""
        h = h + mod[2] * self.out(attended.flatten(-2))
        return h + mod[5] * self.mlp(self.norm2(h) * (1 + mod[4]) + mod[3])


@dataclass
class FrameInputs:
    """What every forward of the frames at `positions` shares: RoPE of their tokens and,
    per layer, the K/V of their action registers [B, S, R, heads, hs]."""

    positions: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor]     # (cos, sin) [S, T, hs/2]
    registers: list[tuple[torch.Tensor, torch.Tensor]]


class BouncingDiT(nn.Module):
    """The denoiser: predicts clean frames (pixels in [-1, 1]) from noisy ones and context."""

    def __init__(self, c: BouncingConfig) -> None:
        super().__init__()
        self.c = c
        patch_dim = 3 * c.patch * c.patch
        self.patch_in, self.patch_out = nn.Linear(patch_dim, c.dim), nn.Linear(c.dim, patch_dim)
        self.cell = nn.Parameter(torch.randn(c.tokens_per_frame, c.dim) * 0.02)
        self.time = nn.Sequential(nn.Linear(c.dim, c.dim), nn.SiLU(), nn.Linear(c.dim, c.dim))
        self.action = nn.Embedding(len(sim.ACTIONS), c.registers_per_action * c.dim)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.final = nn.Linear(c.dim, 2 * c.dim)
        self.final_norm = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.rotary = Rotary(c.head_size, c.grid)
        nn.init.zeros_(self.final.weight)
        nn.init.zeros_(self.final.bias)

    def conditioning(self, t: torch.Tensor):
        """Noise levels t [B, S] -> per-layer adaLN modulations and the final (shift, scale),
        each [B, S, 1, dim]. Depends on t alone, so a sampler may compute it once per level."""
        b, s = t.shape
        emb = timestep_embedding(t.flatten(), self.c.dim).to(self.final.weight.dtype)
        cond = F.silu(self.time(emb)).reshape(b, s, 1, self.c.dim)
        return ([layer.modulation(cond).chunk(6, dim=-1) for layer in self.layers],
                self.final(cond).chunk(2, dim=-1))

    def frame_inputs(self, actions: torch.Tensor, positions: torch.Tensor) -> FrameInputs:
        """actions [B, S] of the frames at absolute `positions` [S]; a register sits at its
        frame's position, row 0, column 0."""
        angles = torch.stack([self.rotary.angles(p, 1, actions.device)
                              for p in positions.tolist()])  # [S, T, hs/2]
        rope = (angles.cos(), angles.sin())
        r = self.c.registers_per_action
        register_rope = tuple(x[:, :1].expand(-1, r, -1) for x in rope)
        emb = self.action(actions).unflatten(-1, (r, self.c.dim))
        return FrameInputs(positions, rope,
                           [layer.register_kv(emb, register_rope) for layer in self.layers])

    def _tokens(self, frames):
        """frames [B, S, 3, size, size] -> patch tokens [B, S, T, dim], row-major."""
        (b, s), g, p = frames.shape[:2], self.c.grid, self.c.patch
        patches = frames.reshape(b * s, 3, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
        return self.patch_in(patches.reshape(b, s, g * g, 3 * p * p)) + self.cell

    def _run(self, frames, conditioning, inputs: FrameInputs, attend):
        """The layers over frames [B, S, ...]; attend(layer, q, k, v, rk, rv) does attention."""
        mods, (shift, scale) = conditioning
        h = self._tokens(frames)
        for index, layer in enumerate(self.layers):
            q, k, v = layer.project(h, mods[index], inputs.rope)       # [B, S, T, heads, hs]
            h = layer.finish(h, attend(index, q, k, v, *inputs.registers[index]), mods[index])
        out = self.patch_out(self.final_norm(h) * (1 + scale) + shift)
        (b, s), g, p = out.shape[:2], self.c.grid, self.c.patch
        out = out.reshape(b * s, g, g, 3, p, p).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, s, 3, self.c.size, self.c.size)

    def forward_block(self, x, conditioning, inputs: FrameInputs, blk):
        """One frame x [1, 3, size, size] attending through the KV `blk`. `conditioning` is
        `conditioning(t)` of its noise level, `inputs` the `frame_inputs` of its action at
        position blk.start_frame."""
        assert inputs.positions.tolist() == [blk.start_frame], "frame inputs of another frame"

        def attend(index, q, k, v, rk, rv):
            out = blk.attend(index, q[0, 0], k[0, 0], v[0, 0], extra_k=rk[0, 0], extra_v=rv[0, 0])
            return out[None, None]

        return self._run(x[None], conditioning, inputs, attend)[0]

    def forward_frames(self, frames, t, actions, positions, noisy):
        """A block-causal pass over clips. frames [B, S, 3, size, size] at noise levels
        t [B, S] with actions [B, S]; positions [S] (absolute frame indices) and noisy [S]
        (bool) describe the S slots: clean slots are history, noisy slots are predicted.
        Returns the clean prediction of every slot [B, S, 3, size, size]."""
        mask = self.frame_mask(positions, noisy)

        def attend(index, q, k, v, rk, rv):
            keys = torch.cat([k.flatten(1, 2), rk.flatten(1, 2)], dim=1).transpose(1, 2)
            values = torch.cat([v.flatten(1, 2), rv.flatten(1, 2)], dim=1).transpose(1, 2)
            out = F.scaled_dot_product_attention(q.flatten(1, 2).transpose(1, 2), keys, values,
                                                 attn_mask=mask)     # [B, heads, S*T, hs]
            return out.transpose(1, 2).unflatten(1, (len(positions), -1))

        return self._run(frames, self.conditioning(t), self.frame_inputs(actions, positions),
                         attend)

    def frame_mask(self, positions: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
        """[S*T, S*T + S*R] bool over [frame tokens | registers]: a slot sees itself, its own
        registers, and the clean slots a block at its position sees through the KV cache
        (the sink, and positions in (p - window_frames, p))."""
        c, s = self.c, len(positions)
        p_q, p_k = positions[:, None], positions[None, :]
        history = (p_k < p_q) & ~noisy[None, :] & ((p_k > p_q - c.window_frames)
                                                    | (p_k < c.sink_frames))
        own = torch.eye(s, dtype=torch.bool, device=positions.device)
        tokens = c.tokens_per_frame
        frames = (history | own).repeat_interleave(tokens, 0).repeat_interleave(tokens, 1)
        registers = own.repeat_interleave(tokens, 0).repeat_interleave(c.registers_per_action, 1)
        return torch.cat([frames, registers], dim=1)


def save_weights(model: BouncingDiT, path, metrics: dict | None = None) -> None:
    """Write bf16 weights with the architecture (and any metrics) in the metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous()
               for k, v in model.state_dict().items()}
    arch = {name: getattr(model.c, name) for name in ARCH_FIELDS}
    save_file(tensors, str(path), metadata={"config": json.dumps(arch),
                                            "metrics": json.dumps(metrics or {})})


def load_weights(c: BouncingConfig) -> BouncingDiT:
    """The model of config `c` with its trained weights (float32, CPU). Nothing is downloaded."""
    from safetensors import safe_open

    path = c.weights or str(resources.files(WEIGHTS_PACKAGE) / WEIGHTS_FILE)
    try:
        with safe_open(path, framework="pt") as f:
            arch = json.loads(f.metadata()["config"])
            tensors = {k: f.get_tensor(k).float() for k in f.keys()}
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise ardiff.PipelineLoadError(f"pipeline.args.weights: cannot read {path!r} "
                                       f"({type(exc).__name__}: {exc}); train weights with "
                                       f"examples/train_world.py") from exc
    for name in ARCH_FIELDS:
        if arch.get(name) != getattr(c, name):
            raise ardiff.ConfigError(f"pipeline.args.{name}: {getattr(c, name)!r} does not match "
                                     f"the weights ({name}={arch.get(name)!r} in {path}); drop "
                                     f"the override or retrain with examples/train_world.py")
    model = BouncingDiT(c)
    model.load_state_dict(tensors)
    return model


def to_video(x: torch.Tensor, upscale: int) -> torch.Tensor:
    """Frames [F, 3, size, size] in [-1, 1] -> uint8 [F, size*up, size*up, 3], nearest-neighbour."""
    rgb = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)
    return rgb.repeat_interleave(upscale, dim=1).repeat_interleave(upscale, dim=2).contiguous()


class BouncingWorld:
    """The pipeline: one `main` branch, one frame per block, actions as register tokens.

    Per-session model-owned state: the simulator world while it renders the start
    frames (dropped once the model takes over).
    """

    def __init__(self, **config) -> None:
        self.config = BouncingConfig(**config)
        self.model: BouncingDiT | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self._worlds: dict[str, sim.SimState] = {}
        self._levels: dict[float, tuple] = {}  # noise level -> model conditioning

    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        c = self.config
        return ardiff.ARDiffusionKVCacheSpec(
            num_layers=c.num_layers, num_kv_heads=c.num_heads, head_size=c.head_size,
            tokens_per_frame=c.tokens_per_frame, frames_per_block=1,
            window_frames=c.window_frames, sink_frames=c.sink_frames,
            session_capacity=c.session_capacity, max_model_len=c.max_frames,
            kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),),
            max_scratch_tokens_per_branch=c.registers_per_action,
            model_owned_state_bytes_per_session=sim.STATE_BYTES)

    def load(self, device, dtype: torch.dtype) -> None:
        self.device, self.dtype = torch.device(device), dtype
        if self.device.type == "cpu" and self.config.cpu_threads:
            torch.set_num_threads(self.config.cpu_threads)
        self.model = load_weights(self.config).to(self.device, dtype).eval()
        self._levels.clear()

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self._worlds.pop(session_id, None)

    def bind_ar_diffusion_state(self, session_id: str, state) -> contextlib.AbstractContextManager[None]:
        """The state reaches generate_block as its argument: nothing to bind."""
        return contextlib.nullcontext()

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self._worlds.pop(session_id, None)

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Start frames, then enough sampled frames to fill the window and evict."""
        c = self.config
        blocks = c.context_frames + c.sink_frames + c.window_frames + 1
        return [ardiff.RolloutRequest(session_id, block_index=i, actions=(sim.ACTIONS[i % 5],),
                                      reset=i == 0) for i in range(blocks)]

    def action_index(self, actions: tuple[str, ...] | None) -> int:
        """The block's one action (a block is one frame); None means `none`."""
        names = tuple(actions or ("none",))
        if len(names) != 1 or names[0] not in sim.ACTIONS:
            raise ardiff.ConfigError(f"rollout.actions: {list(names)!r} is not one action for "
                                     f"this one-frame block; use one of "
                                     f"{', '.join(sim.ACTIONS)}")
        return sim.ACTIONS.index(names[0])

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest, state) -> ardiff.BlockOutput:
        if self.model is None:
            self.load("cpu", torch.float32)
        frame, action = state.num_committed_frames(BRANCH), self.action_index(request.actions)
        inputs = self.model.frame_inputs(torch.tensor([[action]], device=self.device),
                                         torch.tensor([frame]))
        if frame < self.config.context_frames:
            x = self._start_frame(request, frame, action)
        else:
            x = self._sample(request, state, frame, inputs)
        with state.block(BRANCH, commit=True) as blk:  # the clean frame becomes history
            self.model.forward_block(x, self._conditioning(0.0), inputs, blk)
        return ardiff.BlockOutput(frames=to_video(x, self.config.upscale))

    def _conditioning(self, t: float):
        """The model's conditioning for noise level t, computed once per level."""
        if t not in self._levels:
            self._levels[t] = self.model.conditioning(torch.full((1, 1), t, device=self.device))
        return self._levels[t]

    def _start_frame(self, request, frame: int, action: int) -> torch.Tensor:
        """Frame `frame` of the simulator world named by the seed, moved by `action`."""
        sid = request.session_id
        if frame == 0:
            self._worlds[sid] = sim.SimState.from_seed(request.seed)
        elif sid not in self._worlds:
            raise ardiff.PipelineError(f"session {sid!r}: no simulator world for start frame "
                                       f"{frame}; the session must start at frame 0")
        world = sim.step(self._worlds[sid], np.array([action]))
        if frame + 1 < self.config.context_frames:
            self._worlds[sid] = world
        else:
            del self._worlds[sid]
        pixels = torch.from_numpy(sim.render(world)) * 2 - 1  # [1, 3, size, size]
        return pixels.to(self.device, self.dtype)

    def _sample(self, request, state, frame: int, inputs: FrameInputs) -> torch.Tensor:
        """num_steps flow-matching steps (x_t = (1 - t) clean + t noise), each one a probe."""
        c = self.config
        generator = torch.Generator().manual_seed(request.seed * 1_000_003 + frame)
        x = torch.randn((1, 3, c.size, c.size), generator=generator).to(self.device, self.dtype)
        levels = torch.linspace(1.0, 0.0, (request.num_steps or c.num_steps) + 1).tolist()
        for t, t_next in zip(levels[:-1], levels[1:]):
            with state.block(BRANCH) as blk:
                clean = self.model.forward_block(x, self._conditioning(t), inputs,
                                                 blk).clamp(-1, 1)
            x = clean + t_next * (x - clean) / t
        return x
