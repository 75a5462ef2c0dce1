"""A tiny causal video DiT: the Wan / Self-Forcing family at toy width, untrained.

    latents [F, C, h, w] --patchify--> tokens --N x DiTBlock--> clean latents
    DiTBlock: adaLN(t) -> self-attention through blk.attend (3-axis RoPE, absolute frame
              positions) -> cross-attention to the prompt (the "text" cross-attention
              cache) -> MLP
    sampler:  num_steps flow-matching steps predicting the clean block, each a probe block, then one commit
              forward over the clean block (t = 0) whose K/V become history
    CFG:      guidance_scale > 1 runs `positive` and `negative` branches (declared when
              cfg=True) and mixes their predictions; under CFG-parallel
              (`runtime.parallel.cfg: 2`) each rank runs one branch and all-gathers the
              other's prediction every step (ardiff.distributed.context)
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
from ardiff.kv.attention import attend
from ardiff.pipelines.decoder import LatentDecoder
from ardiff.pipelines.nn import AdaLN, Patches, Rope, RotaryEmbedding, TimestepEmbedding, rotate
from ardiff.pipelines.sampling import block_noise, sample, warmup_requests
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
    def patches(self) -> Patches:
        return Patches(self.latent_channels, self.patch_size, self.grid)

    @property
    def branch_names(self) -> tuple[str, ...]:
        return ("positive", "negative") if self.cfg else ("main",)


class DiTBlock(nn.Module):
    """adaLN-modulated self-attention (through the KV state), cross-attention and MLP.

    Parameters are created in a fixed order: a seeded random model is the same model.
    """

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_size = dim // num_heads
        kv_dim = num_kv_heads * self.head_size
        self.modulation = AdaLN(dim, num_sets=2)   # attention, MLP
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, kv_dim), nn.Linear(dim, kv_dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_q, self.cross_out = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.cross_k, self.cross_v = nn.Linear(dim, kv_dim), nn.Linear(dim, kv_dim)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(mlp_ratio * dim, dim))

    def heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.unflatten(-1, (n, self.head_size))  # [tokens, n, head_size]

    def cross_kv(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention K/V of the text tokens: [text_tokens, kv_heads, head_size] each."""
        return (self.heads(self.cross_k(text), self.num_kv_heads),
                self.heads(self.cross_v(text), self.num_kv_heads))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, rope: Rope, blk,
                layer: int, cross: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        attn, mlp = self.modulation(cond)
        h = attn.modulate(self.norm1(x))
        q = rotate(self.heads(self.q(h), self.num_heads), rope)
        k = rotate(self.heads(self.k(h), self.num_kv_heads), rope)
        v = self.heads(self.v(h), self.num_kv_heads)
        x = x + attn.gate * self.out(blk.attend(layer, q, k, v).flatten(-2))
        q = self.heads(self.cross_q(self.norm2(x)), self.num_heads)
        x = x + self.cross_out(attend(q, *cross).flatten(-2))
        return x + mlp.gate * self.mlp(mlp.modulate(self.norm3(x)))


