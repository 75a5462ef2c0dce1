"""A tiny causal video DiT: the Wan / Self-Forcing family at toy width, untrained.

    latents [F, C, h, w] --patchify--> tokens --N x DiTBlock--> clean latents
    DiTBlock: adaLN(t) -> self-attention through blk.attend (3-axis RoPE, absolute frame
              positions) -> cross-attention to the prompt (the "text" cross-attention
              cache) -> MLP
    sampler:  num_steps flow-matching steps predicting the clean block, each a probe block, then one commit
              forward over the clean block (t = 0) whose K/V become history
    CFG:      guidance_scale > 1 runs `positive` and `negative` branches (declared when
              cfg=True) and mixes their predictions
    decoder:  latents -> RGB with the previous latent frame as per-session state

Weights are a deterministic random initialisation from `weights_seed`: the
videos carry no meaning; the model exists to exercise and measure ardiff.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

import ardiff
from ardiff.pipelines.decoder import LatentDecoder
from ardiff.pipelines.layers import DiTBlock, Rotary, timestep_embedding
from ardiff.pipelines.text import TextEncoder

TEXT_CACHE = "text"


@dataclass(frozen=True)
class TinyDiTConfig:
    """Model and window shape; the KV spec is derived from it and nothing else."""

    latent_channels: int = 4
    latent_size: int = 16       # latent height = width
    patch_size: int = 2
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2       # grouped-query attention
    mlp_ratio: int = 2
    frames_per_block: int = 3
    window_frames: int = 9
    sink_frames: int = 1
    reset_at_boundary: bool = False
    text_tokens: int = 16
    num_steps: int = 4
    upscale: int = 4            # decoder upsampling: video side = latent_size * upscale
    max_frames: int = 100_000   # RoPE positions along time
    cfg: bool = False           # declare positive/negative branches for guidance
    session_capacity: int = 4
    weights_seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.dim % self.num_heads == 0, "dim", "a multiple of num_heads"),
            (self.num_heads % self.num_kv_heads == 0, "num_heads", "a multiple of num_kv_heads"),
            (self.latent_size % self.patch_size == 0, "latent_size", "a multiple of patch_size"),
            ((self.dim // self.num_heads) % 8 == 0, "dim", "such that dim / num_heads is a "
                                                           "multiple of 8 (3-axis RoPE)"),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise ardiff.ConfigError(f"pipeline.args.{name}: {getattr(self, name)!r} must "
                                         f"be {rule}")

    @property
    def head_size(self) -> int:
        return self.dim // self.num_heads

    @property
    def grid(self) -> int:
        return self.latent_size // self.patch_size

    @property
    def tokens_per_frame(self) -> int:
        return self.grid * self.grid

    @property
    def patch_dim(self) -> int:
        return self.latent_channels * self.patch_size * self.patch_size

    @property
    def branch_names(self) -> tuple[str, ...]:
        return ("positive", "negative") if self.cfg else ("main",)


class TinyDiT(nn.Module):
    """The denoiser: one forward over one block of one branch."""

    def __init__(self, c: TinyDiTConfig) -> None:
        super().__init__()
        self.c = c
        self.patch_in = nn.Linear(c.patch_dim, c.dim)
        self.time = nn.Sequential(nn.Linear(c.dim, c.dim), nn.SiLU(), nn.Linear(c.dim, c.dim))
        self.blocks = nn.ModuleList(DiTBlock(c.dim, c.num_heads, c.num_kv_heads, c.mlp_ratio)
                                    for _ in range(c.num_layers))
        self.final_modulation = nn.Linear(c.dim, 2 * c.dim)
        self.final_norm = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.patch_out = nn.Linear(c.dim, c.patch_dim)
        self.text = TextEncoder(c.dim, c.text_tokens)
        self.rotary = Rotary(c.head_size, c.grid)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """[F, C, h, w] -> [F * grid^2, C * p * p], frame by frame, row-major."""
        p = self.c.patch_size
        f, ch, g = x.shape[0], x.shape[1], self.c.grid
        x = x.reshape(f, ch, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(f * g * g, ch * p * p)

    def unpatchify(self, tokens: torch.Tensor, num_frames: int) -> torch.Tensor:
        p, g, ch = self.c.patch_size, self.c.grid, self.c.latent_channels
        x = tokens.reshape(num_frames, g, g, ch, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(num_frames, ch, g * p, g * p)

    def text_kv(self, prompt: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        text = self.text(prompt)
        return [block.cross_kv(text) for block in self.blocks]

    def forward(self, x: torch.Tensor, t: float, blk,
                cross: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Predicted clean latents for noisy latents x [F, C, h, w] at noise level t."""
        num_frames = x.shape[0]
        angles = self.rotary.angles(blk.start_frame, num_frames, x.device)
        t_vec = torch.full((1,), t, device=x.device)
        cond = self.time(timestep_embedding(t_vec, self.c.dim).to(x.dtype))  # [1, dim]
        h = self.patch_in(self.patchify(x))
        for layer, block in enumerate(self.blocks):
            h = block(h, cond, angles, blk, layer, cross[layer])
        shift, scale = self.final_modulation(cond).chunk(2, dim=-1)
        out = self.patch_out(self.final_norm(h) * (1 + scale) + shift)
        return self.unpatchify(out, num_frames)


class TinyCausalDiT:
    """The reference text-to-video pipeline (implements the ardiff pipeline protocol)."""

    def __init__(self, **config) -> None:
        self.config = TinyDiTConfig(**config)
        self.model: TinyDiT | None = None
        self.decoder: LatentDecoder | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self._decoder_state: dict[str, torch.Tensor] = {}   # model-owned, per session
        self._prompts: dict[tuple[str, str], str] = {}      # (session, branch) -> cached prompt

    # -- contract ------------------------------------------------------------------
    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        c = self.config
        return ardiff.ARDiffusionKVCacheSpec(
            num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_size=c.head_size,
            tokens_per_frame=c.tokens_per_frame, frames_per_block=c.frames_per_block,
            window_frames=c.window_frames, sink_frames=c.sink_frames,
            reset_at_boundary=c.reset_at_boundary, session_capacity=c.session_capacity,
            max_model_len=c.max_frames,
            kv_branches=tuple(ardiff.ARDiffusionKVBranchSpec(name, i)
                           for i, name in enumerate(c.branch_names)),
            cross_attention=(ardiff.ARDiffusionCrossAttentionKVSpec(TEXT_CACHE, c.text_tokens),),
            model_owned_state_bytes_per_session=LatentDecoder.state_bytes(c.latent_channels,
                                                                          c.latent_size),
        )

    def load(self, device: str | torch.device, dtype: torch.dtype) -> None:
        """Build the weights from `weights_seed` (no download) and move them to the device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.weights_seed)
            model = TinyDiT(self.config)
            decoder = LatentDecoder(self.config.latent_channels, self.config.upscale)
        self.device, self.dtype = torch.device(device), dtype
        self.model = model.to(self.device, dtype).eval()
        self.decoder = decoder.to(self.device, dtype).eval()

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def bind_ar_diffusion_state(self, session_id: str, state) -> contextlib.AbstractContextManager[None]:
        """The state reaches generate_block as its argument: nothing to bind."""
        return contextlib.nullcontext()

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Enough blocks to fill the window and evict once, with and without guidance."""
        c = self.config
        blocks = -(-(c.sink_frames + c.window_frames) // c.frames_per_block) + 1
        guidance = 3.0 if c.cfg else 1.0
        return [ardiff.RolloutRequest(session_id, block_index=i, prompt="warmup", seed=0,
                                      guidance_scale=guidance, reset=i == 0)
                for i in range(blocks)]

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest, state) -> ardiff.BlockOutput:
        if self.model is None:
            self.load("cpu", torch.float32)
        branches = self._branches(request)
        cross = {b: self._text_kv(state, request, b) for b in branches}
        main = branches[0]
        start = state.num_committed_frames(main)
        x = self._noise(request.seed, start)
        steps = request.num_steps or self.config.num_steps
        levels = torch.linspace(1.0, 0.0, steps + 1).tolist()
        for t, t_next in zip(levels[:-1], levels[1:]):
            clean = self._predict_clean(state, branches, cross, x, t, request)
            x = clean + t_next * (x - clean) / t  # x_t = (1 - t) clean + t noise
        for branch in branches:  # commit: the clean block's K/V become history
            with state.block(branch, commit=True) as blk:
                self.model(x, 0.0, blk, cross[branch])
        frames, self._decoder_state[request.session_id] = self.decoder(
            x, self._decoder_state.get(request.session_id))
        return ardiff.BlockOutput(frames=frames)

    # -- helpers -------------------------------------------------------------------
    def _branches(self, request: ardiff.RolloutRequest) -> tuple[str, ...]:
        if request.guidance_scale > 1.0 and not self.config.cfg:
            raise ardiff.ConfigError(f"rollout.guidance_scale: {request.guidance_scale} needs "
                                     f"the negative branch; set pipeline.args.cfg: true")
        if self.config.cfg and request.guidance_scale > 1.0:
            return ("positive", "negative")
        return (self.config.branch_names[0],)

    def _text_kv(self, state, request: ardiff.RolloutRequest, branch: str):
        prompt = request.negative_prompt if branch == "negative" else request.prompt
        key = (request.session_id, branch)
        if self._prompts.get(key) != prompt or state.cross_kv(branch, TEXT_CACHE) is None:
            state.set_cross_kv(branch, TEXT_CACHE, self.model.text_kv(prompt))
            self._prompts[key] = prompt
        return state.cross_kv(branch, TEXT_CACHE)

    def _noise(self, seed: int, start_frame: int) -> torch.Tensor:
        c = self.config
        generator = torch.Generator().manual_seed(seed * 1_000_003 + start_frame)
        shape = (c.frames_per_block, c.latent_channels, c.latent_size, c.latent_size)
        return torch.randn(shape, generator=generator).to(self.device, self.dtype)

    def _predict_clean(self, state, branches, cross, x, t, request) -> torch.Tensor:
        predictions = []
        for branch in branches:  # probes: attend to history, commit nothing
            with state.block(branch, commit=False) as blk:
                predictions.append(self.model(x, t, blk, cross[branch]))
        if len(predictions) == 1:
            return predictions[0]
        positive, negative = predictions
        return negative + request.guidance_scale * (positive - negative)

    def _forget(self, session_id: str) -> None:
        self._decoder_state.pop(session_id, None)
        for key in [k for k in self._prompts if k[0] == session_id]:
            del self._prompts[key]