class TinyDiT(nn.Module):
    """The denoiser: one forward over one block of one branch."""

    def __init__(self, c: TinyDiTConfig) -> None:
        super().__init__()
        self.c = c
        self.patches = c.patches
        self.patch_in = nn.Linear(self.patches.patch_dim, c.dim)
        self.time = TimestepEmbedding(c.dim)
        self.blocks = nn.ModuleList(DiTBlock(c.dim, c.num_heads, c.num_kv_heads, c.mlp_ratio)
                                    for _ in range(c.num_layers))
        self.final_modulation = AdaLN(c.dim, num_sets=1, gated=False)
        self.final_norm = nn.LayerNorm(c.dim, elementwise_affine=False)
        self.patch_out = nn.Linear(c.dim, self.patches.patch_dim)
        self.text = TextEncoder(c.dim, c.text_tokens)
        self.rotary = RotaryEmbedding(c.head_size, c.grid)

    def layers(self, h: torch.Tensor, cond: torch.Tensor, rope: Rope, blk,
               cross: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The layer stack over tokens h [F * grid^2, dim] (what `runtime.compile` compiles)."""
        for layer, block in enumerate(self.blocks):
            h = block(h, cond, rope, blk, layer, cross[layer])
        return h

    def text_kv(self, prompt: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        text = self.text(prompt)
        return [block.cross_kv(text) for block in self.blocks]

    def forward(self, x: torch.Tensor, t: float, blk,
                cross: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Predicted clean latents for noisy latents x [F, C, h, w] at noise level t."""
        num_frames = x.shape[0]
        rope = self.rotary.rope(blk.start_frame, num_frames, x.device)
        cond = self.time(torch.full((1,), t, device=x.device))  # [1, dim]
        h = self.patch_in(self.patches.patchify(x).flatten(0, 1))  # [F * grid^2, dim]
        h = self.layers(h, cond, rope, blk, cross)
        (final,) = self.final_modulation(cond)
        out = self.patch_out(final.modulate(self.final_norm(h)))
        return self.patches.unpatchify(out.unflatten(0, (num_frames, -1)))


class TinyCausalDiT:
    """The reference text-to-video pipeline (implements the ardiff pipeline protocol)."""

    def __init__(self, **config) -> None:
        self.config = TinyDiTConfig(**config)
        self.model: TinyDiT | None = None
        self.decoder: LatentDecoder | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self._decoder_state: dict[str, torch.Tensor] = {}   # model-owned, per session
        self._prompts: dict[tuple[str, str], str] = {}      # (session, branch) -> cached prompt
        self.parallel: ardiff.ParallelContext | None = None  # CFG-parallel: this rank's branch
        self._compiler = None                               # set by compile_layers

    # -- contract ------------------------------------------------------------------
    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        c = self.config
        return ardiff.ARDiffusionKVCacheSpec(
            num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_size=c.head_size,
            tokens_per_frame=c.tokens_per_frame, frames_per_block=c.frames_per_block,
            window_frames=c.window_frames, sink_frames=c.sink_frames,
            reset_at_boundary=c.reset_at_boundary, session_capacity=c.session_capacity,
            max_model_len=c.max_frames,
            kv_branches=self._branch_specs(),
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
        if self._compiler is not None:
            self._compile()

    def compile_layers(self, compiler) -> None:
        """Compile the layer stack (`TinyDiT.layers`) with `compiler`, e.g. `torch.compile`;
        each self-attention in it stays one `ardiff::paged_attend` call."""
        self._compiler = compiler
        if self.model is not None:
            self._compile()

    def _compile(self) -> None:
        self.model.layers = self._compiler(TinyDiT.layers.__get__(self.model))

    def bind_ar_diffusion_parallel(self, context: ardiff.ParallelContext) -> None:
        """Run only `context.branch` of the CFG pair; the other rank runs the other one."""
        self.parallel = context

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def bind_ar_diffusion_state(self, session_id: str, state) -> contextlib.AbstractContextManager[None]:
        """The state reaches generate_block as its argument: nothing to bind."""
        return contextlib.nullcontext()

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Enough blocks to fill the window and evict once, with guidance when CFG is on."""
        return warmup_requests(self.ar_diffusion_kv_cache_spec(), session_id, self.config.cfg)

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest, state) -> ardiff.BlockOutput:
        if self.model is None:
            self.load("cpu", torch.float32)
        branches = self._branches(request)
        cross = {b: self._text_kv(state, request, b) for b in branches}
        c = self.config
        shape = (c.frames_per_block, c.latent_channels, c.latent_size, c.latent_size)
        noise = block_noise(shape, request.seed, state.num_committed_frames(branches[0]),
                            self.device, self.dtype)
        x = sample(noise, lambda x, t: self._predict_clean(state, branches, cross, x, t, request),
                   request.num_steps or c.num_steps)
        for branch in branches:  # commit: the clean block's K/V become history
            with state.block(branch, commit=True) as blk:
                self.model(x, 0.0, blk, cross[branch])
        frames, self._decoder_state[request.session_id] = self.decoder(
            x, self._decoder_state.get(request.session_id))
        return ardiff.BlockOutput(frames=frames)

    # -- helpers -------------------------------------------------------------------
    def _branch_specs(self) -> tuple[ardiff.ARDiffusionKVBranchSpec, ...]:
        if not self.config.cfg:
            return (ardiff.ARDiffusionKVBranchSpec("main", 0),)
        return ardiff.cfg_branch_specs(1 if self.parallel is None else self.parallel.world_size)

    def _is_split(self) -> bool:
        return self.parallel is not None and self.parallel.world_size > 1

    def _branches(self, request: ardiff.RolloutRequest) -> tuple[str, ...]:
        if request.guidance_scale > 1.0 and not self.config.cfg:
            raise ardiff.ConfigError(f"rollout.guidance_scale: {request.guidance_scale} needs "
                                     f"the negative branch; set pipeline.args.cfg: true")
        if self.config.cfg and request.guidance_scale > 1.0:
            return (self.parallel.branch,) if self._is_split() else ("positive", "negative")
        return (self.config.branch_names[0],)

    def _text_kv(self, state, request: ardiff.RolloutRequest, branch: str):
        prompt = request.negative_prompt if branch == "negative" else request.prompt
        key = (request.session_id, branch)
        if self._prompts.get(key) != prompt or state.cross_kv(branch, TEXT_CACHE) is None:
            state.set_cross_kv(branch, TEXT_CACHE, self.model.text_kv(prompt))
            self._prompts[key] = prompt
        return state.cross_kv(branch, TEXT_CACHE)

    def _predict_clean(self, state, branches, cross, x, t, request) -> torch.Tensor:
        predictions = []
        for branch in branches:  # probes: attend to history, commit nothing
            with state.block(branch, commit=False) as blk:
                predictions.append(self.model(x, t, blk, cross[branch]))
        if self._is_split() and request.guidance_scale > 1.0:
            predictions = self.parallel.all_gather(predictions[0])  # [positive, negative]
        if len(predictions) == 1:
            return predictions[0]
        positive, negative = predictions
        return negative + request.guidance_scale * (positive - negative)

    def _forget(self, session_id: str) -> None:
        self._decoder_state.pop(session_id, None)
        for key in [k for k in self._prompts if k[0] == session_id]:
            del self._prompts[key]
